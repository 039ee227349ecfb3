"""studies/phone_tilt.py: the per-person posture figures find the person whose tilt changes its own
way, and the person whose standing lies nearer the others' sitting."""
import math
import re

import numpy as np
import pytest

from data.splits import HarData, Split, channel_names
from data.uci_har import CLASS_NAMES
from studies.phone_tilt import print_postures

NAMES = channel_names("flatten")
SITTING, STANDING = CLASS_NAMES.index("SITTING"), CLASS_NAMES.index("STANDING")


def tilted(about, degrees):
    """Gravity along z, tilted about x (0) or y (1)."""
    s, c = math.sin(math.radians(degrees)), math.cos(math.radians(degrees))
    return np.array([s, 0.0, c]) if about == 1 else np.array([0.0, s, c])


def windows_of(people):
    """people: {person: (standing gravity, sitting gravity)}; two steady windows of each posture."""
    signals, labels, subjects = [], [], []
    total = [NAMES.index(f"total_acc_{axis}") for axis in "xyz"]
    for person, postures in people.items():
        for label, gravity in zip((STANDING, SITTING), postures, strict=True):
            for _ in range(2):
                window = np.zeros((len(NAMES), 8), dtype=np.float32)
                window[total] = gravity[:, None]
                signals.append(window)
                labels.append(label)
                subjects.append(person)
    split = Split(np.stack(signals), np.array(labels), np.array(subjects))
    return HarData(split, None, None, CLASS_NAMES, NAMES, "npz", "postures")


def printed(capsys):
    figures = {}
    for line in capsys.readouterr().out.splitlines():
        found = re.match(r"\s*person\s+(\d+): to standing\s+([\d.]+), to sitting\s+([\d.]+), change cosine\s+([-\d.]+)",
                         line)
        if found:
            figures[int(found[1])] = tuple(float(value) for value in found.groups()[1:])
    return figures


def test_the_person_who_tilts_another_way_has_the_lowest_cosine(capsys):
    upright = tilted(0, 0)
    print_postures(windows_of({1: (upright, tilted(0, 20)), 2: (upright, tilted(0, 20)),
                               3: (upright, tilted(1, 20))}))
    figures = printed(capsys)
    assert sorted(figures) == [1, 2, 3]
    assert all(to_standing == 0.0 for to_standing, _, _ in figures.values())
    assert figures[1] == figures[2]
    assert figures[3][2] < figures[1][2] < 1.0
    # Mean change (s/3, 2s/3, c-1) against person 3's (s, 0, c-1).
    s, c = math.sin(math.radians(20)), math.cos(math.radians(20))
    expected = (s * s / 3 + (c - 1) ** 2) / (math.hypot(s, c - 1) * math.sqrt(5 * s * s / 9 + (c - 1) ** 2))
    assert figures[3][2] == pytest.approx(expected, abs=0.006)


def test_a_standing_nearer_the_others_sitting_shows(capsys):
    people = {p: (tilted(0, 0), tilted(0, 20)) for p in (1, 2, 3)}
    people[4] = (tilted(0, 15), tilted(0, 30))  # stands leaning as the others sit
    print_postures(windows_of(people))
    to_standing, to_sitting, cosine = printed(capsys)[4]
    assert to_sitting < to_standing
    assert cosine > 0.95  # the same way as the others, only leaning further
