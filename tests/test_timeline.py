"""From window probabilities to a timeline: smoothing, merged segments, per-sample labels."""
import numpy as np
import pytest

from inference.timeline import format_summary, labels_at, merge_segments, owned_spans, smooth_labels, time_per_activity

NAMES = ("A", "B", "C")


def one_hot(labels, confidence=0.8):
    probs = np.full((len(labels), len(NAMES)), (1 - confidence) / (len(NAMES) - 1))
    probs[np.arange(len(labels)), labels] = confidence
    return probs


def half_overlapping(count, window_s=2.56):
    start_s = 10.0 + np.arange(count) * window_s / 2
    return start_s, start_s + window_s


def test_owned_spans_split_overlaps_at_the_midpoints():
    start_s, end_s = half_overlapping(4)
    own_start, own_end = owned_spans(start_s, end_s)
    np.testing.assert_allclose(own_start, [10.0, 11.92, 13.20, 14.48])
    np.testing.assert_allclose(own_end, [11.92, 13.20, 14.48, 16.40])


def test_merge_joins_runs_and_covers_the_recording():
    labels = np.array([0, 0, 1, 1, 1, 0, 2])
    probs = one_hot(labels)
    probs[1, 0] = 0.6
    start_s, end_s = half_overlapping(len(labels))
    segments = merge_segments(labels, probs, start_s, end_s, NAMES)
    assert [s.activity for s in segments] == ["A", "B", "A", "C"]
    assert segments[0].start_s == start_s[0] and segments[-1].end_s == end_s[-1]
    for before, after in zip(segments, segments[1:], strict=False):
        assert before.end_s == after.start_s
    assert segments[0].confidence == pytest.approx(0.7)  # mean of 0.8 and 0.6
    totals = time_per_activity(segments, NAMES)
    assert sum(totals.values()) == pytest.approx(end_s[-1] - start_s[0])
    assert totals["B"] == pytest.approx(3 * 1.28)
    summary = format_summary(segments, NAMES, "header")
    assert "header" in summary and all(name in summary for name in NAMES)


def test_labels_at_follows_the_owning_window():
    labels = np.array([0, 1, 2])
    start_s, end_s = half_overlapping(3)  # owned: [10, 11.92), [11.92, 13.2), [13.2, 15.12)
    times = np.array([9.0, 10.0, 11.9, 11.95, 13.19, 13.2, 15.0, 15.2])
    assert labels_at(times, labels, start_s, end_s).tolist() == [-1, 0, 0, 1, 1, 2, 2, -1]


@pytest.mark.parametrize("method", ["median", "hmm"])
def test_smoothing_removes_a_one_window_blip_but_keeps_a_long_change(method):
    labels = np.array([0] * 10 + [1] + [0] * 10 + [2] * 12)
    smoothed = smooth_labels(one_hot(labels, 0.6), method)
    assert smoothed.tolist() == [0] * 21 + [2] * 12
    assert smooth_labels(one_hot(labels, 0.6), None).tolist() == labels.tolist()


def test_hmm_follows_confident_evidence_against_the_prior():
    labels = np.array([0] * 5 + [1] * 3 + [0] * 5)
    probs = one_hot(labels, 0.999)
    assert smooth_labels(probs, "hmm").tolist() == labels.tolist()
