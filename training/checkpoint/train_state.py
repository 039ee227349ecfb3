"""Where a run stands: the one object that says how far it got, saved beside the stateful parts."""
import math
from dataclasses import asdict, dataclass, fields


@dataclass
class TrainState:
    """The position of a run. The epoch's order, the LR schedule and the random streams are
    positioned from it; nothing else counts progress."""
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    epoch_position: int = 0  # samples of the current epoch's order already trained on, all ranks together
    best_metric: float = -math.inf  # best validation macro-F1 so far
    epochs_since_best: int = 0
    epoch_loss_sum: float = 0.0  # the current epoch's summed training loss so far, all ranks
    epoch_samples: int = 0  # ... and the samples it sums over

    def state_dict(self):
        return asdict(self)

    def load_state_dict(self, state):
        for item in fields(self):  # a checkpoint from before a field existed keeps its default
            setattr(self, item.name, type(item.default)(state.get(item.name, item.default)))

    def end_epoch(self, metric):
        """Count a finished epoch and its validation metric; True when it is the best so far. Without
        a validation split (metric None) the newest weights are the ones kept."""
        is_best = metric is None or metric > self.best_metric
        metric = self.best_metric if metric is None else metric
        self.epoch += 1
        self.best_metric = max(self.best_metric, metric)
        self.epochs_since_best = 0 if is_best else self.epochs_since_best + 1
        self.epoch_position, self.epoch_loss_sum, self.epoch_samples = 0, 0.0, 0
        return is_best

    def schedule_step(self, steps_per_epoch, global_batch):
        """The LR schedule's position in this run's optimizer steps: whole epochs, then the samples
        of the current one at this run's global batch (the same count as `step` unless a resumed
        run changed the batch layout)."""
        return self.epoch * steps_per_epoch + round(self.epoch_position / global_batch)
