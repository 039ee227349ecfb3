"""Test-time adaptation without labels for MiniRocket: the PPV features of a group of windows (a
whole recording, or one person's windows) standardised with that group's own mean and standard
deviation instead of the training windows'. A new person's posture and gait shift many features at
once; centring them on the person undoes the part of that shift the head has not learnt.

The training statistics are MiniRocket.fit's buffers `feature_mean` and `feature_std`; a group's are
computed the same way, so a group whose statistics equal them gets exactly the model's own probabilities.
"""
import math
import sys

import numpy as np
import torch

from inference.bundle import batches, check_finite_probabilities
from training.errors import UsageError

ADAPT_CHOICES = ("none", "recording")
STD_FLOOR = 1e-3  # MiniRocket.fit's clamp: a feature constant over the group is centred, not blown up
# A standard deviation needs two windows: torch's std of one is NaN (with a warning), and one window's
# own mean would standardise it to zeros, which the head reads as nothing at all. A group of fewer
# is refused before its statistics are computed, or (a person in an evaluation) keeps the training ones.
MIN_STATISTICS_WINDOWS = 2
# A recording is standardised on itself only where the model, unadapted, sees more than one activity
# in it: the other activities must hold at least MIN_OTHER_WINDOWS windows and MIN_OTHER_SHARE of the
# recording. Each person's windows of one activity standardised on themselves scored 0.27, and one
# activity with a tenth of each other's windows (about a third others) 0.87 against 0.975 untouched
# (docs/training.md): a recording more lopsided than that has nothing to centre on.
MIN_OTHER_WINDOWS = 5
MIN_OTHER_SHARE = 0.1
# The fewest windows a recording can show that mix in: two activities of MIN_OTHER_WINDOWS each. Fewer
# also squeeze every standardised feature into a narrow band (at most (N - 1) / sqrt(N) from 0 over N
# windows: +-0.71 for two, whatever the windows hold).
MIN_RECORDING_WINDOWS = 2 * MIN_OTHER_WINDOWS


def adaptable_members(bundle):
    """The raw-unit MiniRocket models of a bundle (one, or an ensemble's members); any other is refused."""
    model = bundle.model
    members = list(model.members) if hasattr(model, "members") else [model]
    for member in members:
        if not hasattr(member.model, "feature_mean"):
            raise UsageError(f"checkpoint {bundle.path} is a {bundle.config.model.name} model: --adapt standardises "
                             "MiniRocket's features, so it needs a minirocket checkpoint; drop --adapt")
    return members


@torch.no_grad()
def raw_features(member, windows, device, batch_size=512):
    """PPV features [N, F] (float32, before standardisation) of raw-unit windows [N, C, T]."""
    member = member.to(device)
    chunks = [member.model.transform((batch - member.mean) / member.std).cpu()
              for batch in batches(windows, device, batch_size)]
    return torch.cat(chunks) if chunks else torch.zeros(0, member.model.feature_mean.numel())


def group_statistics(features):
    """(mean, std) of a group's features, as MiniRocket.fit computes the training ones."""
    return features.mean(dim=0), features.std(dim=0).clamp_min(STD_FLOOR)


@torch.no_grad()
def member_probabilities(members, features_per_member, adapt, group="a group of windows"):
    """The members' mean probabilities [N, classes] (numpy float64), each member's features
    standardised with the training statistics (adapt False) or with the group's own (True). A group's
    own need MIN_STATISTICS_WINDOWS: fewer are refused in one line naming `group`."""
    count = len(features_per_member[0])
    if adapt and count < MIN_STATISTICS_WINDOWS:  # checked here, so that std() never sees a single window
        raise UsageError(f"{group} has {count} window(s), too few to standardise features on: a standard deviation "
                         f"needs at least {MIN_STATISTICS_WINDOWS}")
    total = 0
    for member, features in zip(members, features_per_member, strict=True):
        model = member.model
        mean, std = group_statistics(features) if adapt else (model.feature_mean.cpu(), model.feature_std.cpu())
        head = member.cpu().model.head.to(features.device)
        standardised = (features - mean.to(features.device)) / std.to(features.device)
        total = total + torch.softmax(head(standardised).double(), dim=1)
    return check_finite_probabilities((total / len(members)).numpy())


def check_recording_windows(count, recording, advice):
    """A recording of fewer than MIN_RECORDING_WINDOWS windows refused in one line, before any feature
    is computed; `advice` says what to do instead."""
    if count < MIN_RECORDING_WINDOWS:
        raise UsageError(f"{recording} gives {count} window(s), too few to standardise its features on: at least "
                         f"{MIN_RECORDING_WINDOWS}, room for two activities of {MIN_OTHER_WINDOWS} windows; {advice}")


def check_several_activities(probs, class_names, recording):
    """Refuse in one line a recording whose unadapted probabilities [N, classes] show one activity:
    the others hold fewer than MIN_OTHER_WINDOWS windows or MIN_OTHER_SHARE of them."""
    counts = np.bincount(probs.argmax(axis=1), minlength=len(class_names))
    top = int(counts.argmax())
    others, needed = len(probs) - int(counts[top]), max(MIN_OTHER_WINDOWS, math.ceil(MIN_OTHER_SHARE * len(probs)))
    if others < needed:
        raise UsageError(f"--adapt recording: the model sees one activity in {recording}, {class_names[top]} in "
                         f"{counts[top]} of {len(probs)} windows and the others in {others}, fewer than the {needed} "
                         "a mix needs; standardised on itself a recording of one activity has nothing to centre on "
                         "(such windows of new people scored 0.27, against 0.98 unadapted: docs/training.md), so "
                         "--adapt needs a recording of several activities: drop it here")


def adapted_recording(bundle, windows, device, recording, shortest_s):
    """Class probabilities [N, classes] of a whole recording's windows standardised with its own
    statistics; refused in one line where it gives fewer than MIN_RECORDING_WINDOWS windows (a
    recording of `shortest_s` seconds gives that many) or where the model, unadapted, sees one activity."""
    members = adaptable_members(bundle)
    check_recording_windows(len(windows), f"--adapt recording: {recording}",
                            f"drop --adapt, or give a recording of {shortest_s:.1f} s or more")
    features = [raw_features(member, windows, device) for member in members]
    check_several_activities(member_probabilities(members, features, adapt=False), bundle.class_names, recording)
    return member_probabilities(members, features, adapt=True, group=recording)


def adapted_probabilities(bundle, windows, device, group="the group"):
    """Class probabilities [N, classes] of one group of windows (a person's, in an evaluation)
    standardised with its own statistics; a group of fewer than MIN_STATISTICS_WINDOWS keeps the
    training statistics, said in one line."""
    members = adaptable_members(bundle)
    features = [raw_features(member, windows, device) for member in members]
    adapt = len(windows) >= MIN_STATISTICS_WINDOWS
    if not adapt:
        print(f"warning: --adapt: {group} has {len(windows)} window(s), too few for statistics of its own (at least "
              f"{MIN_STATISTICS_WINDOWS}): its features are standardised with the training windows'", file=sys.stderr)
    return member_probabilities(members, features, adapt=adapt, group=group)


def adapted_per_group(bundle, windows, groups, device):
    """adapted_probabilities of each group (a subject id per window) on its own, in window order."""
    groups = np.asarray(groups)
    result = np.zeros((len(windows), len(bundle.class_names)))
    for group in np.unique(groups):
        where = np.flatnonzero(groups == group)
        result[where] = adapted_probabilities(bundle, windows[where], device, f"subject {group}")
    return result
