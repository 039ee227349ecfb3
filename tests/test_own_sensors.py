"""Data that is not UCI HAR's: other rates and time stamps, label schemes, channel sets, one person."""
import numpy as np
import pytest

from data.errors import DataError
from data.recordings import Recording
from data.resample import on_model_clock
from inference_fixtures import RATE_HZ


def millisecond_stamps(rate_hz, seconds):
    """A phone's time column: a steady clock written rounded to the millisecond."""
    return np.round(np.arange(int(seconds * rate_hz)) / rate_hz, 3)


@pytest.mark.parametrize("given_hz", [None, 64.0])
def test_rate_of_rounded_stamps_comes_from_the_whole_span(given_hz):
    time_s = millisecond_stamps(64.0, 60.0)
    assert set(np.round(np.diff(time_s), 3)) == {0.015, 0.016}  # the median step alone reads 62.5 Hz
    signals = np.sin(np.outer(time_s, [1.0, 2.0, 3.0]))
    _, _, _, source_hz = on_model_clock(Recording(signals, None, time_s, "r"), RATE_HZ, given_hz)
    assert source_hz == pytest.approx(64.0, rel=1e-3)
    if given_hz is not None:
        assert source_hz == given_hz  # the stamps agree within their rounding: the given rate wins


def test_a_given_rate_the_stamps_contradict_is_refused():
    time_s = millisecond_stamps(64.0, 60.0)
    with pytest.raises(DataError, match="--sample-rate 50 disagrees"):
        on_model_clock(Recording(np.zeros((len(time_s), 3)), None, time_s, "r"), RATE_HZ, 50.0)
