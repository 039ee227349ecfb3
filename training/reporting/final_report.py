"""A run's final report, written once training ends: best.pt's weights judged on the validation split
(where the temperature that calibrates them is fitted, into calibration.json) and on the test split,
into val_report.json and test_report.json, with the test report printed."""
import time

import torch

from data.loaders import gathered_order
from evaluation.calibration import CALIBRATION_FILE, calibration_fields, fit_temperature, format_calibration
from evaluation.metrics import classification_report, format_people, format_report, per_subject_accuracy
from training.checkpoint import files as ckpt
from training.errors import UsageError

NO_BEST, BEST_FITS, FOREIGN_BEST = 0, 1, 2  # what rank 0 found at best.pt


def _fits(weights, model):
    """Whether `weights` hold exactly the model's entries, each of its shape."""
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    return isinstance(weights, dict) and {name: tuple(getattr(value, "shape", ())) for name, value in
                                          weights.items()} == expected


def _load_best(trainer):
    """best.pt's weights into the model on every rank (the current ones where there is no best.pt);
    returns its path. Another model's file there is refused in one line."""
    best_path = trainer.checkpoints.best_path
    best, found = None, NO_BEST
    if trainer.strategy.is_main:
        if best_path.is_file():
            checkpoint = ckpt.load_checkpoint(best_path)
            best = ckpt.inference_weights(checkpoint) if isinstance(checkpoint, dict) else None
            found = BEST_FITS if _fits(best, trainer.model) else FOREIGN_BEST
        else:
            trainer.log.warn(f"{best_path} not found; reporting with the current weights")
    # Only rank 0 may see the file (other nodes); it tells every rank what it found, so they act together.
    found = trainer.strategy.max_ints([found])[0]
    if found == FOREIGN_BEST:
        raise UsageError(f"{best_path} holds no weights of this run's model (another run's file, or one put "
                         "there by hand); move it away and run the same command again")
    if found == BEST_FITS:
        trainer.strategy.load_from_rank0(trainer.model, best)
    return best_path


def report_best_weights(trainer, splits=("val", "test"), calibration=None):
    """Reload best.pt's weights and report the validation split (where there is one) and, unless
    --no-test, the test split, seen here for the first time; of those, the ones in `splits`.
    `calibration`: the temperature record ({"temperature", "windows"}) to judge by, fitted before on
    the validation people by the model chosen there (training/loop/refit.py). Returns the one this
    call fitted or was given (None without one)."""
    trainer.checkpoints.write_pending()  # still pending only where this invocation trained nothing
    best_path = _load_best(trainer)
    no_test = trainer.config.data.no_test
    splits = [split for split in splits if (split != "val" or trainer.has_validation)
              and (split != "test" or not no_test)]
    # Until the validation split gives one: 1, or the one given.
    temperature, fitted = (1.0, None) if calibration is None else (calibration["temperature"], calibration)
    if "val" not in splits and calibration is None and trainer.strategy.is_main:
        # An earlier run's temperature in this folder was fitted for other weights.
        (trainer.config.save_dir / CALIBRATION_FILE).unlink(missing_ok=True)
    for split in splits:
        started = time.perf_counter()
        labels, logits, loss = trainer.evaluate(split, trainer.strategy.eval_model(trainer.model))
        trainer.log.info(f"evaluated the {split} split ({len(labels)} windows) in "
                         f"{time.perf_counter() - started:.1f} s")
        probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
        if split == "val":
            # Written beside best.pt, where predict.py finds it.
            temperature = fit_temperature(probabilities, labels)
            fitted = {"temperature": temperature, "windows": len(labels)}
            where = "the run's validation split" + (" by the model chosen there, before the final model trained on "
                                                    "those people too" if trainer.refits else "")
            trainer.log.write_json(CALIBRATION_FILE, {**fitted, "checkpoint": best_path.name, "fitted_on": where})
        split_subjects = getattr(trainer.data, split).subjects
        in_order = split_subjects[gathered_order(len(split_subjects), trainer.strategy.world_size)]
        predictions = logits.argmax(axis=1)
        people, worst = per_subject_accuracy(labels, predictions, in_order)
        report = {**classification_report(labels, predictions, trainer.data.class_names), "loss": loss,
                  "checkpoint": str(best_path), "subjects": sorted(int(subject) for subject in set(split_subjects)),
                  "per_subject": people, "worst_subject": worst,
                  **calibration_fields(probabilities, labels, in_order, temperature)}
        trainer.log.write_json(f"{split}_report.json", report)
    if no_test:
        if "val" in splits or not trainer.has_validation:
            trainer.log.info("--no-test: the test split was not evaluated; " + (
                f"wrote {trainer.config.save_dir / 'val_report.json'}" if "val" in splits
                else "no validation split either (--val-fraction 0), so no report was written"))
        return fitted
    if "test" not in splits:
        return fitted
    chosen = ("final model: trained on every training person for the epochs validation chose"
              if trainer.state.refitted else "best checkpoint by validation macro-F1" if trainer.has_validation
              else "last epoch's weights: no validation split")
    trainer.log.info(f"test split ({chosen}):\n" + format_report(report) + "\n" + format_people(report) + "\n"
                     + format_calibration(report, fitted))
    trainer.log.info(f"wrote {trainer.config.save_dir / 'test_report.json'}")
    return fitted
