"""An earlier run's files in the --save-dir of a run that does not continue it (--no-resume, a folder
without a checkpoint, --resume PATH from elsewhere): listed when the run starts, moved into
<save-dir>/previous-N/ just before its first save. So a fresh run never inherits a step checkpoint
that a damaged last.pt would fall back to, nor a calibration.json fitted for other weights, while a
run that stops before it saves leaves the earlier one where it was. Nothing is deleted, and only the
trainer's own outputs move: a file of the user's stays where it is."""
import contextlib
import itertools
import os
import tempfile
from pathlib import Path

from evaluation.calibration import CALIBRATION_FILE
from evaluation.figures import RUN_FIGURES
from training.checkpoint.files import BEST, LAST, NUMBERED
from training.config.cli import CONFIG_NAME
from training.errors import UsageError

# What a run writes in its folder, by name; in logs/, TensorBoard's event files (TENSORBOARD_EVENTS).
RUN_OUTPUTS = (LAST, BEST, CONFIG_NAME, "metrics.jsonl", "val_report.json", "test_report.json", CALIBRATION_FILE,
               *RUN_FIGURES, "logs")
ASIDE = "previous-{}"
TENSORBOARD_EVENTS = "events.out.tfevents."


def continues_its_folder(resume_from, save_dir):
    """Whether a run resumes the checkpoint of its own --save-dir (then nothing there is moved aside)."""
    return resume_from is not None and Path(resume_from).resolve().parent == Path(save_dir).resolve()


def earlier_run_files(save_dir):
    """The trainer's outputs already in `save_dir`, relative to it; the files under logs/ one by one, so
    that this run's own TensorBoard file, which may be written there before its first save, stays."""
    save_dir = Path(save_dir)
    found = []
    for path in sorted(save_dir.iterdir()):
        if path.name in RUN_OUTPUTS or NUMBERED.fullmatch(path.name):
            found.extend(sorted(p for p in path.rglob(TENSORBOARD_EVENTS + "*") if p.is_file()) if path.is_dir()
                         else [path])
    return [path.relative_to(save_dir) for path in found]


def check_movable(save_dir, earlier):
    """Refuse, before the run trains, an earlier run whose files could not all be moved aside: each
    folder they leave must take a change (a read-only mount, an immutable folder), as must --save-dir,
    where previous-N/ is made."""
    save_dir = Path(save_dir)
    for folder in sorted({(save_dir / name).parent for name in earlier}):
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".move-test.", dir=folder))
        except OSError as exc:
            raise UsageError(f"--save-dir {save_dir} holds an earlier run, whose files in {folder} cannot be moved "
                             f"aside ({exc.strerror}); move them yourself, or use another --save-dir") from None


def move_aside(save_dir, earlier, say):
    """Move `earlier` (from earlier_run_files) into the first free <save-dir>/previous-N/ under the same
    names, and say so in one line. All or nothing: where one cannot move, those already moved go back,
    so an earlier run is never split between its folder and previous-N/."""
    if not earlier:
        return
    save_dir = Path(save_dir)
    aside = next(save_dir / ASIDE.format(n) for n in itertools.count(1) if not (save_dir / ASIDE.format(n)).exists())
    moved = []
    try:
        for name in earlier:
            (aside / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(save_dir / name, aside / name)
            moved.append(name)
    except OSError as exc:
        left = _move_back(save_dir, aside, moved)
        where = f"; {len(left)} could not go back and are in {aside}" if left else ", and nothing was moved"
        raise UsageError(f"--save-dir {save_dir} holds an earlier run, whose files could not be moved into {aside} "
                         f"({exc.strerror}{where}); move them yourself, or use another --save-dir") from None
    for folder in {name.parents[-2] for name in earlier if len(name.parts) > 1}:
        with contextlib.suppress(OSError):  # emptied, unless this run has written there already
            os.rmdir(save_dir / folder)
    names = sorted({name.parts[0] for name in earlier})
    say(f"moved the earlier run's files ({', '.join(names)}) from {save_dir} into {aside}: this run starts afresh; "
        "other files stay where they are")


def _move_back(save_dir, aside, moved):
    """Put `moved` back where they were, newest first, and remove the folders made for them (previous-N/
    was free, so what is left there is this call's); the names that could not go back."""
    left = []
    for name in reversed(moved):
        try:
            os.replace(aside / name, save_dir / name)
        except OSError:
            left.append(name)
    for folder, _, _ in os.walk(aside, topdown=False):
        with contextlib.suppress(OSError):  # holds what could not go back
            os.rmdir(folder)
    return left
