"""A head trained again from its first weights over the feature pool, after the run's epochs: each
candidate recipe beside the one the epochs trained (recipe_choice.py), and the final model on every
training person (refit.py). Every window is in the pool already, so such a pass costs head epochs
only. It writes no checkpoint on the way: stopped, the run's last.pt still holds where it stood
before the pass, and the same command runs the pass again from its start, to the same weights."""
import dataclasses
from dataclasses import dataclass

from data.loaders import split_loaders
from training.loop.epochs import threads_for_the_step, train_epoch
from training.loop.step import build_adamw
from training.loop.stop_protocol import stop_requested


@dataclass(frozen=True)
class PoolHead:
    """What training the head again needs from the run's build: the pool (splits of pooled rows; with
    "val_more_views" where the final model trains on every person), the head's first weights (copies) and
    the training loader's request (assembly.loader_request), and the augmentations the pool's views
    carry (for the line that says which recipe was chosen)."""
    pool: dict
    first_weights: list
    request: object
    augmentations: str


def restart_head(trainer, split, views):
    """Make `trainer` train its head afresh on `split` (pooled rows of `views` views): the first
    weights, a new weight average, AdamW and schedule, the train state at its start (the recipe
    chosen kept), checkpoints held back until the pass ends."""
    model, state = trainer.model, trainer.state
    request = dataclasses.replace(trainer.pool_head.request, train_views=views)
    trainer.loaders["train"] = split_loaders({"train": split}, request)[0]["train"]
    for parameter, first in zip(model.parameters(), trainer.pool_head.first_weights, strict=True):
        parameter.data.copy_(first)
    if trainer.step.ema is not None:
        trainer.step.ema.restart()
    peak_lr = trainer.step.scheduler.base_lrs[0]
    optimizer = build_adamw(model, peak_lr, trainer.config.optim.weight_decay, trainer.strategy.device,
                            capturable=trainer.step.record_graph)
    state.load_state_dict({"recipe": state.recipe})  # every other field back to its start
    scheduler = trainer.schedule(optimizer, len(trainer.loaders["train"]))
    trainer.step = dataclasses.replace(trainer.step, optimizer=optimizer, scheduler=scheduler)
    trainer.checkpoints.parts.update(optimizer=trainer.strategy.optimizer_state(model, optimizer), scheduler=scheduler)
    trainer.first_epoch, trainer.saving = 0, False


def train_again(trainer, epochs, what, after_epoch):
    """Train the restarted head for `epochs` epochs, calling after_epoch(epoch, EpochResult) after
    each. Returns "complete", or "preempted" when a stop signal arrived (`what` names the pass in
    the line that says so)."""
    trainer.epochs = epochs
    with threads_for_the_step(trainer):
        for epoch in range(epochs):
            result = train_epoch(trainer, epoch)
            if result.stopped_early or stop_requested(trainer):
                trainer.log.info(f"received {trainer.stop_signals.received or 'a stop signal on another rank'} while "
                                 f"training {what}: {trainer.checkpoints.last_path} holds the run as it stood before, "
                                 "and the same command trains it again")
                return "preempted"
            trainer.align_replicas()
            trainer.state.end_epoch(None)
            after_epoch(epoch, result)
    return "complete"


def mean_loss(result):
    return result.loss_sum / max(1, result.loss_samples)
