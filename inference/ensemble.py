"""Ensembles: the models of a cross-validation (and its refit), or runs trained apart (`python -m
inference.ensemble`), as one checkpoint that loads as one model, for predict.py, export.py and the
run's own test report. Each member keeps its own normalisation (a fold's statistics come from its
own training subjects); the ensemble's "logits" are the log of the members' mean probabilities, so
that softmax gives that mean back and everything that reads a single model's logits reads an
ensemble's unchanged."""
import argparse
import math
import sys
from pathlib import Path

import torch
from torch import nn

from inference.checkpoint_checks import check_declared_shapes, checked_layout, checked_model, other_model
from outputs.safety import check_out_file
from training.checkpoint.files import load_checkpoint, save_checkpoint
from training.checkpoint.format import (
    ENSEMBLE_KIND,
    MEMBER_SOURCE_KEYS,
    SavedRun,
    ensemble_checkpoint,
    ensemble_member,
)
from training.config.cli import usage_error
from training.entry_point import run_entry_point
from training.errors import UsageError

ENSEMBLE_FILE = "ensemble.pt"


def _comparable(shared):
    """What members share (SavedRun.shared_by_members), with NaN (an unknown rate) as None: NaN equals
    nothing, so members without a rate would never agree."""
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in shared.items()}


class ProbabilityAverage(nn.Module):
    """Raw-unit windows in; log of the members' mean class probabilities out."""

    def __init__(self, members):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, signals):
        # log(mean_k p_k) = logsumexp_k(log p_k) - log K: no log of a probability that underflowed to 0.
        log_probabilities = torch.stack([torch.log_softmax(member(signals), dim=1) for member in self.members])
        return torch.logsumexp(log_probabilities, dim=0) - math.log(len(self.members))


def write_ensemble(member_paths, path, config=None):
    """One checkpoint of the runs' inference weights (the moving average where kept), each with
    its normalisation and settings; `config` is the cross-validation's own flat flags (None: the
    first member's). An ensemble is refused as a member: its members are to be given instead."""
    members, runs, shared = [], [], None
    for member_path in member_paths:
        run = SavedRun.of(load_checkpoint(member_path))
        if run is not None and run.kind == ENSEMBLE_KIND:
            raise UsageError(f"{member_path} is an ensemble already; give the checkpoints of its members")
        check_member(run, member_path)
        config = run.flags if config is None else config
        these = run.shared_by_members()
        if shared is not None and _comparable(these) != _comparable(shared):
            raise UsageError(f"{member_path} was trained on other windows or classes than {member_paths[0]}; "
                             "an ensemble's members must share them")
        shared = these
        members.append(ensemble_member(run, member_path))
        runs.append(run)
        mixed = other_model([each.flags for each in runs])
        if mixed:  # predict.py would refuse the file: refused before it is written
            raise UsageError(f"{member_path}: {mixed}; give runs of one --model")
    save_checkpoint(ensemble_checkpoint(members, config, shared), path)
    return path


def check_member(run, path):
    """What predicting with a member (`run`: a SavedRun, None for a file that is not a dict) needs,
    checked as predict.py checks a checkpoint: its keys, the shapes it declares, finite weights and
    normalisation, settings that build its model and weights that fit it."""
    if run is None:
        raise UsageError(f"{path} is not a checkpoint of this trainer; give runs' best.pt or last.pt")
    missing = run.missing(MEMBER_SOURCE_KEYS)
    if missing:
        raise UsageError(f"{path} lacks {', '.join(missing)}: not a checkpoint of this trainer; give runs' best.pt "
                         "or last.pt")
    check_declared_shapes(run, path)
    checked_model(run, run.inference_weights(), checked_layout(run, path).window_steps, path)


def main(argv=None):
    """python -m inference.ensemble RUN/best.pt RUN2/best.pt ... --out ensemble.pt: runs trained apart
    (other --seed, say) as one checkpoint for predict.py and export.py."""
    parser = argparse.ArgumentParser(prog="python -m inference.ensemble", description=main.__doc__)
    parser.add_argument("members", nargs="+", help="checkpoints of runs on the same windows and classes")
    parser.add_argument("--out", required=True, help="the ensemble checkpoint to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--debug", action="store_true", help="full tracebacks instead of one-line errors")
    parser.error = usage_error(parser.prog)  # one line, like every other bad input
    opts = parser.parse_args(argv)
    if len(opts.members) < 2:
        raise UsageError("an ensemble needs at least two checkpoints; give more runs' best.pt")
    missing = [member for member in opts.members if not Path(member).is_file()]
    if missing:
        raise UsageError(f"{missing[0]} is not a checkpoint file; give runs' best.pt or last.pt")
    if len({Path(member).resolve() for member in opts.members}) < len(opts.members):
        raise UsageError("a checkpoint is named twice; give each member once")
    out = check_out_file(opts.out, opts.overwrite, reads=opts.members)
    path = write_ensemble(opts.members, out)
    print(f"wrote {path}: {len(opts.members)} models averaging their probabilities")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))
