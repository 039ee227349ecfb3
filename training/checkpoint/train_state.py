"""Where a run stands: the one object that says how far it got, and every rank's random streams,
each a stateful part saved beside the others as plain tensors and containers."""
import math
import random
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch


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
    recipe: str = ""  # the recipe the validation people chose (training/loop/recipe_choice.py); "" before
    refitted: bool = False  # the final model was trained on every training person (training/loop/refit.py)

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


def capture_random_streams(device, other_gpus=()):
    """This process's torch (CPU and its CUDA device), numpy and python generator states,
    in containers that `torch.load(weights_only=True)` accepts. `other_gpus`: indices of more
    GPUs this process draws on (DataParallel's replicas), whose streams are kept too."""
    bit_generator, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "cuda_others": [[index, torch.cuda.get_rng_state(index)] for index in other_gpus],
        "numpy": {"bit_generator": bit_generator, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "position": int(position), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }


def restore_random_streams(state, device):
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
        for index, gpu_state in state.get("cuda_others", ()):
            if index < torch.cuda.device_count():
                torch.cuda.set_rng_state(gpu_state, index)
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["bit_generator"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def seed_epoch(seed, epoch, rank):
    """Seed every stream from (seed, epoch, rank): an epoch started afresh, resumed at its
    boundary, or resumed with another world size draws the same way."""
    value = seed * 1_000_003 + epoch * 1_009 + rank
    torch.manual_seed(value)  # also seeds every CUDA device
    np.random.seed(value % 2**32)
    random.seed(value)


class RandomStreams:
    """Every rank's random streams as one stateful part: the state gathers them (a collective, so
    every rank saves together), loading keeps them for the epoch that resumes mid-way."""

    def __init__(self, strategy, replicas=False):
        self.strategy = strategy
        self.saved = None  # one state per rank of the run that saved them
        # Replicas of one model (a replicated head) draw as rank 0 does, so that they stay the same.
        self.seed_rank = 0 if replicas else strategy.rank

    def state_dict(self):
        return self.strategy.gather_objects(capture_random_streams(self.strategy.device, self.strategy.other_gpus))

    def load_state_dict(self, per_rank):
        self.saved = per_rank

    def covers_every_rank(self):
        return bool(self.saved) and len(self.saved) == self.strategy.world_size

    def start_epoch(self, seed, epoch, resume_exactly):
        """Continue the saved streams (a mid-epoch resume in the same layout), else seed the epoch's."""
        if resume_exactly:
            restore_random_streams(self.saved[self.strategy.rank], self.strategy.device)
        else:
            seed_epoch(seed, epoch, self.seed_rank)
        self.saved = None
