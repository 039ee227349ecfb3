"""The recipe chosen on the user's own data (--recipe-choice validation): the augmented views as set,
or the windows as they are.

Augmentations encode what should not change a prediction. Turning a waist phone's windows teaches a
head that the phone's orientation in a pocket does not matter; on a wrist, where the arm's angle is
what tells one exercise from another, the same turn teaches it to ignore the signal, and even
amplitude and time shifts can cost a device its cues. No fixed recipe is right for every device, so
after the run's epochs the head trains once more from its first weights, for as many epochs, on
view 0 of the pool alone (the training windows as they are: no transform is needed), and the
validation people choose: the plain windows only where their best macro-F1 on them is higher than
the augmented views' by more than CHOICE_MARGIN. A few validation people score either candidate a
point apart by luck alone (on the development layouts the plain windows won by 0.7 point on three
people and lost 1.5 points on six others), while a recipe that fights the device loses by more. Only
the validation split is read: the test split never moves the choice.

The choice is the train state's `recipe` ("augmented" or "plain"), so a resumed or repeated command
makes it once and keeps it; one line says what was chosen and the figures that chose it. Where the
plain windows win, their best weights become best.pt (and last.pt: the run as it stands after the
choice), and the final model (refit.py) trains on view 0 of everyone."""
import copy

import numpy as np

from data.splits import Split
from evaluation.metrics import summary_metrics
from training.loop.head_again import restart_head, train_again

AUGMENTED, PLAIN = "augmented", "plain"
CHOICE_MARGIN = 0.01  # of validation macro-F1: what the plain windows must win by to replace the augmented views


def chosen_views(trainer):
    """(the training people's pooled rows of the recipe chosen, its views): every view where the
    augmented views were kept (or nothing was chosen), view 0 alone for the plain windows."""
    rows = trainer.pool_head.pool["train"]
    windows = len(trainer.data.train)
    if trainer.state.recipe != PLAIN:
        return rows, len(rows) // windows
    return Split(rows.signals[:windows], rows.labels[:windows], rows.subjects[:windows]), 1


def choose_recipe(trainer):
    """Train the plain candidate and keep whichever the validation people score higher; save the
    choice. Returns "complete", or "preempted" when a stop signal arrived (nothing saved)."""
    state, log = trainer.state, trainer.log
    augmented_f1, augmented_epoch = state.best_metric, state.epoch - state.epochs_since_best
    epochs = trainer.config.optim.epochs
    before = _where_it_stands(trainer)
    state.recipe = PLAIN
    plain, views = chosen_views(trainer)
    restart_head(trainer, plain, views)
    best = {"f1": -np.inf, "epoch": 0, "weights": None}

    def judge(epoch, result):
        labels, logits, _ = trainer.evaluate("val")
        f1 = summary_metrics(labels, logits.argmax(axis=1), len(trainer.data.class_names))["macro_f1"]
        if f1 > best["f1"]:
            best.update(f1=f1, epoch=epoch + 1, weights=_weights(trainer))
    if train_again(trainer, epochs, "the recipe without augmentation", judge) == "preempted":
        return "preempted"
    figures = (f"validation macro-F1 {augmented_f1:.4f} (epoch {augmented_epoch}) with the augmented views "
               f"({trainer.pool_head.augmentations}), {best['f1']:.4f} (epoch {best['epoch']}) on the windows as "
               "they are")
    if best["f1"] > augmented_f1 + CHOICE_MARGIN:
        _put_weights(trainer, best["weights"])
        state.load_state_dict({"epoch": epochs, "step": state.step, "best_metric": best["f1"],
                               "epochs_since_best": epochs - best["epoch"], "recipe": PLAIN})
        log.info(f"recipe: the windows as they are, without augmentation: {figures} (--recipe-choice fixed keeps "
                 "the augmentations as set)")
    else:
        _return_to(trainer, before)
        state.recipe = AUGMENTED
        log.info(f"recipe: the augmented views: {figures} (the windows as they are must win by more than "
                 f"{100 * CHOICE_MARGIN:g} point)")
    trainer.saving = True
    trainer.save(is_best=state.recipe == PLAIN)
    return "complete"


def _weights(trainer):
    """Copies of the model's and its average's state."""
    average = trainer.step.ema
    return (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(average.state_dict()) if average else None)


def _put_weights(trainer, weights):
    model_state, average_state = weights
    trainer.model.load_state_dict(model_state)
    if average_state is not None:
        trainer.step.ema.load_state_dict(average_state)


def _where_it_stands(trainer):
    """What the run's epochs left, to return to when their augmented views stay the recipe."""
    parts = trainer.checkpoints.parts
    return {"weights": _weights(trainer), "state": copy.deepcopy(trainer.state.state_dict()),
            "step": trainer.step, "loader": trainer.loaders["train"], "epochs": trainer.epochs,
            "parts": {key: parts[key] for key in ("optimizer", "scheduler")}}


def _return_to(trainer, before):
    _put_weights(trainer, before["weights"])
    trainer.state.load_state_dict(before["state"])
    trainer.step, trainer.loaders["train"], trainer.epochs = before["step"], before["loader"], before["epochs"]
    trainer.checkpoints.parts.update(before["parts"])
