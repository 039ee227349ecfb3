"""Temperature scaling: one number that divides the logits so that the class probabilities are as
sure of themselves as the model is right (Guo et al., "On Calibration of Modern Neural Networks",
2017). Fitted on held-out windows by minimising their negative log-likelihood; the argmax of every
window, and so its accuracy, stays as it was.

The probabilities are enough to scale: log p differs from the logits by one constant per window,
which softmax removes, so softmax(log p / T) = softmax(logits / T) for a single model and the log of
an ensemble's averaged probabilities alike.
"""
import json
import math
from pathlib import Path

import numpy as np
import torch

from training.checkpoint.atomic import write_atomic
from training.errors import UsageError

CALIBRATION_FILE = "calibration.json"


def _log_probabilities(probabilities):
    return torch.log(torch.as_tensor(np.asarray(probabilities), dtype=torch.float64).clamp_min(1e-300))


def fit_temperature(probabilities, labels, steps=100):
    """The temperature T > 0 that minimises the mean NLL of `labels` under softmax(log p / T):
    L-BFGS on log T (no bound to keep), on the CPU in float64; 1.0 for no windows."""
    if len(labels) == 0:
        return 1.0
    log_p = _log_probabilities(probabilities)
    targets = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    log_temperature = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_temperature], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(log_p / log_temperature.exp(), targets)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_temperature.detach().exp())


def scaled(probabilities, temperature):
    """softmax(log p / T) [N, classes] float64: the probabilities at temperature T (1 gives them back)."""
    if temperature == 1.0 or len(probabilities) == 0:
        return np.asarray(probabilities, dtype=np.float64)
    return torch.softmax(_log_probabilities(probabilities) / temperature, dim=1).numpy()


def write_calibration(path, temperature, about):
    """calibration.json: the temperature and where it was fitted, for predict.py --temperature FILE."""
    text = json.dumps({"temperature": temperature, **about}, indent=2)
    write_atomic(path, lambda partial: Path(partial).write_text(text))


def temperature_choice(value):
    """predict.py's --temperature: "fit", or the temperature it names ("none" is 1)."""
    return value if value == "fit" else 1.0 if value == "none" else read_temperature(value)


def read_temperature(value):
    """--temperature as a number: a positive number given as such, or the temperature of a
    calibration.json written by an evaluation."""
    try:
        temperature = float(value)
    except ValueError:
        temperature = _from_file(value)
    if not (math.isfinite(temperature) and temperature > 0):
        raise UsageError(f"--temperature must be a positive number or a {CALIBRATION_FILE}, got {value}")
    return temperature


def _from_file(path):
    try:
        record = json.loads(Path(path).read_text())
        return float(record["temperature"])
    except FileNotFoundError:
        raise UsageError(f"--temperature {path} is neither a number nor an existing file") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--temperature {path} is not a {CALIBRATION_FILE} with a temperature "
                         f"({type(exc).__name__})") from None
