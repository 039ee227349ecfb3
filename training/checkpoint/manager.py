"""The checkpoint manager: one place that writes a run's stateful parts into checkpoints and reads them back."""
from training.checkpoint import files
from training.checkpoint.format import SavedRun, nonfinite_tensor, run_checkpoint
from training.errors import TrainingDiverged


class CheckpointManager:
    """Writes last.pt (and the numbered and best copies) from the train state, every stateful part
    (anything with state_dict/load_state_dict, under its own key) and what the file needs to be
    used without the trainer: the run's flags, normalisation, class and channel names.

    `config`: the run's RunConfig, whose --save-dir (config.save_dir) the files go to, beside at most
    --keep-last numbered copies.

    `resumed`: last.pt already holds this run (else it holds nothing, or an earlier run's until the
    first save). `before_first_save(trained)`: what rank 0 does with the first checkpoint (move an
    earlier run's files aside, write config.yaml), so that a fresh run that stops before saving
    leaves an earlier run's folder as it was; `trained` is False when a run reports without having
    trained anything."""

    def __init__(self, *, config, strategy, state, parts, metadata, resumed=False, before_first_save=None):
        self.save_dir, self.keep_last, self.strategy = config.save_dir, config.output.keep_last, strategy
        self.state, self.parts, self.metadata = state, parts, metadata
        self.holds_this_run, self.before_first_save = resumed, before_first_save

    @property
    def last_path(self):
        return self.save_dir / files.LAST

    @property
    def best_path(self):
        return self.save_dir / files.BEST

    def kept(self):
        """What the folder holds for this run, for the message of a run that stops without saving."""
        if self.holds_this_run and self.last_path.exists():  # resumed from this folder, or saved here
            return f"{self.last_path} still holds the last good state"
        if self.last_path.exists():
            return f"nothing of this run was saved ({self.last_path} is an earlier run's)"
        return "nothing was saved"

    def write_pending(self, trained=False):
        """What the first save does, also for a run that reports without having saved: a resumed run
        with nothing left to train still describes itself (by the settings it was trained with)."""
        if self.strategy.is_main and self.before_first_save is not None:
            self.before_first_save(trained)
        self.before_first_save = None

    def save(self, is_best):
        """Every rank takes part, since a part's state may be gathered from all of them (the random
        streams); rank 0 checks that what resuming would refuse is finite, and writes."""
        parts = {key: part.state_dict() if part is not None else None for key, part in self.parts.items()}
        checkpoint = run_checkpoint(self.metadata, self.state.state_dict(), parts)
        # A loss can stay finite while the weights or BatchNorm's statistics overflow (a learning rate
        # far too high); such a file would replace the last good one and be refused by every reader.
        bad = nonfinite_tensor(SavedRun(checkpoint).trained_tensors()) if self.strategy.is_main else None
        if self.strategy.max_ints([int(bad is not None)])[0]:
            raise TrainingDiverged(f"the weights became NaN/inf ({bad or 'seen by rank 0'}) by step {self.state.step}; "
                                   f"{self.kept()}. Lower --lr, keep --max-grad-norm on, or check the data for "
                                   "extreme values")
        self.write_pending(trained=True)
        if self.strategy.is_main:
            files.save_run_checkpoint(checkpoint, self.save_dir, self.keep_last, is_best)
        self.holds_this_run = True


def restore_parts(saved, state, parts):
    """Load the train state and each part from `saved` (a SavedRun). Each part reads only its own entry,
    so the order does not matter; a part the checkpoint has no state for (or an empty one, such as a
    GradScaler that was off) keeps its fresh state."""
    state.load_state_dict(saved.train_state)
    for key, part in parts.items():
        if part is not None and saved.part(key):
            part.load_state_dict(saved.part(key))
