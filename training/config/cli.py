"""The command line both entry points share, generated from the settings' fields (settings.py): one
flag per field, its type the field's, grouped as RunConfig groups them, read after the flags of a
--config file, then validate(). And the run's configuration files: --config YAML/JSON in, the resolved
<save-dir>/config.yaml out, and the flags a resumed run changed."""
import argparse
import dataclasses
import datetime
import difflib
import json
import os
import platform
import subprocess
import sys
import typing
from collections.abc import Hashable
from dataclasses import fields
from pathlib import Path

import yaml

from data.errors import not_a_file
from outputs.safety import write_atomic
from training.checkpoint.files import BEST, LAST
from training.config.settings import Parallel, RunConfig, flag_groups
from training.errors import UsageError


def parse_config(argv=None, multi_gpu=False):
    """The validated RunConfig of a command line (after its --config file's flags): what an entry point
    builds. main.py has no multi-GPU group; its settings keep their defaults (one device)."""
    try:
        args = parse_with_config(build_parser(multi_gpu), argv)
    except UsageError:
        if not multi_gpu:
            _point_to_multi_gpu_entry(sys.argv[1:] if argv is None else argv)
        raise
    return RunConfig.from_flags(vars(args)).validate()


class DefaultsInHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default after its help, except where the help says it in words ("default: the
    model's own") or the default is None (then the help says what happens without the flag)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None:
            return text
        return super()._get_help_string(action)


def build_parser(multi_gpu):
    """multi_gpu=True adds the multi-GPU group used by main_multi_gpu.py."""
    parser = argparse.ArgumentParser(
        prog="main_multi_gpu.py" if multi_gpu else "main.py",
        description="Train a Human Activity Recognition model on UCI HAR or synthetic data.",
        formatter_class=DefaultsInHelp)
    for group, items in flag_groups():
        if group.type is Parallel and not multi_gpu:
            continue
        arguments = parser.add_argument_group(group.metadata["title"])
        if group.name == "output":
            arguments.add_argument("--config", default=None, metavar="FILE",
                                   help="YAML or JSON file of flags (batch_size: 64 or batch-size: 64); flags given "
                                        "on the command line win. Every run writes its own to <save-dir>/config.yaml")
        for dest, item in items:
            add_flag(arguments, dest, item)
        if group.name == "output":
            arguments.add_argument("--debug", action="store_true",
                                   help="show full tracebacks instead of one-line errors")
    return parser


def add_flag(arguments, dest, item):
    """The flag of one settings field: a switch for a bool (--x, or --x/--no-x where it defaults to on
    or to the device's choice), else a value of the field's type."""
    meta = item.metadata
    option = "--" + dest.replace("_", "-")
    kind = next((kind for kind in typing.get_args(item.type) if kind is not type(None)), item.type)
    common = {"dest": dest, "default": item.default, "help": meta["help"]}
    if kind is bool:
        arguments.add_argument(option, action="store_true" if item.default is False else argparse.BooleanOptionalAction,
                               **common)
    else:
        choices = meta.get("choices")
        if callable(choices):  # a registry's, read now: a kind registered since counts
            choices = choices()
        arguments.add_argument(option, type=meta.get("parse", kind), choices=choices, metavar=meta.get("metavar"),
                               **common)
    if "off" in meta:  # --no-resume
        off_flag, off_help = meta["off"]
        arguments.add_argument(off_flag, dest=dest, action="store_const", const=None, help=off_help)


def _point_to_multi_gpu_entry(argv):
    """A flag of main_multi_gpu.py given to main.py: say which command takes it, rather than argparse's
    'unrecognized arguments'."""
    multi_gpu_only = {f"--{prefix}{item.name.replace('_', '-')}" for item in fields(Parallel)
                      for prefix in ("", "no-")}
    for token in map(str, argv):
        flag = token.split("=", 1)[0]
        if flag in multi_gpu_only:
            raise UsageError(f"main.py trains on one device and has no {flag}; for several GPUs run "
                             "python main_multi_gpu.py --multi-gpu dp [flags] (DataParallel, one process), or "
                             "torchrun --nproc_per_node=N main_multi_gpu.py --multi-gpu ddp (or fsdp) [flags]")


# Run configuration files: --config YAML/JSON in, the resolved <save-dir>/config.yaml out.
CONFIG_NAME = "config.yaml"
# Not settings of the run: where the settings came from, and how errors are shown (read from
# the command line before any file is opened).
NOT_IN_FILES = ("config", "debug")
# The multi-GPU flags of main_multi_gpu.py as main.py implies them; a config.yaml written by main.py
# holds them.
IMPLIED_BY_MAIN = dataclasses.asdict(Parallel())
REPO = Path(__file__).resolve().parents[2]


def parse_with_config(parser, argv):
    """Parse argv after the flags of its --config file, so the command line wins over the file.

    argparse errors become one-line UsageErrors (no usage block, no second line per rank)."""
    parser.error = usage_error(parser.prog)
    args = parser.parse_args(argv)  # first alone: finds --config however it was spelt
    if args.config is None:
        return args
    loaded = load_config_file(args.config)
    if args.save_dir is None:
        loaded = in_its_run_folder(loaded)
    file_argv = config_to_argv(parser, loaded)
    parser.error = usage_error(parser.prog, where=f"--config {args.config}")
    parser.parse_args(file_argv)  # the file on its own, so its bad values are blamed on it
    parser.error = usage_error(parser.prog)
    return parser.parse_args([*file_argv, *argv])


def in_its_run_folder(loaded):
    """A run's own config.yaml records the --save-dir it was written in, which a moved or copied run
    folder no longer is: taken from a folder that holds a run, it continues that folder (said in one
    line); elsewhere its save_dir stands, also said where it is not the file's folder, so nobody
    trains on at a path they did not see."""
    path, values = Path(loaded["path"]), loaded["values"]
    recorded = values.get("save_dir")
    if path.name != CONFIG_NAME or not recorded or Path(recorded).resolve() == path.parent.resolve():
        return loaded
    if any((path.parent / name).is_file() for name in (LAST, BEST)):  # a folder a run has saved in
        _say_once(f"--config {path}: continuing the run folder it sits in, {path.parent} (it was written in "
                  f"{recorded}); pass --save-dir to choose another")
        return {**loaded, "values": {**values, "save_dir": str(path.parent)}}
    _say_once(f"--config {path}: its save_dir is {recorded}, where it was written; the run uses that folder "
              "(pass --save-dir to choose another)")
    return loaded


def _say_once(line):
    """A line for the user from the command line's reading: once, not once a rank."""
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)


def usage_error(prog, where=None):
    def error(message):
        raise UsageError(f"{where}: {message}" if where else f"{message} (see {prog} --help)")
    return error


# A file of flags is small and flat. Aliases (*name) share one node however often they repeat it, so
# that a few lines of nested aliases stand for billions of values once anything walks them.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_ALIASES = 20


class _TooManyAliases(yaml.YAMLError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key given twice is an error, not the last one silently
    winning, and that it stops after MAX_CONFIG_ALIASES aliases."""
    aliases_seen = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen += 1
            if self.aliases_seen > MAX_CONFIG_ALIASES:
                raise _TooManyAliases()
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: later keys may override those
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(None, None, f"a key must be a flag name, not a "
                                                        f"{type(key).__name__}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _unique_keys(path):
    def mapping(pairs):
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise UsageError(f"--config {path}: {repeated!r} is given twice; keep one")
        return dict(pairs)
    return mapping


def load_config_file(path):
    """The mapping of a YAML (or JSON) file, or a one-line error saying what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--config {path} {not_a_file(path)}; point it at a YAML or JSON file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"--config {path} is {path.stat().st_size:,} bytes, more than a file of flags can need "
                         f"(at most {MAX_CONFIG_BYTES:,}); point it at a YAML or JSON file of flags")
    try:
        text = path.read_text()
        values = json.loads(text, object_pairs_hook=_unique_keys(path)) if path.suffix == ".json" else \
            yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader that also refuses repeated keys
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path} cannot be read ({exc})") from None
    except RecursionError:
        raise UsageError(f"--config {path} nests lists or mappings deeper than Python can read; a file of flags "
                         "is flat: flag: value") from None
    except _TooManyAliases:
        raise UsageError(f"--config {path} uses more than {MAX_CONFIG_ALIASES} aliases (*name), more than a file "
                         "of flags needs; write the values out") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise UsageError(f"--config {path} is not valid YAML ({where}{getattr(exc, 'problem', None) or exc})") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise UsageError(f"--config {path} must hold flag: value pairs, found a {type(values).__name__}")
    return {"path": str(path), "values": values}


def _flag_actions(parser):
    """{key: action} for every long option, under its dest and its option name with underscores."""
    actions = {}
    for action in parser._actions:  # argparse keeps no public list of its options
        if action.dest in ("help", "version"):
            continue
        for option in action.option_strings:
            negative = isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-")
            if option.startswith("--") and not negative:
                actions.setdefault(option[2:].replace("-", "_"), action)
        actions.setdefault(action.dest, action)
    return actions


def config_to_argv(parser, loaded):
    """The command-line flags a loaded config file stands for, in the file's order."""
    path, actions, seen, argv = loaded["path"], _flag_actions(parser), {}, []
    for raw_key, value in loaded["values"].items():
        key = str(raw_key).replace("-", "_")
        if key in seen:
            raise UsageError(f"--config {path}: {seen[key]!r} and {raw_key!r} set the same flag; keep one")
        seen[key] = raw_key
        if key in NOT_IN_FILES:
            raise UsageError(f"--config {path}: {raw_key!r} is a command-line-only flag; remove it from the file")
        if key not in actions:
            if key in IMPLIED_BY_MAIN and parser.prog == "main.py":
                if value != IMPLIED_BY_MAIN[key]:
                    raise UsageError(f"--config {path}: {raw_key}: {value} needs main_multi_gpu.py")
                continue
            raise UsageError(f"--config {path}: unknown key {raw_key!r}{_closest(key, actions)}")
        argv.extend(_tokens(actions[key], key, value, parser, path))
    return argv


def _closest(key, actions):
    match = difflib.get_close_matches(key, sorted(actions), n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else "; see --help for the flags"


def _tokens(action, key, value, parser, path):
    """How `key: value` is written on the command line."""
    option = next(o for o in action.option_strings if o.startswith("--"))
    if action.nargs == 0:  # --compile, --amp / --no-amp, --no-resume
        if value is None:
            return []
        if not isinstance(value, bool):
            raise UsageError(f"--config {path}: {key} takes true or false, got {value!r}")
        if len(action.option_strings) > 1 and not value:  # BooleanOptionalAction: --no-amp
            return [next(o for o in action.option_strings if o.startswith("--no-"))]
        return [option] if value else []
    if value is None:
        # null means the default, except where a flag stores None itself (resume: null is --no-resume).
        switch = next((a for a in parser._actions if a.dest == action.dest and a.nargs == 0 and a.const is None
                       and a.option_strings), None)
        return [switch.option_strings[0]] if switch else []
    nested = isinstance(value, (list, tuple)) and any(isinstance(item, (list, tuple, dict)) for item in value)
    if isinstance(value, (dict, bool)) or nested:  # never printed whole: aliases can make it enormous
        got = repr(value) if isinstance(value, bool) else f"a {'nested list' if nested else 'mapping'}"
        raise UsageError(f"--config {path}: {key} takes a value such as {action.default!r}, got {got}")
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)  # --gpu-ids 0,1,3
    return [f"{option}={value}"]  # one token, so a value starting with '-' is not taken for a flag


def resolved_config(config, save_dir):
    """Every setting of the run as flags, with --save-dir as used, ready to be written or compared."""
    return {**config.flags(), "save_dir": str(save_dir)}


def versions():
    """The software a run used: what to install to repeat it."""
    import numpy
    import torch
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "python": platform.python_version(), "numpy": numpy.__version__, "git_commit": git_commit()}


def git_commit():
    """The project's commit, marked when the tree has uncommitted changes; None outside git."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def write_resolved_config(config, save_dir):
    """<save-dir>/config.yaml: loadable with --config; versions as comments at the top."""
    save_dir = Path(save_dir)
    script = "main.py" if config.parallel.multi_gpu == "none" else "main_multi_gpu.py"
    found = versions()
    header = [f"# Resolved configuration of the run in {save_dir}, written "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC.",
              f"# Repeat it with: python {script} --config {save_dir / CONFIG_NAME} (flags given after it win).",
              "# versions: " + ", ".join(f"{name} {value if value is not None else 'none'}"
                                         for name, value in found.items())]
    text = "\n".join(header) + "\n" + yaml.safe_dump(resolved_config(config, save_dir), sort_keys=False)
    write_atomic(save_dir / CONFIG_NAME, lambda partial: Path(partial).write_text(text))
