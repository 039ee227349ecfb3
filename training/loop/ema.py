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
        # What checkpoints read and write: the module, or the strategy's full-tensor view of it when
        # the module is sharded (FSDP).
        self.weights = self.module
        self._pairs = None

    def restart(self):
        """Start the average over from the model's current weights (a resumed run that kept none)."""
        with torch.no_grad():
            for averaged, current in self._tensors():
                torch._foreach_copy_(averaged, current)
        self.updates = 0

    def update(self):
        """Fold the model's current weights (and float buffers, e.g. BatchNorm statistics) in."""
        self.updates += 1
        # Early on the average would mostly remember the random initialisation: start short.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        parameters, float_buffers, exact_buffers = self._tensors()
        with torch.no_grad():
            for averaged, current in (parameters, float_buffers):
                if averaged:
                    torch._foreach_lerp_(averaged, current, 1.0 - decay)
            if exact_buffers[0]:
                torch._foreach_copy_(*exact_buffers)  # counters such as num_batches_tracked are copied, not averaged

    def state_dict(self):
        return {"weights": self.weights.state_dict(), "updates": self.updates}

    def load_state_dict(self, state):
        self.weights.load_state_dict(state["weights"])
        self.updates = int(state["updates"])

    def _tensors(self):
        """(average's, model's) tensor lists: parameters, float buffers, other buffers. Parameters and
        buffers stay apart, since under FSDP the parameters are sharded DTensors and buffers are not."""
        if self._pairs is None:  # the same tensors every step: look them up once
            buffers = list(zip(self.module.buffers(), self.source.buffers(), strict=True))
            self._pairs = [_lists(zip(self.module.parameters(), self.source.parameters(), strict=True)),
                           _lists((a, b) for a, b in buffers if a.is_floating_point()),
                           _lists((a, b) for a, b in buffers if not a.is_floating_point())]
        return self._pairs


def _lists(pairs):
    pairs = list(pairs)
    return [a for a, _ in pairs], [b.detach() for _, b in pairs]
