"""The model a run saves, trained on every training person (--final-model everyone).

Validation people are held out to choose: the epoch whose weights best.pt keeps, the temperature that
calibrates them, and the recipe (recipe_choice.py). Kept out of the model as well, they cost it what
they would have taught (docs/training.md, "The final model and the recipe" measures it). So a run
whose head trains over a feature pool in memory chooses first and then trains the head again
(head_again.py), from the same first weights and under the same schedule, on the views of the
training and the validation people together, for the epochs validation chose; that head is best.pt.
The validation people's views were built with the training views. The temperature stays the chosen
model's, fitted on people it had not seen: a model that has seen them cannot fit one on them.

A head solved by ridge regression chooses its strength and temperature on people left out inside the
solve (ridge_head.py); it is solved again on every training person, the validation people's windows
added, after its validation report."""
import numpy as np

from data.provenance import read_json
from data.splits import Split
from evaluation.calibration import CALIBRATION_FILE
from training.loop.head_again import mean_loss, restart_head, train_again
from training.loop.recipe_choice import choose_recipe, chosen_views
from training.loop.ridge_head import solve_into_head
from training.reporting.final_report import report_best_weights


def finish(trainer):
    """After the epochs: the recipe chosen where there are candidates, then the final report, and
    between its validation part (which chooses) and its test part the final model trained on every
    person. Returns "complete" or "preempted"."""
    if trainer.chooses and not trainer.state.recipe and choose_recipe(trainer) == "preempted":
        return "preempted"
    if not trainer.refits:
        report_best_weights(trainer)
    else:
        calibration = None
        if not trainer.state.refitted:
            calibration = report_best_weights(trainer, splits=("val",))
            again = solve_on_everyone if trainer.head_pool is not None else refit_on_everyone
            if again(trainer) == "preempted":
                return "preempted"
        elif trainer.strategy.is_main:
            calibration = read_json(trainer.config.save_dir / CALIBRATION_FILE)  # fitted before the run stopped
        report_best_weights(trainer, splits=("test",), calibration=calibration)
    return "complete"


def everyone(train, val, views):
    """The training and validation people's pooled rows (each `views` views laid one after the other)
    as one training split of `views` views, view v of both together at the place of view v (the
    sampler's epoch e reads view e mod views)."""
    def interleaved(field):
        parts = [np.split(np.asarray(getattr(split, field)), views) for split in (train, val)]
        return np.concatenate([rows for pair in zip(*parts, strict=True) for rows in pair])
    return Split(interleaved("signals"), interleaved("labels"), interleaved("subjects"))


def solve_on_everyone(trainer):
    """Solve the ridge head again on every training person's windows and save it as best.pt and
    last.pt. Returns "complete" (a solve takes no steps a signal could stop between)."""
    pool = trainer.pool_head.pool
    joined = Split(*(np.concatenate([getattr(pool["train"], field), getattr(pool["val"], field)])
                     for field in ("signals", "labels", "subjects")))
    solve_into_head(trainer, joined, "final model: the head solved again by ridge regression on every training "
                                     "person, the validation people included:")
    trainer.state.refitted = True
    trainer.save(is_best=True)
    return "complete"


def refit_on_everyone(trainer):
    """Train the head again on every training person for the epochs validation chose, with the views of
    the recipe chosen, then save it as best.pt and last.pt. Returns "complete", or "preempted" when a
    stop signal arrived (nothing saved)."""
    state, log, pool = trainer.state, trainer.log, trainer.pool_head.pool
    chosen = state.epoch - state.epochs_since_best  # the epoch whose weights validation kept
    train, views = chosen_views(trainer)
    val = pool["val"] if views == 1 else Split(*(np.concatenate([getattr(pool["val"], field),
                                                                 getattr(pool["val_more_views"], field)])
                                                 for field in ("signals", "labels", "subjects")))
    everything = everyone(train, val, views)
    log.info(f"final model: the head trained again from its first weights on every training person "
             f"({len(everything) // views:,} windows, the validation people's included) for the {chosen} epoch(s) "
             "validation chose; the temperature stays the one fitted on the validation people")
    restart_head(trainer, everything, views)

    def say(epoch, result):
        log.info(f"final model: epoch {epoch + 1}/{chosen}, training loss {mean_loss(result):.4f}")
    if train_again(trainer, chosen, "the final model", say) == "preempted":
        return "preempted"
    state.refitted, trainer.saving = True, True
    trainer.save(is_best=True)
    return "complete"
