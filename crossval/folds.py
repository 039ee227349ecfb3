"""Subject-wise cross-validation: K folds of whole training subjects, one ordinary run per fold.

Each fold is a normal training run in <save-dir>/fold-k/ validated on its fold's subjects, so it
writes, resumes and reports like any run. With --refit one more run, <save-dir>/refit/, trains on
every training subject with no hold-out for the same --epochs: the schedule and the weight
average make the last epoch a sound choice, so it needs nothing from the folds and runs beside
them. With --ensemble, rank 0 then joins the folds' best weights (and the refit's) into one
<save-dir>/ensemble.pt and reports it on the test split in <save-dir>/test_report.json. Folds (and
the refit) are independent jobs: under torchrun each process takes every
world_size-th job on its own GPU, which is how several GPUs help a model this small; rank 0 then
writes cv_report.json, prints the table and draws the pooled confusion.
"""
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from data.provenance import check, file_identity, make_record, read_json, read_record, write_record
from data.sources import load_har_data, source_for
from evaluation.figures import plot_confusion_matrix
from evaluation.metrics import best_record, format_cv_table, format_people, format_report
from inference.bundle import load_bundle
from inference.ensemble import ENSEMBLE_FILE, write_ensemble
from inference.evaluate import write_report
from outputs.safety import OutputRefused, check_output_folder, make_folder, write_atomic
from training.checkpoint.earlier_run import earlier_run_files, move_aside
from training.checkpoint.files import BEST, LAST, load_checkpoint
from training.checkpoint.format import SavedRun
from training.checkpoint.judge import differing_flags, meant_flags, trained_to_the_end
from training.config.settings import Hardware, Output, Parallel, RunConfig
from training.distributed.ddp import join_process_group
from training.distributed.strategy import distributed_env, resolve_device_type
from training.errors import SAME_ON_EVERY_RANK, UsageError
from training.loop.recipe import fit_augment_to_data
from training.run_inputs import SaveDirLock
from training.trainer import train

REPORT = "cv_report.json"
IDENTITY = "cv_identity.json"  # in each job's folder once it finished: what trained it, what it wrote
FOLD_READS = (BEST, "val_report.json", "test_report.json", "metrics.jsonl")  # what the summary and ensemble read
REFIT_DIR = "refit"
FOLDS_FILE = "cv_folds.json"  # the folds this folder's runs were trained with
FOLD_REPORT = "val_report.json"  # what a finished fold run leaves: its best weights on its fold
RANKS_WAIT = datetime.timedelta(days=7)  # ranks that finish first wait for the slowest fold


def _fitted_to_data(config, data):
    """The config without the augmentations this data cannot take, said here once rather than by
    every fold; a class flag naming a class the data lacks is refused."""
    changes, dropped = fit_augment_to_data(config.recipe, data.channel_names, data.class_names, data.sensor_triples(),
                                           data.padded)
    if dropped:
        print(f"warning: {dropped}", file=sys.stderr, flush=True)
    return config.replace(**changes)


def fold_subjects(subjects, folds, seed):
    """Shuffle the distinct subjects with `seed` and deal them into `folds` nearly equal groups."""
    unique = np.unique(subjects)
    if folds > len(unique):
        raise UsageError(f"--cv-folds {folds} is more than the {len(unique)} training subjects; use at most "
                         f"{len(unique)}")
    shuffled = np.random.default_rng(seed).permutation(unique)
    return [sorted(int(s) for s in group) for group in np.array_split(shuffled, folds)]


def cross_validate(config):
    """Run (or resume) this process's folds, then summarise on rank 0. Returns an exit code."""
    if config.output.resume not in ("auto", None):
        raise UsageError("--resume PATH names one checkpoint, but each fold resumes from its own "
                         "fold-k/last.pt; drop --resume (or pass --no-resume to start every fold over)")
    if config.parallel.multi_gpu == "dp":
        raise UsageError("--cv-folds runs each fold on one device; use --multi-gpu ddp under torchrun to "
                         "run folds on several GPUs at once")
    save_dir = config.save_dir
    data = load_har_data(**config.data_options())
    config = _fitted_to_data(config, data)  # before --no-resume clears any fold
    training_subjects = np.concatenate([data.train.subjects, data.val.subjects])
    folds = fold_subjects(training_subjects, config.recipe.cv_folds, config.optim.seed)
    rank, local_rank, world_size = distributed_env()
    _claim_folder(save_dir, folds, fresh=config.output.resume is None, writer=rank == 0)
    resume = config.output.resume is not None
    jobs = [_job(config, save_dir, folds, job, local_rank) for job in range(len(folds) + int(config.recipe.refit))]
    # Every rank checks every job, so a refusal reads the same on all of them before any trains.
    sources = data_sources(config)
    verdicts = [_verdict(job_config, sources) if resume else None for _, _, job_config, _ in jobs]
    for (label, _, job_config, _), verdict in zip(jobs, verdicts, strict=True):
        if verdict is not None and verdict.changed:
            raise UsageError(f"{job_config.output.save_dir} holds a finished {label} trained with other settings or "
                             f"data: {verdict.describe()}; use another --save-dir, or pass --no-resume to train every "
                             "fold again")
    code, finished = 0, True
    for job in range(rank, len(jobs), world_size):
        (label, about, job_config, done), verdict = jobs[job], verdicts[job]
        run_dir = Path(job_config.output.save_dir)
        if verdict is not None and verdict.matches:
            print(f"{label} already finished ({about}); skipping", flush=True)
            continue
        if verdict is None or verdict.damaged:
            # --no-resume, or a finished job whose files changed since: that job alone starts over.
            if verdict is not None:
                print(f"{label}: {verdict.describe()} (damaged since it finished?); training it again from the "
                      "start", flush=True)
            _start_over(run_dir)
        (run_dir / IDENTITY).unlink(missing_ok=True)  # counts as finished again only once it is
        print(f"\n=== {label}: {about} -> {job_config.output.save_dir}", flush=True)
        try:
            code = train(job_config)
        except SAME_ON_EVERY_RANK as exc:
            exc.this_rank_only = True  # other ranks run other jobs: this rank must say it itself
            raise
        if code != 0 or not done(job_config):
            # Preempted, or paused by --stop-after-epochs: the same command continues at this job.
            print(f"{label} is not finished; run the same command again to continue it", flush=True)
            finished = False
            break
        write_record(run_dir / IDENTITY, make_record(run_inputs(job_config, sources), run_dir,
                                                     [name for name in FOLD_READS if (run_dir / name).is_file()]))
    if world_size > 1:
        # Every rank gets here, finished or not, so none waits for a rank that has already left.
        finished = _all_ranks_finished(rank, world_size, finished)
    if rank == 0 and finished:
        ensemble = _write_ensemble(config, save_dir, folds, data) if config.recipe.ensemble else None
        _write_summary(save_dir, folds, data.class_names, config, ensemble)
    return code


# Settings that change where and how fast a job runs, not the model it trains: a finished fold
# stays finished when only these differ. --no-test too: a fold's test report is an extra; and
# --ensemble, which acts after the folds (folds recorded before it was cleared from theirs still match).
NOT_THE_MODEL = (*(f.metadata.get("flag", f.name) for group in (Parallel, Hardware, Output)
                   for f in dataclasses.fields(group)), "no_test", "ensemble")


def run_inputs(job_config, sources):
    """What decides a job's model: every setting but NOT_THE_MODEL, each as what it means (the resume
    judge's meant_flags), and the data files' identity."""
    settings = {flag: value for flag, value in meant_flags(job_config).items() if flag not in NOT_THE_MODEL}
    return {**{f"--{flag.replace('_', '-')}": value for flag, value in settings.items()}, **sources}


def data_sources(config):
    """The files the run's data is read from, each by its size and checksum (cheap next to training;
    a store by its manifest, which holds its shards' checksums, and its labels)."""
    data_dir = config.data.data_dir
    # The generated data's settings are the whole of it: it has no files.
    paths = source_for(config.data.dataset, data_dir).identity_files(data_dir) if data_dir else []
    return {f"data file {path.name}": file_identity(path, checksum=True) for path in paths}


def _verdict(job_config, sources):
    run_dir = Path(job_config.output.save_dir)
    record = read_record(run_dir / IDENTITY)
    if record is None:
        return check(None, {}, run_dir)
    # Compared as the resume judge compares: a setting counts as changed only when its value means
    # something else (differing_flags); what an older record lacks counts as unchanged, and a flag that
    # joined NOT_THE_MODEL since no longer counts.
    recorded = {key[2:].replace("-", "_"): value for key, value in record["inputs"].items() if key.startswith("--")}
    settings = [flag for flag in job_config.flags() if flag not in NOT_THE_MODEL]
    then = meant_flags(RunConfig.from_flags({**job_config.flags(), **recorded}))
    now = run_inputs(job_config, sources)
    record["inputs"] = {**{key: value for key, value in now.items() if key.startswith("--")},
                        **{f"--{flag.replace('_', '-')}": then[flag] for flag in
                           differing_flags(recorded, job_config, settings)},
                        **{key: value for key, value in record["inputs"].items() if not key.startswith("--")}}
    return check(record, {key: value for key, value in now.items() if key in record["inputs"]}, run_dir)


def _write_ensemble(config, save_dir, folds, data):
    """ensemble.pt of the folds' best.pt (and the refit's) and, unless --no-test, its test report in
    the run's folder; returns what cv_report.json says of it."""
    members = [save_dir / f"fold-{fold}" / BEST for fold in range(len(folds))]
    if config.recipe.refit:
        members.append(save_dir / REFIT_DIR / BEST)
    path = write_ensemble(members, save_dir / ENSEMBLE_FILE, config.flags())
    about = {"path": str(path), "members": [str(member.relative_to(save_dir)) for member in members]}
    print(f"wrote {path}: {len(members)} models averaging their probabilities", flush=True)
    if config.data.no_test:
        return about
    bundle = load_bundle(path)
    device = torch.device(resolve_device_type(config.hardware.device))
    report = write_report(bundle, data.test, device, save_dir, "test split, fold ensemble",
                          {"checkpoint": str(path), "split": "test", "data": data.description},
                          figure=config.output.figures)
    print(f"test split, the ensemble:\n{format_report(report)}\n{format_people(report)}", flush=True)
    return {**about, "test_accuracy": report["accuracy"], "test_macro_f1": report["macro_f1"],
            "worst_subject": report["worst_subject"]}


def _claim_folder(save_dir, folds, fresh, writer):
    """Record the folds in <save-dir>/cv_folds.json, and refuse a folder whose folds differ: resuming a
    fold trained with other validation subjects would leak them into its training set."""
    record = save_dir / FOLDS_FILE
    # Found only after every fold has trained, were they not looked for now.
    check_output_folder(save_dir, "--save-dir", writer="the cross-validation",
                        files=(FOLDS_FILE, REPORT, ENSEMBLE_FILE, "test_report.json", "cv_confusion_matrix.png"),
                        folders=[f"fold-{fold}" for fold in range(len(folds))] + [REFIT_DIR])
    single = [name for name in (LAST, BEST, "metrics.jsonl") if (save_dir / name).exists()]
    if single and not record.exists():
        # Its report and figures would be written over by the ensemble's, which a single run's
        # folder check (moving them aside) never sees.
        raise UsageError(f"{save_dir} holds a single run ({single[0]}), not a cross-validation; give the "
                         "cross-validation another --save-dir")
    recorded = read_json(record) if record.is_file() and not fresh else folds
    if recorded is None:
        raise UsageError(f"{record} cannot be read (damaged?), so the folds this folder was trained with are "
                         "unknown; restore it, or pass --no-resume to start every fold over")
    if recorded != folds:
        raise UsageError(f"{save_dir} holds a cross-validation with other folds ({record}); a different "
                         "--seed, --cv-folds or data changes them. Use another --save-dir, or --no-resume "
                         "to start every fold over")
    if writer:
        make_folder(save_dir, "--save-dir")
        write_atomic(record, lambda partial: Path(partial).write_text(json.dumps(folds)))


def _write_summary(save_dir, folds, class_names, config, ensemble=None):
    summary = summarise(save_dir, folds, class_names, use_test=not config.data.no_test, refit=config.recipe.refit)
    if ensemble is not None:
        summary["ensemble"] = ensemble
    (save_dir / REPORT).write_text(json.dumps(summary, indent=2))
    print(format_cv_table(summary), flush=True)
    written = [save_dir / REPORT]  # and the figure, once it is drawn
    if config.output.figures:
        try:
            plot_confusion_matrix(summary["pooled_confusion_matrix"], summary["class_names"],
                                  save_dir / "cv_confusion_matrix.png", title="held-out folds, pooled")
            written.append(save_dir / "cv_confusion_matrix.png")
        except Exception as exc:  # noqa: BLE001 - a picture must never fail the run
            print(f"warning: could not draw the confusion matrix ({exc})", flush=True)
    print(f"wrote {' and '.join(str(path) for path in written)}", flush=True)


def _job(config, save_dir, folds, job, local_rank):
    """(label, what it trains on, its settings, a test that it is finished) of job number `job`: a
    fold, or after the folds the refit."""
    if job == len(folds):
        return ("refit", "every training subject, no validation",
                _fold_config(config, save_dir, None, None, local_rank), _refit_finished)
    return (f"fold {job + 1}/{len(folds)}", f"validating on subjects {folds[job]}",
            _fold_config(config, save_dir, job, folds[job], local_rank),
            lambda fold_config: _fold_finished(fold_config.output.save_dir, folds[job]))


def _start_over(run_dir):
    """Move a job's earlier outputs into its folder's previous-N/ to train it again, as a single run's
    --no-resume does, holding its lock while they move: a run training there now (another command on
    the same --save-dir) is refused in one line, and its folder kept. The user's own files stay, and
    the feature pool stays for the new run to reuse if it still fits."""
    if not run_dir.is_dir():
        return
    try:
        lock = SaveDirLock(run_dir).acquire()
    except (UsageError, OutputRefused) as exc:
        exc.this_rank_only = True  # under torchrun each rank clears its own jobs' folders
        raise
    try:
        move_aside(run_dir, earlier_run_files(run_dir), lambda line: print(line, flush=True))
    finally:
        lock.release()


def _refit_finished(refit_config):
    """Done once its last checkpoint trained every epoch its run plans (one for a head solved by
    ridge) or stopped early, and, unless --no-test, its test report is written. The checkpoint, not
    metrics.jsonl's last line: a run killed between a save and that epoch's line keeps the one alone."""
    run_dir = Path(refit_config.output.save_dir)
    try:
        saved = SavedRun.of(load_checkpoint(run_dir / LAST))
    except UsageError:  # none yet, or damaged: the refit goes on (and resumes where it can)
        return False
    return (saved is not None and saved.has_flags and trained_to_the_end(saved)
            and (refit_config.data.no_test or (run_dir / "test_report.json").is_file()))


def _fold_config(config, save_dir, fold, subjects, local_rank):
    """The settings of one fold's run (fold None: the refit, on every training subject): a
    single-device run on this process's GPU, in its own folder."""
    gpu_ids = config.hardware.gpu_ids
    if resolve_device_type(config.hardware.device) == "cuda":
        visible = gpu_ids or list(range(torch.cuda.device_count()))
        if local_rank >= len(visible):
            raise UsageError(f"local rank {local_rank} has no GPU: {len(visible)} in use on this node; "
                             "start at most one process per GPU")
        gpu_ids = [visible[local_rank]]
    # A plain one-process run: none of the cross-validation's or the launch's own flags, so that its
    # config.yaml repeats it with main.py --config.
    alone = {"cv_folds": 0, "refit": False, "ensemble": False, "multi_gpu": "none", "gpu_ids": gpu_ids,
             "backend": "auto", "nproc_per_node": None}
    if fold is None:
        return config.replace(val_subjects=None, val_fraction=0.0, save_dir=str(save_dir / REFIT_DIR), **alone)
    # A fold's validation people are its held-out estimate: its model never trains on them.
    return config.replace(val_subjects=subjects, final_model="validated", save_dir=str(save_dir / f"fold-{fold}"),
                          **alone)


def _fold_finished(fold_dir, subjects):
    """A fold is done once its run reported its best weights on these very subjects."""
    report = read_json(Path(fold_dir) / FOLD_REPORT)
    return isinstance(report, dict) and report.get("subjects") == subjects


def _all_ranks_finished(rank, world_size, finished):
    """True when every rank finished all its folds. A group over torchrun's store that lives only
    for this question; ranks that finish early wait here for the slowest fold."""
    join_process_group("gloo", rank, world_size, RANKS_WAIT, "har-cv")
    try:
        flag = torch.tensor([int(finished)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())
    finally:
        dist.destroy_process_group()


def summarise(save_dir, folds, class_names, use_test=True, refit=False):
    """cv_report.json's content from each fold's val_report.json and metrics.jsonl (and the refit's
    test report)."""
    rows, pooled, people = [], np.zeros((len(class_names), len(class_names)), dtype=np.int64), {}
    for fold, subjects in enumerate(folds):
        fold_dir = save_dir / f"fold-{fold}"
        report = json.loads((fold_dir / FOLD_REPORT).read_text())
        records = [json.loads(line) for line in (fold_dir / "metrics.jsonl").read_text().splitlines() if line]
        best = best_record(records)
        row = {"fold": fold, "subjects": subjects, "best_epoch": best["epoch"], "epochs_run": len(records),
               "val_accuracy": report["accuracy"], "val_macro_f1": report["macro_f1"],
               "val_windows": report["num_samples"],
               # The best epoch was chosen on this very fold, which flatters it a little; the last
               # epoch's figure involves no choice.
               "last_epoch_val_accuracy": records[-1]["val_acc"],
               "last_epoch_val_macro_f1": records[-1]["val_macro_f1"]}
        test_path = fold_dir / "test_report.json"
        if use_test and test_path.is_file():  # not an older run's report under --no-test
            test = json.loads(test_path.read_text())
            row.update(test_accuracy=test["accuracy"], test_macro_f1=test["macro_f1"])
        rows.append(row)
        pooled += np.asarray(report["confusion_matrix"], dtype=np.int64)
        people.update(report.get("per_subject", {}))  # each person is validated in one fold only
    summary = {"folds": rows, "class_names": list(class_names)}
    for name, pick in (("mean", np.mean), ("std", np.std)):
        summary[name] = {"accuracy": float(pick([r["val_accuracy"] for r in rows])),
                         "macro_f1": float(pick([r["val_macro_f1"] for r in rows]))}
    worst = min(rows, key=lambda r: r["val_accuracy"])  # one fold's figures, not minima from two folds
    summary["worst"] = {"accuracy": worst["val_accuracy"], "macro_f1": worst["val_macro_f1"], "fold": worst["fold"]}
    summary["last_epoch_mean"] = {"accuracy": float(np.mean([r["last_epoch_val_accuracy"] for r in rows])),
                                  "macro_f1": float(np.mean([r["last_epoch_val_macro_f1"] for r in rows]))}
    if all("test_accuracy" in r for r in rows):
        summary["test_mean"] = {"accuracy": float(np.mean([r["test_accuracy"] for r in rows])),
                                "macro_f1": float(np.mean([r["test_macro_f1"] for r in rows]))}
    if refit:
        summary["refit"] = {"save_dir": str(save_dir / REFIT_DIR)}
        refit_test = save_dir / REFIT_DIR / "test_report.json"
        if use_test and refit_test.is_file():
            test = json.loads(refit_test.read_text())
            summary["refit"].update(test_accuracy=test["accuracy"], test_macro_f1=test["macro_f1"])
    if people:
        summary["per_subject"] = dict(sorted(people.items(), key=lambda item: int(item[0])))
        summary["worst_subject"] = min(people, key=lambda subject: people[subject]["accuracy"])
    summary["pooled_accuracy"] = float(np.trace(pooled) / max(1, pooled.sum()))
    summary["pooled_confusion_matrix"] = pooled.tolist()
    return summary
