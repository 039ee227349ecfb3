"""What every measurement entry point (the profiler, benchmarks/, studies/) shares: the parser, argument
types, the --json file, commands run from the repository root, and a child's environment."""
import argparse
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

from training.config.cli import REPO, usage_error
from training.errors import UsageError

# And srun's step variables, from which an srun task takes its rank (training/distributed/slurm.py): a child
# started inside a multi-task step would otherwise take itself for one of its ranks.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "SLURM_STEP_ID", "SLURM_STEPID")


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows the module's docstring as written and every option's default."""


def entry_parser(module, doc):
    """The parser of a measurement entry point: its errors are one line (run_entry_point prints them)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc, formatter_class=_Help)
    parser.error = usage_error(parser.prog)
    return parser


def at_least(lowest):
    """An argparse type: a whole number no smaller than `lowest` (counts of rounds, steps, ranks)."""
    def parse(text):
        value = int(text)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value
    return parse


def positive(text):
    """An argparse type: a finite number above zero (a rate, a size)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def json_file(text):
    """An argparse type: a file the figures can be written to (--json), checked before the measurement
    rather than refused after it."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the name of a file inside it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist; create it or choose another")
    return text


def write_json(path, figures):
    """The figures as a JSON file at `path` (the entry point's --json), when one was given."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")


def run_in_repo(command, env=None):
    """(stdout, wall seconds) of `command` run from the repository root; a failure is a UsageError
    with the last lines the command wrote to stderr."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise UsageError(f"{shlex.join(map(str, command))} failed:\n{tail}")
    return result.stdout, time.perf_counter() - started


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


def comma_counts(text):
    """'4,1,2,2' -> [1, 2, 4]: an argparse type for a set of whole numbers, sorted."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return counts


def comma_names(text):
    """'cnn1d, transformer' -> ['cnn1d', 'transformer']: an argparse type for a list of names."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated names")
    return names


def comma_choices(choices):
    """An argparse type for a comma-separated list of names, each one of `choices`."""
    def names(text):
        chosen = comma_names(text)
        unknown = [name for name in chosen if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown[0]!r}; choose from {', '.join(choices)}")
        return chosen
    return names


def env_without_torchrun(**extra):
    """This environment without torchrun's variables, which would make a child think it is a rank, plus `extra`."""
    return {**{key: value for key, value in os.environ.items() if key not in TORCHRUN_VARIABLES}, **extra}
