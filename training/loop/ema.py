"""An exponential moving average of the weights, used for validation, best.pt and the test.

torch.optim.swa_utils.AveragedModel keeps its update count on the device, so a decay that
warms up with the count would need a host sync every step; here the count is a Python int.
"""
import copy

import torch


class WeightAverage:
    """Follows `model` (the bare module the optimizer updates) with a copy of its own."""

    def __init__(self, model, decay):
        self.source, self.decay = model, decay
        self.updates = 0
        self.module = copy.deepcopy(model).eval()
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        self._pairs = None

    def restart(self):
        """Start the average over from the model's current weights (a resumed run that kept none)."""
        self.module.load_state_dict(self.source.state_dict())
        self.updates = 0

    def update(self):
        """Fold the model's current weights (and float buffers, e.g. BatchNorm statistics) in."""
        self.updates += 1
        # Early on the average would mostly remember the random initialisation: start short.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        averaged, current, exact_averaged, exact_current = self._tensors()
        with torch.no_grad():
            torch._foreach_lerp_(averaged, current, 1.0 - decay)
            for target, source in zip(exact_averaged, exact_current, strict=True):
                target.copy_(source)  # counters such as num_batches_tracked are copied, not averaged

    def state_dict(self):
        return {"weights": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state):
        self.module.load_state_dict(state["weights"])
        self.updates = int(state["updates"])

    def _tensors(self):
        if self._pairs is None:  # the same tensors every step: look them up once
            mine = list(self.module.parameters()) + list(self.module.buffers())
            theirs = list(self.source.parameters()) + list(self.source.buffers())
            floating = [(a, b) for a, b in zip(mine, theirs, strict=True) if a.is_floating_point()]
            exact = [(a, b) for a, b in zip(mine, theirs, strict=True) if not a.is_floating_point()]
            self._pairs = ([a for a, _ in floating], [b.detach() for _, b in floating],
                           [a for a, _ in exact], [b for _, b in exact])
        return self._pairs
