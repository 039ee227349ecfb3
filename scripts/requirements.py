"""requirements.txt and requirements-without-torch.txt, written from pyproject.toml's dependency lists.

`python -m scripts.requirements` rewrites both; `--check` only says whether they are current (a
test runs it). pip users and clusters read these files; pyproject.toml is where they are edited.
"""
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEADER = "# Written by `python -m scripts.requirements` from pyproject.toml: edit that file, then run it.\n"
EXTRAS_INSTALLED = ("export", "dev")  # what `make test` needs beside the runtime


def load_pyproject():
    import tomllib  # Python 3.11+; on 3.10, read the lists from pyproject.toml by hand
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def is_torch(requirement):
    return re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0).lower() == "torch"


def expected_files(project):
    dependencies = project["dependencies"]
    torch_pins = [item for item in dependencies if is_torch(item)]
    rest = [item for item in dependencies if not is_torch(item)]
    for extra in EXTRAS_INSTALLED:
        rest += project["optional-dependencies"][extra]
    without_torch = (HEADER + "# Everything but torch, for a torch that is already there (a cluster's module,\n"
                     "# or a build installed by hand for your CUDA).\n" + "".join(f"{item}\n" for item in rest))
    with_torch = (HEADER + "# The tested torch, then the rest. Which build pip installs depends on where it looks:\n"
                  "# from PyPI on Linux x86_64 the CUDA build, from PyTorch's CPU index the CPU build\n"
                  "# (`make` chooses).\n"
                  + "".join(f"{item}\n" for item in torch_pins) + "-r requirements-without-torch.txt\n")
    return {"requirements.txt": with_torch, "requirements-without-torch.txt": without_torch}


def main(argv):
    files = expected_files(load_pyproject()["project"])
    stale = [name for name, text in files.items()
             if not (REPO / name).is_file() or (REPO / name).read_text() != text]
    if "--check" in argv:
        if stale:
            print(f"out of date with pyproject.toml: {', '.join(stale)}; run python -m scripts.requirements",
                  file=sys.stderr)
            return 1
        return 0
    for name in stale:
        (REPO / name).write_text(files[name])
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
