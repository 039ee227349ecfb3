"""What the generalisation recipe adds around the loop: the batch augmenter and the weight average a
run trains with, and the reports of the best weights on the validation and test subjects."""
from data.augment import BatchAugmenter, sensor_triples
from training.checkpoint import files as ckpt
from training.config.cli import augment_config
from training.loop.ema import WeightAverage
from training.loop.step import predict
from training.reporting.report import classification_report, format_report


def generalisation_aids(run, checkpoint):
    """The batch augmenter and the weight average the flags ask for (None when off)."""
    recipe = run.config.recipe
    augment = None
    kinds = augment_config(recipe)
    if kinds is not None and "rotate" in kinds.kinds and not sensor_triples(run.data.channel_names):
        run.log.warn("these channels have no x/y/z triples to rotate; augmenting without 'rotate'")
        kinds.kinds = tuple(kind for kind in kinds.kinds if kind != "rotate")
    if kinds is not None and kinds.kinds:
        augment = BatchAugmenter(kinds, run.normalization["mean"], run.normalization["std"],
                                 run.data.channel_names).to(run.strategy.device)
    ema = None
    if recipe.ema_decay > 0:
        ema = WeightAverage(run.model, recipe.ema_decay)
        if checkpoint is not None and checkpoint.get("ema"):
            ema.load_state(checkpoint["ema"])
        elif checkpoint is not None:
            run.log.info("the checkpoint has no weight average: it starts from the resumed weights")
    return augment, ema


def final_reports(run):
    """Reload the best weights and report the validation split and, unless --no-test, the test
    split, seen here for the first time."""
    best_path = run.save_dir / ckpt.BEST
    if run.strategy.is_main:
        if best_path.is_file():
            run.model.load_state_dict(ckpt.inference_weights(ckpt.load_checkpoint(best_path)))
        else:
            run.log.warn(f"{best_path} not found; reporting with the current weights")
    run.strategy.broadcast_module(run.model)  # ranks on other nodes may not see rank 0's files
    splits = ("val",) if run.config.data.no_test else ("val", "test")
    for split in splits:
        labels, predictions, loss = predict(run.strategy.eval_model(run.model), run.loaders[split],
                                            run.strategy, run.precision)
        subjects = sorted(int(subject) for subject in set(getattr(run.data, split).subjects))
        report = {**classification_report(labels, predictions, run.data.class_names), "loss": loss,
                  "checkpoint": str(best_path), "subjects": subjects}
        run.log.write_json(f"{split}_report.json", report)
    if run.config.data.no_test:
        run.log.info(f"--no-test: the test split was not evaluated; wrote {run.save_dir / 'val_report.json'}")
        return
    run.log.info("test split (best checkpoint by validation macro-F1):\n" + format_report(report))
    run.log.info(f"wrote {run.save_dir / 'test_report.json'}")
