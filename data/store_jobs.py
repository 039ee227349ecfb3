"""What the store's converter (data/build_store.py) is asked to do for a source, as each kind of source
(data/sources/) plans it: a job of windows per subject, or a job per recording with the options that cut
it, and the layout the store's manifest records."""
import math
import re

import numpy as np

from data.errors import DataError
from data.splits import NPZ_TEST_FRACTION, NPZ_TEST_SEED, hold_out_subjects

MAX_NAME_CHARACTERS = 120  # of a recording's file name in its job's name


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

def label_rule(options):
    pairs = zip(options.class_labels, options.class_names, strict=True)
    classes = ", ".join(f"{value} {name}" for value, name in pairs)
    return (f"label values {classes}; a window takes the label most of its samples carry, and is left out when that "
            f"is no class ({', '.join(map(str, options.unlabelled)) or 'none named'})")

def recording_job_names(files):
    """A job per recording, named after its file so that adding or removing a recording leaves the
    other jobs' names, and so their finished shards, as they are."""
    names = [f"rec-{re.sub(r'[^A-Za-z0-9._]', '_', path.name)[:MAX_NAME_CHARACTERS]}" for path in files]
    taken = {name: names.count(name) for name in names}
    return [name if taken[name] == 1 else f"{name}_{index:05d}" for index, name in enumerate(names)]

def test_subjects_of(subjects, source):
    """A fifth of the subjects, held out for test as --dataset npz holds them out; a store tests on whole
    subjects, so one subject is refused here rather than in terms of the trainer's validation flags."""
    if len(np.unique(subjects)) < 2:
        raise DataError(f"{source} gives windows of one subject; a store tests on whole subjects held out, so it "
                        "needs windows of two or more (an .npz of one person's windows trains with --dataset npz, "
                        "which tests on the last fifth of them)")
    return hold_out_subjects(subjects, NPZ_TEST_FRACTION, NPZ_TEST_SEED)

def window_jobs(signals, labels, subjects):
    """A job per subject of windows already in memory."""
    return [{"name": f"sub-{int(subject):06d}", "signals": signals[subjects == subject],
             "labels": labels[subjects == subject], "subject": int(subject)} for subject in np.unique(subjects)]

def recording_options(options, channels):
    """How a recording is cut (data/labelled_recordings.py's RecordingCut), as a job records it."""
    return {"sample_rate": options.sample_rate, "window_steps": options.window_steps,
            "stride": options.stride or options.window_steps // 2, "preprocessing": options.preprocessing,
            "class_labels": options.class_labels, "unlabelled": options.unlabelled, "channels": list(channels)}

def manifest_head(layout, test_subjects, source, options, label_rule="the source's windows and labels"):
    """What the manifest says of the whole source: its Layout (data/layout.py), test subjects (None: chosen
    when the jobs are done), where it came from, how windows got their labels, and the description it was
    built by (training and predict.py read it from there)."""
    head = {"layout": layout.as_json(), "test_subjects": test_subjects, "source": source, "label_rule": label_rule}
    if options.described:
        head["description"] = options.described.as_json()
    return head
