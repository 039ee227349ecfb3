"""The checkpoint manager: one place that writes a run's stateful parts into checkpoints and reads them back."""
from training.checkpoint import files


class CheckpointManager:
    """Writes last.pt (and the numbered and best copies) from the train state, every stateful part
    (anything with state_dict/load_state_dict, under its own key) and what the file needs to be
    used without the trainer: the run's flags, normalisation, class and channel names."""

    def __init__(self, save_dir, keep_last, strategy, state, parts, metadata):
        self.save_dir, self.keep_last, self.strategy = save_dir, keep_last, strategy
        self.state, self.parts, self.metadata = state, parts, metadata

    @property
    def last_path(self):
        return self.save_dir / files.LAST

    @property
    def best_path(self):
        return self.save_dir / files.BEST

    def save(self, is_best):
        """Every rank takes part, since a part's state may be gathered from all of them (the random
        streams); rank 0 writes."""
        parts = {key: part.state_dict() if part is not None else None for key, part in self.parts.items()}
        if self.strategy.is_main:
            files.save_run_checkpoint({**self.metadata, **self.state.state_dict(), **parts}, self.save_dir,
                                      self.keep_last, is_best)


def restore_parts(checkpoint, state, parts):
    """Load the train state and each part from `checkpoint`. Each part reads only its own entry, so the
    order does not matter; a part the checkpoint has no state for (or an empty one, such as a
    GradScaler that was off) keeps its fresh state."""
    state.load_state_dict(checkpoint)
    for key, part in parts.items():
        if part is not None and checkpoint.get(key):
            part.load_state_dict(checkpoint[key])
