"""The project's own files agree with each other: requirement files with pyproject.toml, and the
commands the documentation shows with the flags and modules the code has."""
import ast
import importlib.util
import re

import pytest

from training.config.cli import REPO, build_parser, parse_config
from training.distributed.strategy import check_parallel_args
from training.errors import UsageError

DOCS = ["README.md", "QUICK_REFERENCE.md", *sorted(f"docs/{page.name}" for page in (REPO / "docs").glob("*.md"))]
ENTRY_POINTS = {"main.py": False, "main_multi_gpu.py": True}  # script -> build_parser's multi_gpu
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SCRIPT = re.compile(r"(?<![\w/.-])(main_multi_gpu\.py|main\.py)(?![\w.])")
MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
RESTORED = re.compile(r"git show [0-9a-f]{7,40}:([\w/]+\.py)")
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_requirement_files_are_written_from_pyproject():
    pytest.importorskip("tomllib")  # Python 3.11+
    from scripts.requirements import expected_files, load_pyproject
    for name, text in expected_files(load_pyproject()["project"]).items():
        assert (REPO / name).read_text() == text, f"{name} is stale: run python -m scripts.requirements"


def commands(text):
    """(line number, command) for each line of a fenced block (continuations joined, comments cut)
    and each inline code span."""
    found, outside = [], text
    for block in FENCE.finditer(text):
        first_line, pending = text.count("\n", 0, block.start(1)) + 1, None
        for offset, line in enumerate(block.group(1).split("\n")):
            code = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].rstrip()
            start, before = pending or (first_line + offset, "")
            pending = (start, before + code[:-1] + " ") if code.endswith("\\") else None
            if pending is None:
                found.append((start, before + code))
        outside = outside.replace(block.group(0), "\n" * block.group(0).count("\n"), 1)
    for span in CODE_SPAN.finditer(outside):
        found.append((outside.count("\n", 0, span.start()) + 1, span.group(1).replace("\n", " ")))
    return found


def entry_point_flags(command):
    """(script, flags) for each main.py / main_multi_gpu.py in a command: the flags after it, up to
    the next command (&&, ;, |) or the next script; `make train ARGS="..."` runs main.py."""
    found = []
    for part in re.split(r"&&|\|\||;|\|(?!\w)", command):
        make = re.search(r"\bmake train\b.*?ARGS=\"([^\"]*)\"", part)
        if make:
            found.append(("main.py", FLAG.findall(make.group(1))))
        scripts = list(SCRIPT.finditer(part))
        for n, script in enumerate(scripts):
            end = scripts[n + 1].start() if n + 1 < len(scripts) else len(part)
            found.append((script.group(1), FLAG.findall(part[script.end():end])))
    return found


def flags_table_rows(text):
    """(line number, row) of QUICK_REFERENCE's flag table: every flag there belongs to the trainers."""
    section = re.search(r"^## Flags\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    first_line = text.count("\n", 0, section.start(1)) + 1
    return [(first_line + n, line) for n, line in enumerate(section.group(1).split("\n")) if line.startswith("|")]


def unknown_flags(docs):
    """'file:line: flag (script)' for every trainer flag the documents show that the parser lacks."""
    known = {script: set(build_parser(multi_gpu)._option_string_actions) for script, multi_gpu in ENTRY_POINTS.items()}
    problems = []
    for name, text in docs.items():
        for line, command in commands(text):
            for script, flags in entry_point_flags(command):
                problems += [f"{name}:{line}: {flag} ({script})" for flag in flags if flag not in known[script]]
        if name == "QUICK_REFERENCE.md":
            for line, row in flags_table_rows(text):
                problems += [f"{name}:{line}: {flag} (flag table)" for flag in FLAG.findall(row)
                             if flag not in known["main_multi_gpu.py"]]
    return problems


def read_docs():
    return {name: (REPO / name).read_text() for name in DOCS}


def test_every_trainer_flag_in_the_documentation_is_one_the_parser_knows():
    docs = read_docs()
    assert sum(len(entry_point_flags(c)) for text in docs.values() for _, c in commands(text)) > 50  # it reads them
    assert unknown_flags(docs) == []


def test_a_made_up_flag_in_a_command_or_the_flag_table_is_reported():
    made_up = {"docs/x.md": "Run:\n\n```bash\ntorchrun --nproc_per_node=2 main_multi_gpu.py \\\n"
                            "    --multi-gpu ddp --save-evry 5   # or --also-wrong in a comment\n```\n\n"
                            "or `python main.py --nproc-per-node 2 --epochs 3 && python predict.py --out x`.\n",
               "QUICK_REFERENCE.md": "## Flags\n\n| `--epochs N` | 20 | with `--warmup-epoch` |\n\n## Next\n"}
    assert unknown_flags(made_up) == ["docs/x.md:4: --save-evry (main_multi_gpu.py)",
                                      "docs/x.md:8: --nproc-per-node (main.py)",
                                      "QUICK_REFERENCE.md:3: --warmup-epoch (flag table)"]


def test_every_python_m_module_in_the_documentation_can_be_found():
    missing = sorted({f"{name}: python -m {module}" for name, text in read_docs().items()
                      for _, command in commands(text) for module in MODULE.findall(command)
                      if not findable(module) and not brought_back(module, text)})
    assert missing == []


def brought_back(module, text):
    """Whether the page names the commit that holds a removed module (`git show COMMIT:path.py`), as the
    table of a study that left the tree does."""
    return module.replace(".", "/") + ".py" in RESTORED.findall(text)


def test_a_removed_module_counts_only_where_its_page_says_how_to_bring_it_back():
    assert brought_back("studies.gone", "by `python -m studies.gone` (`git show 7a07874:studies/gone.py`)")
    assert not brought_back("studies.gone", "by `python -m studies.gone` (`git show 7a07874:studies/other.py`)")


def findable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def test_every_sample_config_file_in_the_documentation_runs_on_cpu(tmp_path):
    samples = [(name, block) for name, text in read_docs().items() for block in YAML_BLOCK.findall(text)]
    assert samples
    for n, (name, sample) in enumerate(samples):
        path = tmp_path / f"sample-{n}.yaml"
        path.write_text(sample)
        try:
            check_parallel_args(parse_config(["--config", str(path), "--device", "cpu"]))
        except UsageError as exc:
            pytest.fail(f"{name}'s sample config is refused on CPU: {exc}")


# docs/code_tour.md's layers: what each package may import of the project's others.
FOUNDATIONS = {"outputs", "data", "models", "evaluation"}
LAYERS = {"outputs": set(), "data": {"outputs"}, "models": set(), "evaluation": set(), "training": FOUNDATIONS,
          "inference": FOUNDATIONS | {"training"}, "crossval": FOUNDATIONS | {"training", "inference"},
          "profiling": FOUNDATIONS | {"training"},
          "benchmarks": FOUNDATIONS | {"training", "profiling"},
          "studies": FOUNDATIONS | {"training", "profiling", "inference", "crossval", "benchmarks"}}
MEASUREMENT = {"benchmarks", "studies"}


def project_imports(path):
    """The top-level project packages a file imports (inside functions too)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        yield from (name.split(".")[0] for name in names if name.split(".")[0] in LAYERS)


def test_imports_point_down_the_layers_of_the_code_tour():
    for package, allowed in LAYERS.items():
        for path in (REPO / package).rglob("*.py"):
            for imported in project_imports(path):
                assert imported == package or imported in allowed, f"{path.relative_to(REPO)} imports {imported}"
    for script in REPO.glob("*.py"):  # entry points: never the measurement code
        assert not set(project_imports(script)) & MEASUREMENT, script.name


def module_imports(path):
    """The project modules a file imports (inside functions too), as dotted names: `from a.b import c`
    counts a.b.c when c is a module, else a.b."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            candidates = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in candidates:
            while name and not (REPO / name.replace(".", "/")).with_suffix(".py").is_file() \
                    and not (REPO / name.replace(".", "/") / "__init__.py").is_file():
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in LAYERS:
                yield name


def test_no_module_imports_itself_back_through_another():
    graph = {}
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            graph[module] = set(module_imports(path)) - {module}
    done, on_path = set(), []

    def visit(module):
        if module in on_path:
            pytest.fail("import cycle: " + " -> ".join([*on_path[on_path.index(module):], module]))
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        on_path.pop()
        done.add(module)
    for module in sorted(graph):
        visit(module)
