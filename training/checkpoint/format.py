"""The checkpoint's format, known here and nowhere else: the keys a run's checkpoint (and a fold
ensemble's) holds, how they are written, and how they are read back, through SavedRun, a read-only
view whose every accessor keeps the default an older checkpoint's missing key has always had. Also
the one check that trained tensors are finite, which resuming and predicting share.

A run's checkpoint is one flat dict: the metadata (run_metadata: what the file needs to be used
without the trainer), the train state's fields beside it, and each stateful part under its own key
(run_checkpoint). An ensemble's holds its members, each a model with its normalisation and settings,
and what they share (ensemble_checkpoint). tests/test_checkpoint_format.py checks that no other
module reads a checkpoint's keys."""
import math
from dataclasses import dataclass

import torch

from data.layout import Layout

ENSEMBLE_KIND = "fold-ensemble"  # the "kind" of an ensemble checkpoint; single runs' checkpoints have none
# A run begun before --lr-reference-batch existed scaled its LR by global batch / per-GPU batch; resumed,
# it keeps that rule to its end (its checkpoints say so under this key), so no running schedule changes.
PER_GPU_RULE_KEY = "lr_scales_by_per_gpu_batch"

# What a file must hold to be resumed (checkpoint/judge.py) and to be predicted with (inference/bundle.py),
# beside the weights of its kind.
RESUMABLE_KEYS = ("model", "optimizer", "scaler", "epoch", "step", "best_metric", "config", "normalization",
                  "global_batch_size", "in_channels", "num_classes")
PREDICTION_KEYS = ("config", "class_names", "channel_names", "in_channels", "num_classes", "sample_rate_hz",
                   "window_steps", "preprocessing")
WEIGHT_KEYS = {None: ("model", "normalization"), ENSEMBLE_KIND: ("members",)}  # by kind; no other kind is known
# What every member of an ensemble must agree on (the windows in, the classes out), what each keeps of its
# run, what an ensemble's member holds, and what a run's checkpoint needs to become a member.
SHARED_KEYS = ("class_names", "channel_names", "in_channels", "num_classes", "sample_rate_hz", "window_steps",
               "preprocessing")
MEMBER_KEYS = ("config", "normalization", "in_channels", "num_classes")
ENSEMBLE_MEMBER_KEYS = (*MEMBER_KEYS, "model")
MEMBER_SOURCE_KEYS = tuple(dict.fromkeys(("model", *SHARED_KEYS, *MEMBER_KEYS)))


# A checkpoint keeps its data's Layout (data/layout.py) under these flat keys, as it always has (predict.py
# has read them since before the Layout), and the description the data was read by, where there was one,
# under "description"; SavedRun.data_layout reads them back through Layout.from_json.


def layout_metadata(layout, described=None):
    """A data Layout (and the description the data was read by, or None) as a checkpoint keeps them."""
    return {"class_names": list(layout.class_names), "channel_names": list(layout.channels),
            "sample_rate_hz": float(layout.sample_rate_hz), "window_steps": layout.window_steps,
            "preprocessing": layout.preprocessing, "description": described.as_json() if described else None}


def run_metadata(*, config, data, normalization, world_size, global_batch, batch_layout, planned_epochs):
    """What a run's checkpoint carries beside its state: enough to use it without the trainer, the run's
    batch layout (for an exact mid-epoch resume) and the epochs it trains (`planned_epochs`: --epochs, or
    one for a head solved by ridge)."""
    return {"config": config.flags(), "planned_epochs": planned_epochs, "normalization": normalization,
            "world_size": world_size, "global_batch_size": global_batch, "layout": batch_layout,
            "in_channels": data.train.signals.shape[1], "num_classes": len(data.class_names),
            **layout_metadata(data.layout, data.described),
            "data_identity": data.identity}  # what the data is, for a resume to compare (run_inputs.py)


def run_checkpoint(metadata, train_state, parts):
    """The dict a run's checkpoint holds: the metadata, the train state's fields (TrainState.state_dict)
    and each stateful part's state under its own key."""
    return {**metadata, **train_state, **parts}


def ensemble_member(run, source):
    """An ensemble's entry for the run `run` (a SavedRun) read from `source`: its inference weights
    (the moving average where kept), with its normalisation and settings."""
    return {"model": run.inference_weights(), "source": str(source), **{key: run.raw[key] for key in MEMBER_KEYS}}


def ensemble_checkpoint(members, flags, shared):
    """An ensemble's checkpoint: `members` (ensemble_member's), the flat `flags` it describes itself by,
    and what the members share (SavedRun.shared_by_members)."""
    return {"kind": ENSEMBLE_KIND, "members": members, "config": flags, **shared}


def _listed(value):
    """A list as stored; anything else as it is, for Layout.from_json to refuse by name."""
    return list(value) if isinstance(value, list | tuple) else value


def nonfinite_tensor(named_tensors):
    """The name of the first floating-point tensor of `named_tensors` ((name, tensor) pairs, read in
    order and no further) that holds NaN or inf, else None."""
    return next((name for name, tensor in named_tensors
                 if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())), None)


@dataclass(frozen=True)
class SavedRun:
    """A loaded checkpoint (a run's, an ensemble's, or an ensemble's member, or the parts about to
    become a checkpoint), read by name. A key every file of this trainer holds is read as it must be
    (KeyError where it lacks it: the callers check `missing` first); a key added later reads as what a
    file from before it stands for."""
    raw: dict

    @classmethod
    def of(cls, loaded):
        """The view of what torch.load gave, or None where that is not a dict (not a checkpoint)."""
        return cls(loaded) if isinstance(loaded, dict) else None

    def missing(self, keys):
        """The keys of `keys` the file lacks, in their order."""
        return [key for key in keys if key not in self.raw]

    @property
    def kind(self):
        """None for a run's checkpoint, ENSEMBLE_KIND for an ensemble's."""
        return self.raw.get("kind")

    @property
    def has_flags(self):
        return "config" in self.raw

    @property
    def flags(self):
        """The run's settings: the flat flags of its RunConfig (RunConfig.from_flags reads them)."""
        return self.raw["config"]

    @property
    def data_identity(self):
        """What the data the run trained on is (HarData.identity); None where not recorded."""
        return self.raw.get("data_identity")

    def data_layout(self, where="the checkpoint"):
        """The Layout of the windows the model reads and the classes it names, read through Layout.from_json
        (DataError where the file's are not one), with the description's sensors, axes and labels where the
        data was read by one; None for a file that records no channels or classes (an older one)."""
        raw = self.raw
        if raw.get("channel_names") is None or raw.get("class_names") is None:
            return None
        rate = raw.get("sample_rate_hz", math.nan)  # NaN: windows of no stated rate; None is no rate at all
        said = {"sample_rate_hz": None if isinstance(rate, float) and math.isnan(rate) else rate,
                **{key: raw.get(key) for key in ("window_steps", "preprocessing") if raw.get(key) is not None}}
        described = raw.get("description")
        rate_said = said["sample_rate_hz"] is not None  # a rate of None is refused, as a damaged file's
        if isinstance(described, dict):
            return Layout.from_json({**described, **said}, where, rate_said=rate_said or rate is None)
        return Layout.from_json({"channels": [{"name": name} for name in _listed(raw["channel_names"])],
                                 "classes": [{"name": name, "label": index}
                                             for index, name in enumerate(_listed(raw["class_names"]))],
                                 **said}, where, rate_said=rate_said or rate is None)

    def described(self, where="the checkpoint"):
        """The description the run's data was read by (a Layout), or None."""
        described = self.raw.get("description")
        return Layout.from_json(described, f"{where}'s description") if described else None

    def planned_epochs(self, default):
        """The epochs the run trains: recorded, else its --epochs, else `default`."""
        return self.raw.get("planned_epochs", self.flags.get("epochs", default))

    def lr_scales_by_per_gpu_batch(self):
        """Whether the run began before --lr-reference-batch, so its LR scales against its per-GPU batch."""
        return "lr_reference_batch" not in self.flags or bool(self.raw.get(PER_GPU_RULE_KEY))

    @property
    def epoch(self):
        """Epochs completed (0 where not recorded)."""
        return self.raw.get("epoch", 0)

    @property
    def step(self):
        """Optimizer steps completed; -1 for a file that records none."""
        return self.raw.get("step", -1)

    @property
    def epochs_since_best(self):
        return self.raw.get("epochs_since_best", 0)

    def predates_the_final_model(self):
        """Whether its run began before --final-model and --recipe-choice existed: it ends as it would
        have then, on its validated weights and its recipe as set."""
        return self.has_flags and "final_model" not in self.flags

    @property
    def refitted(self):
        """Whether its weights are a final model trained on every training person, validation people
        included (training/loop/refit.py): figures on the validation split are not held out."""
        return bool(self.raw.get("refitted", False))

    def progress(self):
        """(epoch, step, samples into the epoch), as ints; KeyError where the file records no epoch or step."""
        return int(self.raw["epoch"]), int(self.raw["step"]), int(self.raw.get("epoch_position", 0))

    @property
    def global_batch_size(self):
        return self.raw["global_batch_size"]

    @property
    def batch_layout(self):
        """{world_size, loader_batch, grad_accum_steps} of the run that saved it; None where not recorded."""
        return self.raw.get("layout")

    @property
    def train_state(self):
        """The train state's fields lie at the top level, beside the metadata: TrainState.load_state_dict
        takes its own and keeps its defaults for those an older file lacks."""
        return self.raw

    def part(self, key):
        """The saved state of the stateful part under `key`; None where the file has none."""
        return self.raw.get(key)

    @property
    def weights(self):
        """The model's state dict (the trained weights)."""
        return self.raw["model"]

    @property
    def normalization(self):
        """{mean, std}: the training windows' per-channel statistics the model's inputs are scaled by."""
        return self.raw["normalization"]

    @property
    def in_channels(self):
        return self.raw["in_channels"]

    @property
    def num_classes(self):
        return self.raw["num_classes"]

    def inference_weights(self):
        """The weights to predict with: the moving average when the run kept one, else the trained ones;
        None for an average without weights (a damaged file), which the caller's checks refuse."""
        average = self.raw.get("ema")
        if not average:
            return self.weights
        return average.get("weights") if isinstance(average, dict) else None

    def trained_tensors(self):
        """(name, tensor) of the weights, the weight average and the optimizer moments, for nonfinite_tensor."""
        for name, tensor in (self.raw.get("model") or {}).items():
            yield f"model.{name}", tensor
        for name, tensor in ((self.raw.get("ema") or {}).get("weights") or {}).items():
            yield f"ema.{name}", tensor
        for index, moments in ((self.raw.get("optimizer") or {}).get("state") or {}).items():
            for key, tensor in moments.items():
                if isinstance(tensor, torch.Tensor):
                    yield f"optimizer.state.{index}.{key}", tensor

    @property
    def members(self):
        """An ensemble's members as stored (check them before member_runs reads them)."""
        return self.raw["members"]

    def member_runs(self):
        """An ensemble's members, each as a SavedRun."""
        return [SavedRun(member) for member in self.members]

    def shared_by_members(self):
        """What an ensemble's members must share (SHARED_KEYS), as stored."""
        return {key: self.raw[key] for key in SHARED_KEYS}
