"""The command line both entry points share, generated from the settings' fields (settings.py): one
flag per field, its type the field's, grouped as RunConfig groups them; then the --config file's flags,
and validate()."""
import argparse
import sys
import typing
from dataclasses import fields

from training.config.files import parse_with_config
from training.config.settings import COMPILE_MODES, SHARDED_OR_DDP, Parallel, RunConfig, flag_groups
from training.errors import UsageError

# What the tools that extend the trainer's command line import from here (the constants until they
# import them from settings.py).
__all__ = ["COMPILE_MODES", "SHARDED_OR_DDP", "build_parser", "check_args", "parse_config"]


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


def check_args(args):
    """Validate the settings among a parser's parsed flags (one that extends build_parser's) and write
    their canonical values back."""
    vars(args).update(RunConfig.from_flags(vars(args)).validate().flags())


def build_parser(multi_gpu):
    """multi_gpu=True adds the multi-GPU group used by main_multi_gpu.py."""
    parser = argparse.ArgumentParser(
        prog="main_multi_gpu.py" if multi_gpu else "main.py",
        description="Train a Human Activity Recognition model on UCI HAR or synthetic data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
        arguments.add_argument(option, type=meta.get("parse", kind), choices=meta.get("choices"),
                               metavar=meta.get("metavar"), **common)
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
