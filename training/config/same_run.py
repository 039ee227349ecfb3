"""Which settings make a run the run it is, and the refusal to resume another run by itself.

`python main.py --epochs 1`, then `python main.py` in the same --save-dir, used to continue the
finished one-epoch run with a twenty-epoch command: a schedule whose LR had already decayed. An
automatic resume (--resume auto) now continues only the run the command describes: the same data,
model and LR schedule. Any other setting may change on resume with a warning (config/files.py).
"""
import contextlib
import os

from models import SIZE_KNOBS, resolve_size
from training.config.cli import warmup_epochs
from training.config.settings import RunConfig
from training.errors import UsageError

# The flags whose value decides what a run trains on, what it trains, and its LR schedule (the
# number of steps and the LR of each). docs/resuming.md lists them with the reasons.
DATA = ("dataset", "data_dir", "mode", "val_fraction", "val_subjects", "synthetic_seed",
        "synthetic_windows_per_subject")
MODEL = ("model", "norm", *SIZE_KNOBS)
SCHEDULE = ("epochs", "batch_size", "grad_accum_steps", "lr", "lr_scaling", "warmup_epochs")
DEFINES_THE_RUN = (*DATA, *MODEL, *SCHEDULE, "seed")  # the seed: validation subjects, first weights, order


def check_same_run(config, checkpoint, save_dir):
    """Refuse, in one line, to resume by itself a checkpoint whose run differs from `config` in a
    setting of DEFINES_THE_RUN. A file that is not one of this trainer's is left to check_compatible."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("config"), dict):
        return
    differ = run_differences(checkpoint["config"], config)
    if not differ:
        return
    saved_epochs = checkpoint["config"].get("epochs", config.optim.epochs)
    done = checkpoint.get("epoch", 0)
    if _finished(checkpoint):
        run = f"a finished run ({done} of {saved_epochs} epochs)"
        go_on = ""
    else:
        run = f"an unfinished run ({done} of {saved_epochs} epochs done)"
        go_on = f"repeat its own flags to continue it (--config {save_dir / 'config.yaml'}), "
    raise UsageError(f"--save-dir {save_dir} holds {run} with other settings: {', '.join(differ)}; {go_on}"
                     "pass --no-resume to start afresh there, or use another --save-dir")


def run_differences(saved_flags, config):
    """'--flag saved (this run: now)' for every setting of DEFINES_THE_RUN given another value that
    means something else: size knobs count with the model's defaults filled in (--width 64 and no
    --width are one transformer), --data-dir as the folder it names. A key an older checkpoint
    lacks counts as unchanged. A default that follows another flag (the warmup follows --epochs)
    is not listed again."""
    saved = RunConfig.from_flags({**config.flags(), **saved_flags})
    given_before, given_now = saved.flags(), config.flags()
    before, now = _meanings(saved), _meanings(config)
    return [f"--{flag.replace('_', '-')} {_shown(given_before[flag])} (this run: {_shown(given_now[flag])})"
            for flag in DEFINES_THE_RUN if before[flag] != now[flag] and given_before[flag] != given_now[flag]]


def _meanings(config):
    flags = {flag: config.flags()[flag] for flag in DEFINES_THE_RUN}
    flags["warmup_epochs"] = warmup_epochs(config.optim)
    # None stands for the model's default: --width 64 and no --width are one transformer. A model or
    # knobs that cannot be resolved are compared as given.
    with contextlib.suppress(ValueError, KeyError):
        flags.update(resolve_size(config.model.name, **config.model.size()))
    if flags["data_dir"] is not None:
        flags["data_dir"] = os.path.realpath(os.path.expanduser(flags["data_dir"]))
    return flags


def _finished(checkpoint):
    """Trained for all its epochs, or stopped early by its own patience."""
    saved = checkpoint["config"]
    if checkpoint.get("epoch", 0) >= saved.get("epochs", float("inf")):
        return True
    patience = saved.get("early_stopping_patience") or 0
    return bool(patience) and checkpoint.get("epochs_since_best", 0) >= patience


def _shown(value):
    return "none" if value is None else value
