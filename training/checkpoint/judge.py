"""One judge of "is this checkpoint this run's": what differs between a checkpoint and the run about to
resume from it, and what each difference means. Refused: a file that is not one of this trainer's, or
one made for another model, size, norm, channel layout or class count; and, resumed by itself
(--resume auto), a run on other data, another model or another LR schedule (DEFINES_THE_RUN).
Warned: every other flag that changed. Fine: the rest. Every comparison is by meaning: a size knob
with the model's defaults filled in, --dataset auto as the kind it resolves to, the data by its
identity where the checkpoint recorded one.

The schedule counts: `python main.py --epochs 1`, then `python main.py` in the same --save-dir, would
go on from an LR already decayed. docs/resuming.md lists the settings compared, with the reasons."""
import contextlib
import os
from dataclasses import dataclass, field

from data.sources import resolved_dataset
from models import MODELS, SIZE_KNOBS, feature_views_of, label_smoothing_of, resolve_size
from training.checkpoint.format import RESUMABLE_KEYS, SavedRun
from training.config.cli import resolved_config
from training.config.settings import RunConfig

# The flags whose value decides what a run trains on, what it trains, and its LR schedule (the
# number of steps and the LR of each).
DATA = ("dataset", "data_dir", "mode", "val_fraction", "val_subjects", "val_split", "synthetic_seed",
        "synthetic_windows_per_subject")
MODEL = ("model", "norm", *SIZE_KNOBS)
SCHEDULE = ("epochs", "batch_size", "grad_accum_steps", "lr", "lr_reference_batch", "lr_scaling", "warmup_epochs",
            "head_fit")
DEFINES_THE_RUN = (*DATA, *MODEL, *SCHEDULE, "seed")  # the seed: validation subjects, first weights, order
# Flags whose change on resume is the point of resuming, not a change of the run.
NOT_COMPARED_ON_RESUME = ("resume", "save_dir", "config", "debug", "stop_after_epochs")


@dataclass
class Judgement:
    refusal: str | None = None  # the one-line reason not to resume, with how to go on
    warnings: list = field(default_factory=list)  # one line per change the run accepts


def judge(checkpoint, path, config, data=None, on_purpose=False):
    """Hold `checkpoint` (loaded from `path`) against the run `config` describes. `data`: the HarData the
    run will train on, None where it was not read (a launcher whose workers read it and judge again).
    `on_purpose`: named with --resume PATH, which may change the schedule and the data."""
    saved_run = SavedRun.of(checkpoint)
    missing = saved_run.missing(RESUMABLE_KEYS) if saved_run is not None else ["all"]
    if not missing and not isinstance(saved_run.flags, dict):
        missing = ["config"]
    if missing:
        return Judgement(f"{path} is not a checkpoint of this trainer (missing: {', '.join(missing)}); "
                         "point --resume at a last.pt or best.pt it wrote")
    saved, saved_data = saved_run.flags, saved_run.data_identity
    differ = [] if on_purpose else run_differences(saved, config, saved_data, data.known_as() if data else None)
    refusal = (_another_run(saved_run, config, differ) if differ
               else _incompatibility(saved_run, path, config, data))
    warnings = [f"resumed with a changed flag: {line}" for line in changed_flags(saved, config)]
    if None not in (saved_data, data) and saved_data not in data.known_as():  # on purpose: else refused above
        warnings.append(f"resumed on other data than {path} was trained on (other windows)")
    return Judgement(refusal, warnings)


def _another_run(saved_run, config, differ):
    save_dir = config.save_dir
    saved_epochs = saved_run.planned_epochs(config.optim.epochs)
    done = saved_run.epoch
    if trained_to_the_end(saved_run):
        run, go_on = f"a finished run ({done} of {saved_epochs} epochs)", ""
    else:
        run = f"an unfinished run ({done} of {saved_epochs} epochs done)"
        go_on = f"repeat its own flags to continue it (--config {save_dir / 'config.yaml'} --resume auto), "
    return (f"--save-dir {save_dir} holds {run} with other settings: {', '.join(differ)}; {go_on}"
            "pass --no-resume to start afresh there, or use another --save-dir")


def _incompatibility(saved_run, path, config, data):
    """Another model, size, norm, channel layout or class count: no run can load these weights."""
    saved, model = saved_run.flags, config.model
    found = {key: saved.get(key) for key in ("model", "norm", "mode", *SIZE_KNOBS)}
    wanted = {"model": model.name, "norm": model.norm, **model.size(), "mode": config.data.mode}
    if data is not None:
        found.update(in_channels=saved_run.in_channels, num_classes=saved_run.num_classes)
        wanted.update(in_channels=data.train.signals.shape[1], num_classes=len(data.class_names))
    if found["model"] == wanted["model"] and found["model"] in MODELS:
        found, wanted = _sizes_resolved(found), _sizes_resolved(wanted)  # --width 64 and none: one model
    differ = [f"{key} {found[key]} (this run: {wanted[key]})" for key in wanted if found[key] != wanted[key]]
    if differ:
        return (f"checkpoint {path} was made with {', '.join(differ)}; match the flags, "
                "or use --no-resume / another --save-dir")
    windows = _window_difference(saved_run, data)
    if windows:
        return (f"checkpoint {path} was trained on {windows[0]}; --data-dir {config.data.data_dir} gives {windows[1]}, "
                "which its weights cannot read as they were trained to: use data cut as the checkpoint's was, or "
                "--no-resume / another --save-dir")
    layout = saved_run.data_layout(f"checkpoint {path}")
    channels = layout.channels if layout is not None else None
    if data is not None and channels is not None and tuple(channels) != tuple(data.channel_names):
        return (f"checkpoint {path} was trained on channels {', '.join(channels)}; --data-dir "
                f"{config.data.data_dir} gives {', '.join(data.channel_names)}: use data with the checkpoint's "
                "channels, or --no-resume / another --save-dir")
    return None


def _window_difference(saved_run, data):
    """(what the checkpoint was trained on, what this data is) where the windows' length or their NaN padding
    differ, else None. A model's layout may follow the window length (MiniRocket's dilations); a model
    fitted to windows that fill their steps reads NaN padding as signal. Padding is MiniRocket's buffer
    (other models refuse padded windows whatever the checkpoint); a key an older checkpoint lacks is not
    compared."""
    if data is None:
        return None
    layout = saved_run.data_layout()
    steps, saved_steps = data.train.signals.shape[2], layout.window_steps if layout is not None else None
    if saved_steps is not None and saved_steps != steps:
        return f"windows of {saved_steps} steps", f"windows of {steps}"
    weights = saved_run.weights
    saved_padding = weights.get("nan_padding") if isinstance(weights, dict) else None
    if saved_padding is not None and bool(saved_padding) != data.padded:
        padded = f"windows of unequal lengths, NaN-padded to {steps} steps"
        whole = f"windows that fill their {steps} steps"
        return (padded, whole) if bool(saved_padding) else (whole, padded)
    return None


def run_differences(saved_flags, config, saved_data=None, data=None):
    """'--flag saved (this run: now)' for every setting of DEFINES_THE_RUN given another value that
    means something else: size knobs count with the model's defaults filled in (--width 64 and no
    --width are one transformer), --dataset auto as the kind it resolves to. The data counts by what
    it is where the checkpoint recorded its identity (`saved_data`; `data` this run's, None where not
    read: then left to the run that reads it), else --data-dir as the folder it names. A key an older
    checkpoint lacks counts as unchanged. A default that follows another flag (the warmup follows
    --epochs) is not listed again."""
    compared = [flag for flag in DEFINES_THE_RUN if saved_data is None or flag != "data_dir"]
    changed = differing_flags(saved_flags, config, compared)
    given_before, given_now = RunConfig.from_flags({**config.flags(), **saved_flags}).flags(), config.flags()
    differ = [f"--{flag.replace('_', '-')} {_shown(given_before[flag])} (this run: {_shown(given_now[flag])})"
              for flag in changed]
    if None not in (saved_data, data) and saved_data not in data and not set(changed) & set(DATA):
        where = f" at --data-dir {given_now['data_dir']}" if given_now["data_dir"] else ""
        differ.append(f"the data{where} (other windows than the run was trained on)")
    return differ


def differing_flags(saved_flags, config, compared):
    """The flags of `compared` that `saved_flags` gave another value meaning something else (by
    meant_flags); a flag `saved_flags` lacks counts as unchanged."""
    saved = RunConfig.from_flags({**config.flags(), **saved_flags})
    given_before, given_now = saved.flags(), config.flags()
    before, now = meant_flags(saved), meant_flags(config)
    return [flag for flag in compared if before[flag] != now[flag] and given_before[flag] != given_now[flag]]


def changed_flags(saved, config):
    """'--flag: saved -> now' for every setting a resumed run changes, by meaning (meant_flags); keys older
    runs lack are skipped."""
    now = resolved_config(config, config.save_dir)
    meant_then, meant_now = meant_flags(RunConfig.from_flags({**config.flags(), **saved})), meant_flags(config)
    return [f"--{key.replace('_', '-')}: {saved[key]!r} in the checkpoint's run, {now[key]!r} now"
            for key in now if key not in NOT_COMPARED_ON_RESUME and key in saved and saved[key] != now[key]
            and meant_then.get(key, saved[key]) != meant_now.get(key, now[key])]


def meant_flags(config):
    """config.flags() with each setting of DEFINES_THE_RUN as what it means, so that two spellings of one
    run compare equal: the warmup as planned, the dataset as resolved, the model's sizes, feature views
    and label smoothing filled in, --data-dir as the real path it names."""
    flags = config.flags()
    flags["warmup_epochs"] = config.optim.planned_warmup_epochs
    flags["dataset"] = resolved_dataset(config.data.dataset, config.data.data_dir)
    with contextlib.suppress(KeyError):  # the model's own where not given: 4 and none are one minirocket run
        flags["feature_views"] = feature_views_of(config.model.name, config.recipe.feature_views)
        flags["label_smoothing"] = label_smoothing_of(config.model.name, config.recipe.label_smoothing)
    if flags["data_dir"] is not None:
        flags["data_dir"] = os.path.realpath(os.path.expanduser(flags["data_dir"]))
    return _sizes_resolved(flags)


def _sizes_resolved(settings):
    """`settings` with the model's size knobs filled in with its defaults (unchanged where the
    model or knobs cannot be resolved: the comparison then reports them as they are)."""
    with contextlib.suppress(ValueError, KeyError):
        return {**settings, **resolve_size(settings["model"], **{knob: settings.get(knob) for knob in SIZE_KNOBS})}
    return settings


def trained_to_the_end(saved_run):
    """Whether the checkpoint `saved_run` (a SavedRun) trained for all its epochs (its --epochs, or one where
    its head was solved by ridge), or stopped early by its own patience."""
    if saved_run.epoch >= saved_run.planned_epochs(float("inf")):
        return True
    patience = saved_run.flags.get("early_stopping_patience") or 0
    return bool(patience) and saved_run.epochs_since_best >= patience


def _shown(value):
    return "none" if value is None else value
