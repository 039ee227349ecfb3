"""The command line both entry points share: parse it (after its --config file), check it, and derive
from the settings what several parts need. The flags are declared in flags.py, their checks in checks.py."""
import sys
from pathlib import Path

from data.augment import AugmentConfig, parse_kinds
from training.config.checks import check_args
from training.config.files import IMPLIED_BY_MAIN, parse_with_config
from training.config.flags import (
    COMPILE_MODES,
    CUDA_GRAPH_MODES,
    DEFAULT_FLIP_CLASSES,
    DEFAULT_LR,
    DEFAULT_ROTATE_WIDE_CLASSES,
    DEFAULT_WARMUP_EPOCHS,
    MULTI_GPU_ONLY_FLAGS,
    SHARDED_OR_DDP,
    build_parser,
    class_list,
)
from training.config.settings import RunConfig
from training.errors import UsageError

# What the entry points, the trainer and the tools import from here.
__all__ = ["COMPILE_MODES", "CUDA_GRAPH_MODES", "DEFAULT_FLIP_CLASSES", "DEFAULT_LR", "DEFAULT_ROTATE_WIDE_CLASSES",
           "SHARDED_OR_DDP", "augment_config", "build_parser", "check_args", "class_list", "data_options",
           "parse_args", "parse_config", "save_dir_of", "warmup_epochs"]


def parse_config(argv=None, multi_gpu=False):
    """The RunConfig of a command line (after its --config file's flags): what an entry point builds."""
    return RunConfig.from_flags(vars(parse_args(argv, multi_gpu)))


def parse_args(argv=None, multi_gpu=False):
    """The checked flags of a command line (after its --config file's flags), as argparse gives them."""
    try:
        args = parse_with_config(build_parser(multi_gpu), argv)
    except UsageError:
        if not multi_gpu:
            _point_to_multi_gpu_entry(sys.argv[1:] if argv is None else argv)
        raise
    if not multi_gpu:
        vars(args).update(IMPLIED_BY_MAIN)
    check_args(args)
    return args


def _point_to_multi_gpu_entry(argv):
    """A flag of main_multi_gpu.py given to main.py: say which command takes it, rather than argparse's
    'unrecognized arguments'."""
    for token in map(str, argv):
        flag = token.split("=", 1)[0]
        if flag in MULTI_GPU_ONLY_FLAGS:
            raise UsageError(f"main.py trains on one device and has no {flag}; for several GPUs run "
                             "python main_multi_gpu.py --multi-gpu dp [flags] (DataParallel, one process), or "
                             "torchrun --nproc_per_node=N main_multi_gpu.py --multi-gpu ddp (or fsdp) [flags]")


def data_options(config, **overrides):
    """The keyword arguments of data.splits.load_har_data that the settings describe."""
    data = config.data
    options = {"dataset": data.dataset, "data_dir": data.data_dir, "mode": data.mode,
               "val_fraction": data.val_fraction, "split_seed": config.optim.seed,
               "synthetic_seed": data.synthetic_seed, "val_subjects": data.val_subjects,
               "synthetic_windows_per_subject": data.synthetic_windows_per_subject}
    return {**options, **overrides}


def save_dir_of(config):
    """--save-dir, else checkpoints/<single|dp|ddp|fsdp> after the parallel mode."""
    if config.output.save_dir:
        return Path(config.output.save_dir)
    return Path("checkpoints") / {"none": "single"}.get(config.parallel.multi_gpu, config.parallel.multi_gpu)


def warmup_epochs(optim):
    """The warmup to use: as given, else the default capped at a fifth of the run."""
    if optim.warmup_epochs is not None:
        return optim.warmup_epochs
    return min(DEFAULT_WARMUP_EPOCHS, optim.epochs / 5)


def augment_config(recipe):
    """The AugmentConfig the settings describe, or None when no augmentation is on."""
    kinds = parse_kinds(recipe.augment)
    if not kinds:
        return None
    return AugmentConfig(kinds, rotate_deg=recipe.aug_rotate_deg, scale=recipe.aug_scale, jitter=recipe.aug_jitter,
                         shift_steps=recipe.aug_shift_steps, flip_classes=class_list(recipe.aug_flip_classes, "all"),
                         rotate_wide_classes=class_list(recipe.aug_rotate_wide_classes, "none"),
                         rotate_wide_deg=recipe.aug_rotate_wide_deg)
