"""Build a window store (data/store.py) from raw labelled recordings, a UCI HAR layout or an .npz of windows.

python -m data.build_store SRC --out DIR [--workers N] [--dtype float16|float32] [--test-subjects 3,7]

SRC is one of:
- a folder of labelled recordings: CSV or .npz files as predict.py reads them (acc_x..acc_z in g,
  optional gyro_x..gyro_z in rad/s, optional time_s; or, with --preprocessing raw --channels, another
  device's columns of those names, taken as recorded), plus a `label` column (the --class-labels
  of the --class-names, 1..K unless given; values that mean no class, such as unlabelled stretches
  or transitions, only as named by --unlabelled: any other value is refused) and a `subject` column.
  Each file is brought to --sample-rate and cut into windows
  exactly as predict.py cuts a recording (--preprocessing uci-har: the UCI HAR filter chain and
  its nine channels; raw: acc and gyro as they are), every --stride samples;
- a UCI HAR layout (as --data-dir takes it): its windows, its train/test subjects;
- an .npz of windows as --dataset npz takes it: its windows, its split (or a fifth of the
  subjects held out for test, as training does).

Window labels (recordings): a window takes the label most of its samples carry; windows whose
most common label is an --unlabelled value are left out.
--description FILE (data/layout.py) says the channels, rate, window, classes with their label
values and the unlabelled values in one JSON file, in place of those flags; the manifest keeps it.
Each subject's windows (or each recording's, in a job named after its file) go into shards of
their own, written by --workers processes in parallel. Each finished job leaves a record beside
its shards (data/provenance.py): what it was made from (the recording's path, size and mtime and
the options that cut it, or the checksum of the subject's windows; the dtype) and each shard file's
size and checksum. The same command again reuses a job only when its record matches: a stopped
build continues, a recording added converts only that one, a damaged shard converts its job again,
and the files of recordings no longer there are removed. A finished store asked for other windows
(another --stride, --dtype, rate or preprocessing) is refused: remove its manifest to convert it in
place. The manifest, written last, makes the store usable: `python main.py --dataset store --data-dir DIR`.
"""
import argparse
import errno
import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from data import uci_har
from data.declared import MAX_WINDOW_STEPS, MIN_WINDOW_STEPS, RESERVED_CHANNELS, rate_problem
from data.errors import DataError, exit_from_command
from data.labelled_recordings import RecordingCut, recording_windows
from data.labels import class_indexes, classes_from_flags, whole_numbers
from data.layout import read_layout
from data.provenance import array_identity, check, file_identity, make_record, read_json, write_record
from data.sources import SOURCES, Source
from data.store import PARTS, SHARD_DIR, VERSION, finish_store, shard_paths
from data.store_folder import BuildFolder, check_same_store, check_store_folder, remove_job_files
from data.store_jobs import test_subjects_of
from outputs.safety import write_atomic

MAX_NAME_CHARACTERS = 120  # of a recording's file name in its job's name
SHARD_WINDOWS = 8_192  # windows per shard file at most (19 MB of float16 9 x 128 windows)
SHOWN_NAMES = 5  # recordings named in one line, then a count


def main(argv=None):
    options = parse(argv)
    source = Path(options.src)
    out = check_store_folder(Path(options.out))
    jobs, head = plan(source, options)
    head["source_path"] = str(source.resolve())
    check_same_store(out, {**head, "dtype": options.dtype})
    if head["test_subjects"] is not None:  # windows: their subjects are known before anything is written
        _check_split(head["test_subjects"], _windows_of_subjects(jobs), options.src)
    done, redo = reusable_jobs(jobs, out, options.dtype)
    todo = [job for job in jobs if done[job["name"]] is None]
    folder = BuildFolder(out)  # the first write, once everything that can be checked before it was
    print(f"{source}: {len(jobs)} job(s), {len(jobs) - len(todo)} already done; writing {out} with "
          f"{options.workers} process(es)", flush=True)
    if redo:  # finished once, but made from other inputs or damaged since: converted again
        shown = [f"{name} ({why})" for name, why in list(redo.items())[:3]]
        print(f"converting again {len(redo)} job(s) whose source, settings or files changed: "
              f"{', '.join(shown)}{' ...' if len(redo) > 3 else ''}", flush=True)
    made = {}
    try:
        convert(todo, out, options, made)
        records = [made.get(job["name"]) or done[job["name"]] for job in jobs]
        _report_empty_recordings(jobs, records, options)
        manifest = assemble_manifest(records, head, options)
    except DataError as exc:  # found while converting (a recording's labels, the test split): this build's jobs go
        taken_back = folder.take_back([name for name in made if name not in redo])
        raise DataError(f"{exc} ({taken_back})") from None
    except OSError as exc:  # the store's folder: full, or taken away while writing
        fix = "free space there" if exc.errno in (errno.ENOSPC, errno.EDQUOT) or exc.errno is None else \
            "make it writable"
        raise DataError(f"could not write the store in {out} ({exc.strerror or str(exc).splitlines()[0]}); {fix} "
                        "and run the same command again: the jobs finished so far are kept") from None
    finish_store(out, manifest)
    planned = {job["name"] for job in jobs}  # recordings removed or renamed: their files go, now unlisted
    removed = remove_job_files(out, lambda job: job not in planned)
    if removed:
        print(f"removed {removed} file(s) of jobs this source no longer has", flush=True)
    windows = sum(shard["windows"] for shard in manifest["shards"])
    layout = manifest["layout"]
    print(f"wrote {out}/manifest.json: {windows:,} windows of {len(layout['channels'])} x "
          f"{layout['window_steps']} ({manifest['dtype']}) in {len(manifest['shards'])} shards, "
          f"{len(manifest['subjects'])} subjects, test subjects {manifest['test_subjects']}")
    return 0


def reusable_jobs(jobs, out, dtype):
    """({job: its record where it matches and is reused, else None}, {job: why its record no longer
    matches}), each job's inputs set on it."""
    done, redo = {}, {}
    for job in jobs:
        job["inputs"] = job_inputs(job, dtype)
        record = read_json(out / SHARD_DIR / f"{job['name']}.json")  # None: the job runs (again)
        verdict = check(record and record.get("identity"), job["inputs"], out / SHARD_DIR)
        done[job["name"]] = record if verdict.matches else None
        if record is not None and not verdict.matches:
            redo[job["name"]] = verdict.describe(limit=1)
    return done, redo


def convert(todo, out, options, made):
    """Run the jobs in --workers processes, each finished job's record put in `made` as it arrives. The
    first failure cancels the jobs not yet started and waits for those running, so that `made` then
    names every job whose files this build wrote."""
    from tqdm import tqdm
    with ProcessPoolExecutor(max_workers=options.workers) as pool, tqdm(total=len(todo), unit="job") as bar:
        futures = [pool.submit(run_job, (job, str(out), options.dtype)) for job in todo]
        try:
            for future in as_completed(futures):
                record = future.result()
                made[record["name"]] = record
                bar.update(1)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            made.update((future.result()["name"], future.result()) for future in futures
                        if future.done() and not future.cancelled() and future.exception() is None)
            raise


def job_inputs(job, dtype):
    """What decides a job's shards, compared before its finished shards are reused: a recording's
    file (path, size, mtime: hashing a corpus on every run would cost a pass over it) and the
    options that cut it, or the checksum of a subject's windows already in memory; and the dtype."""
    if "recording" in job:
        source = {"recording": file_identity(job["recording"]), "options": job["options"]}
    else:
        source = {"windows": array_identity(job["signals"], job["labels"]), "subject": job["subject"]}
    return {**source, "dtype": dtype, "version": VERSION}


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m data.build_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", help="a folder of labelled recordings, a UCI HAR layout, or an .npz of windows")
    parser.add_argument("--out", required=True, help="the store's folder (created; an unfinished build continues)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes converting in parallel")
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                        help="how signals are stored (float16 halves the disk and the reads)")
    parser.add_argument("--test-subjects", default=None,
                        help="recordings, or an .npz without 'split': comma-separated subjects for the test split "
                             "(default: a fifth held out)")
    parser.add_argument("--description", default=None,
                        help="a JSON file describing the data (data/layout.py: channels, rate, window, classes "
                             "and their label values, values meaning no class) in place of the flags below; a flag "
                             "given beside it must agree with it")
    parser.add_argument("--preprocessing", choices=("uci-har", "raw"), default=None, help="default uci-har")
    parser.add_argument("--channels", default=None,
                        help="recordings of another device: its channels' column names, comma-separated, kept "
                             "as recorded and resampled to --sample-rate (needs --preprocessing raw)")
    parser.add_argument("--sample-rate", type=float, default=None,
                        help=f"recordings: the model's rate (default {uci_har.SAMPLE_RATE_HZ:g}); an .npz without "
                             "sample_rate_hz: its windows' rate")
    parser.add_argument("--window-steps", type=int, default=None, help=f"default {uci_har.WINDOW_STEPS}")
    parser.add_argument("--stride", type=int, default=None, help="recordings: window stride (default half a window)")
    parser.add_argument("--class-names", default=None,
                        help="recordings: the classes, in the order of --class-labels (default UCI HAR's six)")
    parser.add_argument("--class-labels", default=None,
                        help="recordings: each class's value in the label column, comma-separated (default 1..K)")
    parser.add_argument("--unlabelled", default=None,
                        help="recordings: label values that mean no class, comma-separated (default none: "
                             "every value must be a class's)")
    return check_options(parser.parse_args(argv))


def check_options(options):
    """Options that cannot make a store the trainer reads, refused before any file is touched; the
    test subjects and class names read into lists."""
    options.described = _apply_description(options) if options.description else None
    defaults = {"preprocessing": "uci-har", "window_steps": uci_har.WINDOW_STEPS,
                "class_names": ",".join(uci_har.CLASS_NAMES), "unlabelled": ""}
    for name, value in defaults.items():
        if getattr(options, name) is None:
            setattr(options, name, value)
    for flag, value, low, high in (("--workers", options.workers, 1, math.inf),
                                   ("--window-steps", options.window_steps, MIN_WINDOW_STEPS, MAX_WINDOW_STEPS),
                                   ("--stride", options.stride, 1, options.window_steps)):  # predict.py's bounds
        if value is not None and not low <= value <= high:
            raise DataError(f"{flag} must be " + (f"at least {low}" if high == math.inf else
                                                  f"between {low} and {high:,}") + f", got {value}")
    if options.sample_rate is not None and rate_problem(options.sample_rate):
        raise DataError(f"--sample-rate must be {rate_problem(options.sample_rate)}, got {options.sample_rate:g}")
    try:
        options.test_subjects = [int(s) for s in (options.test_subjects or "").split(",") if s.strip()]
    except ValueError:
        raise DataError(f"--test-subjects takes subject numbers such as 3,7; got {options.test_subjects!r}") from None
    options.channels = _channel_names(options.channels, options.preprocessing)
    options.class_names, options.class_labels = classes_from_flags(options.class_names, options.class_labels)
    options.unlabelled = whole_numbers("--unlabelled", options.unlabelled)
    class_indexes([], options.class_labels, options.unlabelled, "--class-labels and --unlabelled",
                  "give each value once")
    return options


def _apply_description(options):
    """The description's fields in place of the flags that say the same (a flag given must agree):
    its channels are read by name as recorded (--preprocessing raw)."""
    described = read_layout(options.description)
    # Labels that are names are an .npz's (plan() refuses them for recordings, whose label column holds numbers).
    numbered = described.labels_are_numbers()
    said = {"channels": ",".join(described.channels), "sample_rate": described.sample_rate_hz,
            "window_steps": described.window_steps, "stride": described.stride_steps,
            "class_names": ",".join(described.class_names),
            "class_labels": ",".join(map(str, described.class_labels)) if numbered else None,
            "unlabelled": ",".join(map(str, described.unlabelled)) if numbered else None, "preprocessing": "raw"}
    for name, value in said.items():
        given = getattr(options, name)
        if given is not None and value is not None and _flag_items(given) != _flag_items(value):
            raise DataError(f"--{name.replace('_', '-')} {given} disagrees with {described.where}, which says "
                            f"{value}: drop the flag")
        if value is not None:
            setattr(options, name, value)
    return described


def _flag_items(value):
    """What a flag's value says: its comma-separated items, or a number."""
    return tuple(item.strip() for item in value.split(",")) if isinstance(value, str) else float(value)


def _channel_names(text, preprocessing):
    """--channels as a tuple of distinct column names (None when not given)."""
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(","))
    if preprocessing != "raw":
        raise DataError("--channels names another device's columns, taken as recorded: add --preprocessing raw")
    reserved = [name for name in names if name in RESERVED_CHANNELS]
    if not all(names) or len(set(names)) < len(names) or reserved:
        others = f"{', '.join(RESERVED_CHANNELS[:-1])} and {RESERVED_CHANNELS[-1]}"
        raise DataError(f"--channels must name distinct columns other than {others}, comma-separated (such as "
                        f"ankle_x,ankle_y,ankle_z); got {text!r}")
    return names


def plan(path, options):
    """(jobs, the manifest's head: store_jobs.manifest_head) of the source at `path`: the first kind of data
    (data/sources/) that claims it and has the converter's jobs for it (an .npz of windows, a UCI HAR layout, a
    folder of recordings)."""
    for source in SOURCES.values():
        if source.claims(path) and (planned := source.store_jobs(path, options)) is not None:
            return planned
    kinds = ", ".join(source.about for source in SOURCES.values() if type(source).store_jobs is not Source.store_jobs)
    raise DataError(f"{path} is none of the sources the converter takes: {kinds}")


def run_job(arguments):
    """One job in a worker process: its windows into shard files, then a record of them and of what
    they were made from."""
    job, out, dtype = arguments
    if "recording" in job:
        signals, labels, subject, cut = recording_windows(job["recording"], RecordingCut(**job["options"]))
    else:
        signals, labels, subject, cut = job["signals"], job["labels"], job["subject"], len(job["labels"])
    shards, stored = [], signals.astype(dtype)
    _check_finite(signals, stored, job.get("recording") or f"subject {subject}", dtype)
    total, total_sq = np.zeros(stored.shape[1]), np.zeros(stored.shape[1])
    for part, first in enumerate(range(0, len(labels), SHARD_WINDOWS)):
        name = f"{job['name']}-{part:03d}"
        chunk = slice(first, first + SHARD_WINDOWS)
        _write_shard(out, name, stored[chunk], labels[chunk])
        shards.append({"name": name, "windows": len(labels[chunk]), "subject": subject})
        exact = stored[chunk].astype(np.float64)  # the statistics of what the store holds, a shard at a time
        total += exact.sum(axis=(0, 2))
        total_sq += (exact ** 2).sum(axis=(0, 2))
    files = [shard_paths("", shard["name"])[part].name for shard in shards for part in PARTS]
    identity = make_record(job["inputs"], Path(out) / SHARD_DIR, files)
    for shard in shards:  # the manifest carries each signal file's checksum
        shard["sha256"] = identity["outputs"][shard_paths("", shard["name"])["signals"].name]["sha256"]
    record = {"name": job["name"], "subject": subject, "shards": shards, "windows": len(labels), "cut_windows": cut,
              "sum": total.tolist(), "sum_sq": total_sq.tolist(),
              "steps": int(stored.shape[0] * stored.shape[2]) if len(stored) else 0, "identity": identity}
    write_record(Path(out) / SHARD_DIR / f"{job['name']}.json", record)
    return record


def _check_finite(signals, stored, where, dtype):
    """Refuse windows that are not finite as stored (NaN in the source, or beyond float16's range),
    naming the first one: training on them would give a NaN loss much later."""
    bad = ~np.isfinite(stored)
    if not bad.any():
        return
    window, channel, step = (int(i) for i in np.argwhere(bad)[0])
    raw = float(signals[window, channel, step])
    why = (f"{raw:g} is beyond {dtype}'s range; use --dtype float32" if np.isfinite(raw)
           else "fix or drop those samples in the source")
    raise DataError(f"{where}: {int(bad.any(axis=(1, 2)).sum())} window(s) hold values that are not finite as "
                    f"{dtype}, the first window {window} (channel {channel}, step {step}); {why}")


def assemble_manifest(records, head, options):
    """The manifest from every job's record: shards, subjects, test subjects, and the normalisation
    statistics of the training subjects' windows (summed per job while they were written)."""
    subjects = _windows_of_subjects(records)
    test = head["test_subjects"]
    if test is None:  # recordings: the subjects asked for, else a fifth of those with windows held out
        if options.test_subjects:
            test = sorted(options.test_subjects)
        else:
            having = [subject for subject, count in sorted(subjects.items()) if count]
            test = test_subjects_of(np.array(having), options.src).tolist()
    _check_split(test, subjects, options.src)
    training = [record for record in records if record["subject"] not in test and record["steps"]]
    steps = sum(record["steps"] for record in training)
    mean = np.sum([record["sum"] for record in training], axis=0) / steps
    variance = np.sum([record["sum_sq"] for record in training], axis=0) / steps - mean ** 2
    std = np.maximum(np.sqrt(np.maximum(variance, 0.0)), 1e-6)
    return {**head, "test_subjects": [int(s) for s in test], "dtype": options.dtype,
            "shards": [shard for record in records for shard in record["shards"]],
            # A subject whose recordings gave no window has no shard: the store, like its shards, lacks it.
            "subjects": {str(subject): count for subject, count in sorted(subjects.items()) if count},
            "normalization": {"mean": mean.tolist(), "std": std.tolist(),
                              "over": "every window of the training subjects, validation ones included"}}


def _windows_of_subjects(parts):
    """{subject: windows} of jobs of windows (their labels) or of finished jobs' records (their counts)."""
    subjects = {}
    for part in parts:
        count = part["windows"] if "windows" in part else len(part["labels"])
        subjects[part["subject"]] = subjects.get(part["subject"], 0) + count
    return subjects


def _check_split(test, subjects, source):
    """The trainer refuses a store whose test subjects it lacks, whose test split is empty or that has
    no training window: so does the build (before it writes, where the source names its subjects)."""
    having = [str(subject) for subject, count in sorted(subjects.items()) if count]
    listed = ",".join(having[:10]) + (" ..." if len(having) > 10 else "")
    if not (set(test) <= set(subjects) and sum(subjects[subject] for subject in test)):
        raise DataError(f"{source}: test subjects {','.join(map(str, test)) or '(none)'} would leave the test split "
                        f"empty or name subjects it lacks; give --test-subjects among the subjects with windows "
                        f"({listed})")
    if not any(count for subject, count in subjects.items() if subject not in test):
        raise DataError(f"{source}: no training windows: every subject with windows ({listed}) is a test subject; "
                        "name fewer with --test-subjects")


def _report_empty_recordings(jobs, records, options):
    """Say in one line which recordings gave no window (shorter than one window, or no window of a
    class), and refuse when none gave any."""
    empty = {}
    for job, record in zip(jobs, records, strict=True):
        if "recording" in job and not record["windows"]:
            cut = record.get("cut_windows")  # None: converted by a build that did not count them
            reason = (f"shorter than one window ({options.window_steps} steps at {options.sample_rate:g} Hz)"
                      if cut == 0 else "with no window of a class (each one's label means no class)" if cut else "")
            empty.setdefault(reason, []).append(Path(job["recording"]).name)
    said = "; ".join(f"{_first_names(names)} {reason}".strip() for reason, names in empty.items())
    count = sum(map(len, empty.values()))
    if count and count == len(jobs):
        raise DataError(f"{options.src}: no recording gave a window: {said}")
    if count:
        print(f"left out {count} of {len(jobs)} recordings, which gave no window: {said}", flush=True)


def _first_names(names):
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")


def _write_shard(out, name, signals, labels):
    for part, array in (("signals", signals), ("labels", labels.astype(np.int8))):
        write_atomic(shard_paths(out, name)[part], lambda partial, array=array: np.save(partial, array))


if __name__ == "__main__":
    exit_from_command(main)
