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
--description FILE (data/description.py) says the channels, rate, window, classes with their label
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
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from data import uci_har
from data.description import read_description
from data.errors import DataError, exit_from_command, not_a_file
from data.labels import class_indexes, classes_from_flags, whole_numbers
from data.npz_windows import load_npz_windows
from data.preprocess import available_channels, cut_windows, own_channels, stream_channels, window_starts
from data.provenance import array_identity, check, file_identity, make_record, read_json, write_record
from data.recordings import read_recording
from data.resample import on_model_clock, values_on_model_clock
from data.splits import NPZ_TEST_FRACTION, NPZ_TEST_SEED, hold_out_subjects
from data.store import (
    FORMAT,
    LABELS,
    MANIFEST,
    PARTS,
    SHARD_DIR,
    VERSION,
    finish_store,
    is_partial_write,
    shard_paths,
    write_atomic,
)

# A window of 2^16 samples is 22 minutes at 50 Hz, far past any activity's; beyond, one window's
# arrays would be sized without bound (1e20 failed inside numpy).
MAX_WINDOW_STEPS = 2 ** 16
# What makes a store's windows what they are: a finished store asked for other values of these is refused.
STORE_SETTINGS = ("channels", "class_names", "label_rule", "sample_rate_hz", "window_steps", "stride_steps",
                  "preprocessing", "dtype", "description")
MAX_NAME_CHARACTERS = 120  # of a recording's file name in its job's name
SHARD_WINDOWS = 8_192  # windows per shard file at most (19 MB of float16 9 x 128 windows)
JOB_FILE = re.compile(rf"(.*)\.json|(.*)-[^-]*\.(?:{'|'.join(PARTS)})\.npy", re.DOTALL)


def main(argv=None):
    options = parse(argv)
    source = Path(options.src)
    out = check_store_folder(Path(options.out))
    jobs, layout = plan(source, options)
    layout["source_path"] = str(source.resolve())
    check_same_store(out, {**layout, "dtype": options.dtype})
    try:
        (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"--out {out} cannot be created ({exc.strerror or exc}); give a folder you can write") from None
    done, redo = {}, []
    for job in jobs:
        job["inputs"] = job_inputs(job, options.dtype)
        record = read_json(out / SHARD_DIR / f"{job['name']}.json")  # None: the job runs (again)
        verdict = check(record and record.get("identity"), job["inputs"], out / SHARD_DIR)
        done[job["name"]] = record if verdict.matches else None
        if record is not None and not verdict.matches:
            redo.append(f"{job['name']} ({verdict.describe(limit=1)})")
    todo = [job for job in jobs if done[job["name"]] is None]
    removed = remove_stale_files(out, jobs)
    print(f"{source}: {len(jobs)} job(s), {len(jobs) - len(todo)} already done; writing {out} with "
          f"{options.workers} process(es)", flush=True)
    if redo:  # finished once, but made from other inputs or damaged since: converted again
        print(f"converting again {len(redo)} job(s) whose source, settings or files changed: "
              f"{', '.join(redo[:3])}{' ...' if len(redo) > 3 else ''}", flush=True)
    if removed:
        print(f"removed {removed} file(s) of jobs this source no longer has", flush=True)
    from tqdm import tqdm
    try:
        with ProcessPoolExecutor(max_workers=options.workers) as pool, tqdm(total=len(todo), unit="job") as bar:
            for record in pool.map(run_job, [(job, str(out), options.dtype) for job in todo]):
                done[record["name"]] = record
                bar.update(1)
    except OSError as exc:  # the store's folder: full, or taken away while writing
        fix = "free space there" if exc.errno in (errno.ENOSPC, errno.EDQUOT) or exc.errno is None else \
            "make it writable"
        raise DataError(f"could not write the store in {out} ({exc.strerror or str(exc).splitlines()[0]}); {fix} "
                        "and run the same command again: the jobs finished so far are kept") from None
    manifest = assemble_manifest([done[job["name"]] for job in jobs], layout, options)
    finish_store(out, manifest)
    windows = sum(shard["windows"] for shard in manifest["shards"])
    print(f"wrote {out}/manifest.json: {windows:,} windows of {len(manifest['channels'])} x "
          f"{manifest['window_steps']} ({manifest['dtype']}) in {len(manifest['shards'])} shards, "
          f"{len(manifest['subjects'])} subjects, test subjects {manifest['test_subjects']}")
    return 0


def job_inputs(job, dtype):
    """What decides a job's shards, compared before its finished shards are reused: a recording's
    file (path, size, mtime: hashing a corpus on every run would cost a pass over it) and the
    options that cut it, or the checksum of a subject's windows already in memory; and the dtype."""
    if "recording" in job:
        source = {"recording": file_identity(job["recording"]), "options": job["options"]}
    else:
        source = {"windows": array_identity(job["signals"], job["labels"]), "subject": job["subject"]}
    return {**source, "dtype": dtype, "version": VERSION}


def check_store_folder(out):
    """--out must be a new folder or a store's own (a build resumes there): never a file, and never a
    folder of other things, such as a training run, which the store's files would be mixed into."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; give a folder for the store")
    if out.is_dir() and any(out.iterdir()) and not _holds_a_store(out):
        raise DataError(f"--out {out} holds other files and no store; give a new or empty folder")
    under = next((parent for parent in out.absolute().parents if parent.exists()), None)
    if under is not None and not under.is_dir():
        raise DataError(f"--out {out} cannot be created: {under} is a file, not a folder")
    return out


def _holds_a_store(out):
    """Whether a folder is a store's (finished: its manifest says so; unfinished: nothing but a shards/
    folder of job records and shard files, the labels finish_store gathers, and what a write cut short
    leaves), and not some other folder that has a manifest.json or a shards/ of its own."""
    manifest = out / MANIFEST
    if manifest.exists():
        finished = read_json(manifest)
        return isinstance(finished, dict) and finished.get("format") == FORMAT
    shards = out / SHARD_DIR
    if not shards.is_dir() or any(path.name not in (SHARD_DIR, LABELS) and not is_partial_write(path.name)
                                  for path in out.iterdir()):
        return False
    return all(_store_file(path) for path in shards.iterdir())


def _store_file(path):
    """A shard file, a job's record (a JSON object with its identity), or a write cut short."""
    if not path.is_file() or _job_of(path.name) is None:
        return path.is_file() and is_partial_write(path.name)
    record = read_json(path) if path.suffix == ".json" else {"identity": None}
    return isinstance(record, dict) and "identity" in record


def check_same_store(out, asked):
    """A finished store is data a run may have trained on: a build asking for other windows of it (another
    dtype, rate, window, stride, preprocessing or classes), or the windows of another source (another
    folder or file), is refused rather than converted over it. Only the source's recordings may change:
    one added or removed updates the same store."""
    finished = read_json(out / MANIFEST)
    if isinstance(finished, dict) and finished.get("source_path", asked["source_path"]) != asked["source_path"]:
        # Another source is another dataset, not this one with recordings added or removed.
        raise DataError(f"--out {out} holds a finished store built from {finished['source_path']}, not "
                        f"{asked['source_path']}; give another --out, or remove {out / MANIFEST} to convert this "
                        "source there in its place")
    differ = [key for key in STORE_SETTINGS if isinstance(finished, dict) and finished.get(key) != asked.get(key)]
    if differ:
        key = differ[0]
        raise DataError(f"--out {out} holds a finished store whose {key} is {finished.get(key)!r}, not this build's "
                        f"{asked.get(key)!r}; give another --out, or remove {out / MANIFEST} to convert it in place")


def remove_stale_files(out, jobs):
    """Delete the shards and records of jobs the plan no longer has (a recording removed or renamed,
    another layout), so the folder holds only what its manifest lists."""
    names = {job["name"] for job in jobs}
    stale = [path for path in (out / SHARD_DIR).iterdir()
             if path.is_file() and _job_of(path.name) is not None and _job_of(path.name) not in names]
    for path in stale:
        path.unlink()
    return len(stale)


def _job_of(file_name):
    """The job a file under shards/ belongs to: '<job>.json', '<job>-<part>.signals.npy' or '.labels.npy'."""
    match = JOB_FILE.fullmatch(file_name)
    return match and (match[1] if match[1] is not None else match[2])


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
                        help="a JSON file describing the data (data/description.py: channels, rate, window, classes "
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
                                   ("--window-steps", options.window_steps, 8, MAX_WINDOW_STEPS),
                                   ("--stride", options.stride, 1, options.window_steps)):  # predict.py's bounds
        if value is not None and not low <= value <= high:
            raise DataError(f"{flag} must be " + (f"at least {low}" if high == math.inf else
                                                  f"between {low} and {high:,}") + f", got {value}")
    if options.sample_rate is not None and not (math.isfinite(options.sample_rate) and options.sample_rate > 0):
        raise DataError(f"--sample-rate must be a positive number of Hz, got {options.sample_rate}")
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
    described = read_description(options.description)
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
    reserved = [name for name in names if name in ("time_s", "label", "subject")]
    if not all(names) or len(set(names)) < len(names) or reserved:
        raise DataError(f"--channels must name distinct columns other than time_s, label and subject, "
                        f"comma-separated (such as ankle_x,ankle_y,ankle_z); got {text!r}")
    return names


def source_rate(said, given, source):
    """The windows' rate: what the source says (NaN: it does not), else --sample-rate; both must agree."""
    if math.isnan(said):
        if given is None:
            raise DataError(f"{source} does not say its windows' sample rate (no sample_rate_hz): give it with "
                            "--sample-rate HZ")
        return given
    if given is not None and given != said:
        raise DataError(f"{source} holds windows at {said:g} Hz but --sample-rate says {given:g}: drop --sample-rate "
                        "(it brings recordings to a rate; windows keep theirs)")
    return said


def plan(source, options):
    """(jobs, layout): one job per subject's windows or per recording file, and what the manifest
    says of the whole source (channels, rate, test subjects, class names...)."""
    if (root := uci_har.find_root(source)) is not None:
        if options.described:
            raise DataError(f"{source} is a UCI HAR layout, whose channels and classes are known: drop --description")
        splits = {split: uci_har.load_split(root, split) for split in ("train", "test")}
        jobs = [job for split in splits.values() for job in _window_jobs(*split)]
        test = sorted(int(s) for s in np.unique(splits["test"][2]))
        rate = source_rate(uci_har.SAMPLE_RATE_HZ, options.sample_rate, f"UCI HAR layout {root}")
        return jobs, _layout(uci_har.SIGNAL_NAMES, uci_har.CLASS_NAMES, rate, uci_har.WINDOW_STEPS,
                             uci_har.WINDOW_STEPS // 2, "uci-har", test, f"UCI HAR layout {root}")
    if source.is_file() and source.suffix.lower() == ".npz":
        windows = load_npz_windows(source, options.described)
        if windows.own_lengths is not None:
            shortest, longest = windows.own_lengths
            raise DataError(f"{source} holds windows of {shortest} to {longest} steps, padded at their end with NaN, "
                            "and a store holds windows of one length: train on the .npz itself "
                            f"(main.py --dataset npz --data-dir {source}), which reads each over its own steps")
        if windows.split is not None and np.any(windows.split == "val"):
            raise DataError(f"{source} marks validation windows ('val'), and a store holds its test subjects only: "
                            "drop the 'val' marks (main.py --dataset store then holds out validation as "
                            f"--val-fraction says), or train on the .npz itself (--dataset npz --data-dir {source})")
        if windows.split is not None and options.test_subjects:
            raise DataError(f"{source} marks its test windows ('split'), and --test-subjects names others: drop one")
        if windows.split is not None:
            test = np.unique(windows.subjects[windows.split == "test"])
        elif options.test_subjects:
            test = np.array(sorted(options.test_subjects))
        else:
            test = hold_out_subjects(windows.subjects, NPZ_TEST_FRACTION, NPZ_TEST_SEED)
        rate = source_rate(windows.sample_rate_hz, options.sample_rate, source)
        return (_window_jobs(windows.signals, windows.labels, windows.subjects),
                _described(_layout(windows.channel_names, windows.class_names, rate, windows.signals.shape[2],
                                   None, "npz", sorted(int(s) for s in test), f"windows from {source}"), options))
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in (".csv", ".npz"))
        if not files:
            raise DataError(f"{source} holds no .csv or .npz recordings (nor is it a UCI HAR layout)")
        odd = next((path for path in files if not path.is_file()), None)  # a folder, or a link to nothing
        if odd is not None:
            raise DataError(f"{odd} {not_a_file(odd)}; a recordings folder holds .csv or .npz files: move it away")
        if options.described and not options.described.labels_are_numbers():
            raise DataError(f"{options.described.where}: 'classes' must give whole-number labels for recordings, "
                            "whose label column holds numbers")
        options.sample_rate = options.sample_rate or uci_har.SAMPLE_RATE_HZ
        if options.channels:
            channels = options.channels
        else:  # the first recording's sensors decide the store's channels; every other must have the same
            has_gyro = read_recording(files[0], extra=("label", "subject")).gyro_rad_s is not None
            channels = available_channels(options.preprocessing, has_gyro)
        jobs = [{"name": name, "recording": str(path), "options": _recording_options(options, channels)}
                for name, path in zip(_recording_job_names(files), files, strict=True)]
        layout = _layout(channels, options.class_names, options.sample_rate, options.window_steps,
                         options.stride or options.window_steps // 2, options.preprocessing, None,
                         f"recordings in {source}")
        return jobs, _described({**layout, "label_rule": _label_rule(options)}, options)
    raise DataError(f"{source} is neither a folder of recordings, a UCI HAR layout nor an .npz file")


def _described(layout, options):
    """The manifest's layout with the description it was built by: training and predict.py read it from there."""
    return {**layout, "description": options.described.as_json()} if options.described else layout


def _label_rule(options):
    pairs = zip(options.class_labels, options.class_names, strict=True)
    classes = ", ".join(f"{value} {name}" for value, name in pairs)
    return (f"label values {classes}; a window takes the label most of its samples carry, and is left out when that "
            f"is no class ({', '.join(map(str, options.unlabelled)) or 'none named'})")


def _recording_job_names(files):
    """A job per recording, named after its file so that adding or removing a recording leaves the
    other jobs' names, and so their finished shards, as they are."""
    names = [f"rec-{re.sub(r'[^A-Za-z0-9._]', '_', path.name)[:MAX_NAME_CHARACTERS]}" for path in files]
    taken = {name: names.count(name) for name in names}
    return [name if taken[name] == 1 else f"{name}_{index:05d}" for index, name in enumerate(names)]


def _window_jobs(signals, labels, subjects):
    return [{"name": f"sub-{int(subject):06d}", "signals": signals[subjects == subject],
             "labels": labels[subjects == subject], "subject": int(subject)} for subject in np.unique(subjects)]


def _recording_options(options, channels):
    return {"sample_rate": options.sample_rate, "window_steps": options.window_steps,
            "stride": options.stride or options.window_steps // 2, "preprocessing": options.preprocessing,
            "class_labels": options.class_labels, "unlabelled": options.unlabelled, "channels": list(channels)}


def _layout(channels, class_names, rate, window_steps, stride, preprocessing, test_subjects, source):
    return {"channels": list(channels), "class_names": list(class_names), "sample_rate_hz": float(rate),
            "window_steps": int(window_steps), "stride_steps": stride, "preprocessing": preprocessing,
            "test_subjects": test_subjects, "source": source, "label_rule": "the source's windows and labels"}


def run_job(arguments):
    """One job in a worker process: its windows into shard files, then a record of them and of what
    they were made from."""
    job, out, dtype = arguments
    if "recording" in job:
        signals, labels, subject = recording_windows(job["recording"], **job["options"])
    else:
        signals, labels, subject = job["signals"], job["labels"], job["subject"]
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
    record = {"name": job["name"], "subject": subject, "shards": shards, "windows": len(labels),
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


def recording_windows(path, sample_rate, window_steps, stride, preprocessing, class_labels, unlabelled, channels):
    """(float32 windows [n, C, T], int64 labels 0..K-1 [n], subject) of one labelled recording: the
    stream brought to the model's clock, its channels derived and cut as predict.py does, each window
    labelled by the majority of its samples."""
    named = own_channels(channels, preprocessing)  # read by name, as predict.py reads them
    recording = read_recording(path, extra=("label", "subject"), channels=named)
    subjects = np.unique(recording.extra["subject"])
    if len(subjects) != 1 or subjects[0] != np.rint(subjects[0]):
        raise DataError(f"{path}: a recording holds one subject, numbered by a whole number; found {len(subjects)} "
                        f"({subjects[:5].tolist()})")
    if named:
        values = np.stack([recording.extra[name] for name in named], axis=1)
        values, start_s, source_hz = values_on_model_clock(values, recording, sample_rate)
        stream = values.T.astype(np.float32)
    else:
        stream, start_s, source_hz = _derived_stream(recording, path, sample_rate, preprocessing, channels)
    starts = window_starts(stream.shape[1], window_steps, stride)
    labels = class_indexes(np.rint(recording.extra["label"]).astype(np.int64), class_labels, unlabelled,
                           f"{path}", "name each class's value with --class-labels and any value that means no class "
                           "with --unlabelled")
    labels = _labels_on_model_clock(recording, labels, start_s, source_hz, sample_rate, stream.shape[1])
    window_labels = _majority(labels, starts, window_steps)
    keep = window_labels >= 0
    return (cut_windows(stream, starts[keep], window_steps), window_labels[keep],
            int(subjects[0]))


def _derived_stream(recording, path, sample_rate, preprocessing, channels):
    """(float32 [C, m], start_s, source_hz): the channels `preprocessing` derives from acc and gyro."""
    acc, gyro, start_s, source_hz = on_model_clock(recording, sample_rate)
    if preprocessing == "uci-har" and gyro is None:
        raise DataError(f"{path} has no gyroscope, which --preprocessing uci-har needs; use --preprocessing raw")
    made = stream_channels(preprocessing, acc, gyro, sample_rate)
    missing = [name for name in channels if name not in made]
    if missing:
        raise DataError(f"{path} gives no channel {missing[0]} (it gives {', '.join(made)}), which the store holds "
                        f"({', '.join(channels)}); convert recordings of other sensors into a store of their own")
    # The store's channels alone: --channels may name some of those a recording gives (acc without gyro).
    return np.stack([made[name] for name in channels]), start_s, source_hz


def _labels_on_model_clock(recording, labels, start_s, source_hz, model_hz, steps):
    """Each model-clock sample takes the label of the source sample nearest to it in time."""
    source_times = recording.time_s if recording.time_s is not None else np.arange(len(recording)) / source_hz
    times = start_s + np.arange(steps) / model_hz
    nearest = np.clip(np.searchsorted(source_times, times), 0, len(source_times) - 1)
    earlier = np.clip(nearest - 1, 0, None)
    nearest = np.where(np.abs(source_times[earlier] - times) < np.abs(source_times[nearest] - times), earlier, nearest)
    return labels[nearest]


def _majority(labels, starts, window_steps):
    """The class of each window by its samples' most common class (-1, no class, among them)."""
    window_labels = labels[starts[:, None] + np.arange(window_steps)[None, :]]
    values = np.arange(-1, int(labels.max(initial=-1)) + 1)
    counts = np.stack([(window_labels == value).sum(axis=1) for value in values], 1)
    return values[counts.argmax(axis=1)]  # ties go to the smaller: no class before any class


def assemble_manifest(records, layout, options):
    """The manifest from every job's record: shards, subjects, test subjects, and the normalisation
    statistics of the training subjects' windows (summed per job while they were written)."""
    subjects = {}
    for record in records:
        subjects[record["subject"]] = subjects.get(record["subject"], 0) + record["windows"]
    test = layout["test_subjects"]
    if test is None:  # recordings: the subjects asked for, else a fifth held out
        if options.test_subjects:
            test = sorted(options.test_subjects)
        else:
            test = hold_out_subjects(np.array(sorted(subjects)), NPZ_TEST_FRACTION, NPZ_TEST_SEED).tolist()
    _check_test_split(test, subjects, options.src)
    training = [record for record in records if record["subject"] not in test and record["steps"]]
    if not training:
        raise DataError(f"{options.src}: no training windows (every subject is a test subject, or no window "
                        "carries a class)")
    steps = sum(record["steps"] for record in training)
    mean = np.sum([record["sum"] for record in training], axis=0) / steps
    variance = np.sum([record["sum_sq"] for record in training], axis=0) / steps - mean ** 2
    std = np.maximum(np.sqrt(np.maximum(variance, 0.0)), 1e-6)
    return {**layout, "test_subjects": [int(s) for s in test], "dtype": options.dtype,
            "shards": [shard for record in records for shard in record["shards"]],
            "subjects": {str(subject): count for subject, count in sorted(subjects.items())},
            "normalization": {"mean": mean.tolist(), "std": std.tolist(),
                              "over": "every window of the training subjects, validation ones included"}}


def _check_test_split(test, subjects, source):
    """The trainer refuses a store whose test subjects it lacks or whose test split is empty: so does the build."""
    if set(test) <= set(subjects) and sum(subjects[subject] for subject in test):
        return
    having = [str(subject) for subject, count in sorted(subjects.items()) if count]
    listed = ",".join(having[:10]) + (" ..." if len(having) > 10 else "")
    raise DataError(f"{source}: test subjects {','.join(map(str, test)) or '(none)'} would leave the test split empty "
                    f"or name subjects it lacks; the same command with --test-subjects among the subjects with windows "
                    f"({listed}) finishes the build, its shards kept")


def _write_shard(out, name, signals, labels):
    for part, array in (("signals", signals), ("labels", labels.astype(np.int8))):
        write_atomic(shard_paths(out, name)[part], lambda partial, array=array: np.save(partial, array))


if __name__ == "__main__":
    exit_from_command(main)
