"""Transitions learnt from label sequences at the window stride, the Viterbi path through them, and
windows marked uncertain in the timeline."""
import contextlib
import io
import json

import numpy as np
import pytest

from inference.timeline import UNCERTAIN, mark_uncertain, merge_segments, smooth_labels, sticky_transitions, viterbi
from inference.transitions import (
    learn_transitions,
    read_transitions,
    transition_counts,
    transition_matrix,
    window_labels,
    write_transitions,
)
from inference.transitions import main as transitions_command
from test_bad_input import assert_refused
from training.entry_point import run_entry_point
from training.errors import UsageError

NAMES = ("A", "B", "C")


def test_counts_of_consecutive_windows_skip_what_is_no_class():
    counts = transition_counts([np.array([0, 0, -1, 1, 1, 2]), np.array([2, 2])], 3)
    expected = np.zeros((3, 3), dtype=int)
    expected[0, 0] = expected[0, 1] = expected[1, 1] = expected[1, 2] = expected[2, 2] = 1
    np.testing.assert_array_equal(counts, expected)
    matrix = transition_matrix(counts)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
    np.testing.assert_allclose(matrix[0], [2 / 5, 2 / 5, 1 / 5])  # add-one: (1+1, 1+1, 0+1) / 5


def test_window_labels_take_each_window_centre_at_the_stride():
    samples = np.repeat([0, 1, 2], 100)  # 300 samples
    labels = window_labels(samples, window_steps=40, stride_steps=20)
    centres = np.r_[np.arange(0, 261, 20), 260][:len(labels)] + 20
    np.testing.assert_array_equal(labels, samples[centres])
    counts, matrix = learn_transitions([samples], 40, 20, classes=3)
    assert counts[0, 1] == 1 and counts[1, 2] == 1 and counts[2, 0] == 0 and counts[0, 2] == 0
    assert matrix[0, 0] > 0.5


def noisy_probabilities(truth, seed=0, confidence=0.55):
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet(np.ones(len(NAMES)), len(truth)) * (1 - confidence)
    probabilities[np.arange(len(truth)), truth] += confidence
    return probabilities


def test_viterbi_never_takes_a_forbidden_transition():
    # A -> C is impossible; the windows suggest it strongly at one step.
    matrix = np.array([[0.9, 0.1, 0.0], [0.05, 0.9, 0.05], [0.05, 0.05, 0.9]])
    truth = np.r_[np.zeros(20, int), np.full(20, 2)]
    probabilities = noisy_probabilities(truth, confidence=0.9)
    free = viterbi(probabilities, transitions=np.full((3, 3), 1 / 3))
    assert np.any((free[:-1] == 0) & (free[1:] == 2))  # without the ban, the path jumps A -> C
    path = viterbi(probabilities, transitions=matrix)
    assert not np.any((path[:-1] == 0) & (path[1:] == 2))
    assert path[0] == 0 and path[-1] == 2  # it goes through B instead


def test_the_sticky_matrix_is_the_default_path():
    probabilities = noisy_probabilities(np.repeat([0, 1, 2, 1], 15), seed=3, confidence=0.3)
    np.testing.assert_array_equal(smooth_labels(probabilities, "hmm"),
                                  viterbi(probabilities, transitions=sticky_transitions(3, 0.02)))
    np.testing.assert_array_equal(smooth_labels(probabilities, "hmm", transitions=sticky_transitions(3, 0.02)),
                                  smooth_labels(probabilities, "hmm"))


def test_a_transitions_file_is_checked_against_the_checkpoint(tmp_path):
    path = tmp_path / "transitions.json"
    write_transitions(path, np.eye(3, dtype=int) * 5, NAMES, 128, 64, {"subjects": [1, 2]})
    matrix = read_transitions(path, NAMES, 64)
    np.testing.assert_allclose(matrix, transition_matrix(np.eye(3) * 5))
    with pytest.raises(UsageError, match="stride of 64"):
        read_transitions(path, NAMES, 32)
    with pytest.raises(UsageError, match="over classes"):
        read_transitions(path, ("A", "B", "D"), 64)
    record = json.loads(path.read_text())
    record["matrix"][0] = [0.5, 0.6, 0.0]
    path.write_text(json.dumps(record))
    with pytest.raises(UsageError, match="summing to 1"):
        read_transitions(path, NAMES, 64)
    with pytest.raises(UsageError, match="does not exist"):
        read_transitions(tmp_path / "none.json", NAMES, 64)


def test_unsure_windows_become_an_uncertain_segment():
    probabilities = np.array([[0.9, 0.05, 0.05], [0.4, 0.35, 0.25], [0.45, 0.3, 0.25], [0.1, 0.8, 0.1]])
    labels = mark_uncertain(probabilities.argmax(axis=1), probabilities, below=0.5)
    np.testing.assert_array_equal(labels, [0, 3, 3, 1])
    np.testing.assert_array_equal(mark_uncertain(probabilities.argmax(axis=1), probabilities, None), [0, 0, 0, 1])
    start_s = np.arange(4) * 1.28
    segments = merge_segments(labels, probabilities, start_s, start_s + 2.56, NAMES)
    assert [s.activity for s in segments] == ["A", UNCERTAIN, "B"]
    assert segments[1].confidence == pytest.approx(0.425)


def learn(*argv):
    """(exit code, stdout, stderr) of python -m inference.transitions."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_entry_point(transitions_command, [str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


def test_the_command_learns_from_the_people_it_is_given(tmp_path):
    # Two people: one walks then sits (a transition, label 7, between), the other only lies.
    first = np.r_[np.full(640, 1), np.full(128, 7), np.full(640, 4)].astype(np.int8)
    second = np.full(1280, 6, dtype=np.int8)
    archive = tmp_path / "recordings.npz"
    np.savez(archive, u01_s0_label=first, u02_s0_label=second)
    out = tmp_path / "transitions.json"
    code, _, err = learn("--recordings", archive, "--subjects", "1", "--out", out)
    assert code == 0, err
    record = json.loads(out.read_text())
    counts = np.array(record["counts"])
    assert counts[0, 3] == 1 and counts[5].sum() == 0  # walking to sitting once; person 2 not read
    centres = window_labels(first, 128, 64)
    assert counts.sum() == np.sum((centres >= 1) & (centres <= 6)) - 1  # consecutive activity windows
    assert read_transitions(out, ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING",
                                  "LAYING"), 64).shape == (6, 6)
    assert_refused(learn("--recordings", archive, "--subjects", "9", "--out", out, "--overwrite"),
                   "no labelled recording")
    assert_refused(learn("--recordings", tmp_path / "none.npz", "--subjects", "1", "--out", out, "--overwrite"),
                   "not a file")
    assert_refused(learn("--recordings", archive, "--subjects", "1", "--out", out), "exists", "--overwrite")
