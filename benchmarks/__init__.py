"""Timing benchmarks, the GPU check and the scaling report and map; here, what every measurement entry
point (these and studies/) shares: the repository root, the parser, the --json file, the process tree."""
import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows the module's docstring as written and every option's default."""


def entry_parser(module, doc):
    """The parser of `python -m <module>`, its description the module's docstring."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc, formatter_class=_Help)


def write_json(path, figures):
    """The figures as a JSON file at `path` (the entry point's --json), when one was given."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")


def descendants(pid):
    """Every process below `pid`, from the parent links in /proc (Linux; elsewhere none)."""
    children = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not a process entry
        children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found
