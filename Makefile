# Two commands do all the set-up on a fresh Linux machine with Python 3.10+ and make:
#   make train [ARGS="--epochs 5"]    train the default model on the built-in data
#   make test  [ARGS="-k resume"]     lint, then the whole test suite, with failing stand-ins for
#                                     python, python3 and torchrun on PATH (.ci/without_path_python)
#   make test-fast [ARGS=...]         the same without the tests that start processes (-m "not slow")
# The first call creates .venv/ and installs the pinned dependencies (docs/install.md);
# later calls find the stamp of the requirements' hash and start at once.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= auto
TORCH_INDEX ?=
ARGS ?=

BIN := $(VENV)/bin
# The stamp names the requirements, the set-up and the interpreter it was made from: another python3
# (a venv activated since) sets up again.
PYTHON_PATH := $(shell command -v $(PYTHON) 2>/dev/null)
HASH := $(shell (cat requirements.txt requirements-without-torch.txt scripts/setup_venv.py; echo "$(PYTHON_PATH)") \
	| cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(HASH)-$(TORCH)

.PHONY: train test test-fast lint setup clean-venv

train: $(STAMP)
	$(BIN)/python main.py $(ARGS)

test: lint
	.ci/without_path_python $(BIN)/python -m pytest -q $(ARGS)

test-fast: lint
	.ci/without_path_python $(BIN)/python -m pytest -q -m "not slow" $(ARGS)

lint: $(STAMP)
	$(BIN)/python -m ruff check .

setup: $(STAMP)

$(STAMP):
	@[ -n "$(PYTHON_PATH)" ] || { echo "error: no $(PYTHON) on PATH; pass PYTHON=/path/to/python3.10+" >&2; exit 2; }
	$(PYTHON) scripts/setup_venv.py "$(VENV)" "$(TORCH)" "$(TORCH_INDEX)"
	rm -f $(VENV)/.installed-*
	touch $@

clean-venv:
	rm -rf $(VENV)
