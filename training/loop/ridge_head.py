"""A fixed-feature model's linear head (LINEAR_HEAD: MiniRocket's) solved in closed form, for small data:
ridge regression on +-1 class targets over the training windows' pooled features, as aeon's MiniRocket
classifier does, its strength chosen by the error on each person (or stretch of one person's windows)
left out. On a few hundred windows the AdamW epochs take a few dozen steps and lose to it
(docs/training.md, "Small data: the head solved by ridge regression"); on more windows the augmented
views and epochs generalise better across people, so above RIDGE_MAX_WINDOWS the head is trained as
before.

The solve works in the dual (one row and column per window), so its cost grows with the windows
squared: at RIDGE_MAX_WINDOWS it takes about a second on two CPU cores."""
import time
from dataclasses import dataclass

import numpy as np
import torch

from evaluation.calibration import fit_temperature
from training.loop.epochs import EpochResult, end_epoch

RIDGE_MAX_WINDOWS = 1024  # auto: the largest training split solved by ridge (the measurements: docs/training.md)
ALPHAS = tuple(np.logspace(-3, 5, 9))  # the strengths tried: scikit-learn's and aeon's -3..3, and two stronger
RIDGE_LIMIT_WINDOWS = 16_384  # --head-fit ridge: its dual's 2 GiB float64 Gram matrix, and minutes to decompose
FEATURE_CHUNK = 1024  # windows turned from counts into features at a time


@dataclass
class RidgeSolution:
    weight: torch.Tensor  # float32 [K, F]
    bias: torch.Tensor  # float32 [K]
    alpha: float
    held_out: torch.Tensor  # float64 [N, K]: each window's outputs from the solve without its group


def solve_ridge(features, labels, classes, groups=None, alphas=ALPHAS):
    """The RidgeSolution of least squares from `features` [N, F] to +-1 targets of
    `labels` [N], the intercept unpenalised, alpha the one of `alphas` with the smallest squared error
    on windows left out: each window alone (scikit-learn's RidgeClassifierCV), or each group of
    `groups` [N] at a time (exact for ridge: the group's residuals through (I - H_gg)^-1, H the hat
    matrix). Overlapping windows of one person share samples, so leaving one out while its
    neighbours stay would choose too weak an alpha. float64 throughout."""
    x = features.double()
    count = len(labels)
    targets = -torch.ones(count, classes, dtype=torch.float64)
    targets[torch.arange(count), torch.as_tensor(np.asarray(labels, dtype=np.int64))] = 1.0
    x_mean, target_mean = x.mean(dim=0), targets.mean(dim=0)
    x, targets = x - x_mean, targets - target_mean
    eigenvalues, vectors = torch.linalg.eigh(x @ x.T)
    eigenvalues = eigenvalues.clamp_min(0.0)  # rounding leaves the null directions slightly negative
    projected = vectors.T @ targets
    alone = groups is None or len(np.unique(groups)) == count  # every window its own group: the fast formula
    members = None if alone else [torch.from_numpy(np.flatnonzero(np.asarray(groups) == group))
                                  for group in np.unique(groups)]
    errors, left_outs = [], []
    for alpha in alphas:
        shrink = eigenvalues / (eigenvalues + alpha)
        residual = targets - vectors @ (shrink[:, None] * projected)
        if members is None:
            leverage = 1.0 / count + (vectors * vectors) @ shrink  # the intercept's 1/N, then the ridge's
            left_out = residual / (1.0 - leverage)[:, None]
        else:
            left_out = torch.cat([torch.linalg.solve(torch.eye(len(rows), dtype=torch.float64) - _hat(vectors[rows],
                                                                                                      shrink, count),
                                                     residual[rows]) for rows in members])
        errors.append(float((left_out ** 2).mean()))
        left_outs.append(left_out)
    best = int(np.argmin(errors))
    alpha = alphas[best]
    dual = vectors @ (projected / (eigenvalues + alpha)[:, None])
    weight = x.T @ dual
    held_out = targets - left_outs[best] + target_mean  # the targets less the left-out residual, uncentred
    return RidgeSolution(weight.T.float(), (target_mean - x_mean @ weight).float(), float(alpha), held_out)


def scaled_ridge(features, labels, classes, groups):
    """(weight, bias, alpha, temperature): the solve with its outputs divided by the temperature that
    makes the softmax of its held-out outputs likeliest. Least squares gives outputs near +-1, whose
    softmax is far less sure than the head's accuracy warrants; predict.py reads the probabilities
    (--uncertain-below, the smoothers), so they are put on the scale the data supports. The argmax,
    and so every prediction, stays."""
    solution = solve_ridge(features, labels, classes, groups=groups)
    temperature = fit_temperature(torch.softmax(solution.held_out, dim=1).numpy(), labels)
    return solution.weight / temperature, solution.bias / temperature, solution.alpha, temperature


def _hat(rows_of_vectors, shrink, count):
    """The hat matrix's block between these rows: the intercept's 1/N, then the ridge's."""
    return 1.0 / count + (rows_of_vectors * shrink) @ rows_of_vectors.T


class NothingToStep:
    """The optimizer and the LR schedule of a run whose head is solved by ridge regression, which takes
    no step: building torch's AdamW imports torch._dynamo (0.9 s on the 2-core development machine,
    most of a small set's set-up). Its checkpoints hold them empty; a state an earlier run saved is
    one of an optimizer that never stepped, and is passed over."""
    state = {}  # no moments (what a run's model-state line counts)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def left_out_groups(subjects, blocks=10):
    """What the alpha's error leaves out at a time: each person where there are several, else
    `blocks` stretches of consecutive windows (one person's recording, cut in time)."""
    if len(np.unique(subjects)) >= 3:
        return np.asarray(subjects)
    return np.arange(len(subjects)) * min(blocks, len(subjects)) // len(subjects)


def fit_head_by_ridge(trainer):
    """The run's one 'epoch': solve the head on the trainer's head_pool (counts of the training
    windows as they are), put it in the model and its average, then validate, save and log as an
    epoch ends. Returns "complete"."""
    state, log, pool = trainer.state, trainer.log, trainer.head_pool
    if state.epoch >= 1:
        log.info("the head was already solved by ridge regression; evaluating the test split")
        return "complete"
    start = time.perf_counter()
    loss_sum = solve_into_head(trainer, pool, "head: ridge regression on")
    end_epoch(trainer, 0, EpochResult(steps=0, samples=len(pool), train_time_s=time.perf_counter() - start,
                                      loss_sum=loss_sum, loss_samples=len(pool), stopped_early=False), start)
    return "complete"


def solve_into_head(trainer, pool, said):
    """Solve the head on `pool` (pooled counts of windows as they are), put it in the model and its
    average, and log one line that starts with `said`. Returns the solved head's summed cross-entropy
    on the windows it was solved on (an epoch line's training loss)."""
    start = time.perf_counter()
    labels = np.asarray(pool.labels, dtype=np.int64)  # a store's labels are narrower integers
    model = trainer.model
    # Read by positions, which a pool in memory and one on disk (training.pool.store.ShardedRows) both take.
    chunks = (np.arange(first, min(first + FEATURE_CHUNK, len(pool))) for first in range(0, len(pool), FEATURE_CHUNK))
    features = torch.cat([model.from_counts(torch.as_tensor(np.asarray(pool.signals[rows]),
                                                            device=trainer.strategy.device)).cpu()
                          for rows in chunks])
    weight, bias, alpha, temperature = scaled_ridge(features, labels, len(trainer.data.class_names),
                                                    left_out_groups(pool.subjects))
    linear = model.head[-1]
    with torch.no_grad():
        linear.weight.copy_(weight.to(linear.weight.device))
        linear.bias.copy_(bias.to(linear.bias.device))
    if trainer.step.ema is not None:
        trainer.step.ema.restart()  # the average of one set of weights is those weights
    trainer.log.info(f"{said} {len(pool):,} training windows, alpha {alpha:.3g} (of {ALPHAS[0]:g} to {ALPHAS[-1]:g}, "
                     f"by the error on each person or stretch left out), outputs divided by {temperature:.3g} "
                     f"(fitted on those held-out outputs) in {time.perf_counter() - start:.1f} s")
    loss = torch.nn.functional.cross_entropy(features @ weight.T + bias, torch.from_numpy(labels), reduction="sum")
    return float(loss)
