"""The run's settings: one dataclass field per flag, holding its default and help, grouped as --help
groups them, and `validate()`, the one place that says which values can work, through the checks of
training/config/checks.py (whether the machine can serve them is asked by training/distributed/strategy.py's
check_parallel_args).

The command line (training.config.cli) is generated from these fields; a field's type is its flag's.
A RunConfig turns into the flat `flag: value` mapping of config.yaml and checkpoints and back
(`flags()`, `from_flags()`), so a saved run rebuilds the same class with today's defaults for
settings it predates.
"""
import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace

from data.augment import AUGMENTATIONS, AugmentConfig, parse_kinds
from data.sources import dataset_choices
from data.splits import CHANNEL_MODES
from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT
from models import MODELS, NORMS, build_model
from training.config.checks import CUDA_GRAPH_MODES, SHARDED_OR_DDP, VALIDATION_ORDER, class_list

DEFAULT_WARMUP_EPOCHS = 2.0
DEFAULT_LR = 1e-3  # the LR for a global batch of DEFAULT_BATCH (one device at the default --batch-size)
DEFAULT_BATCH = 32
# The default recipe, chosen by nested subject-wise cross-validation on real recordings
# (docs/training.md, "Models that work on new people").
DEFAULT_MODEL = "minirocket"
# Flip only laying windows: people lie face up or face down, while the tilt of a phone on the waist
# helps to tell sitting from standing, so turning those would blur them (docs/training.md).
DEFAULT_FLIP_CLASSES = "LAYING"
# Turn the moving activities' windows further: how the phone sits differs between people by more
# than the forward lean that upstairs adds, so the tilt must not decide among them (docs/training.md).
DEFAULT_ROTATE_WIDE_CLASSES = "WALKING,WALKING_UPSTAIRS,WALKING_DOWNSTAIRS"

MULTI_GPU_MODES = ("none", "dp", *SHARDED_OR_DDP)
# torch.compile's modes; the last two capture CUDA graphs.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", *CUDA_GRAPH_MODES)
_AUGMENT = AugmentConfig()


def setting(default, help=None, **flag):
    """A field: its default, its --help text, and how its flag differs from the plain one the field's
    type gives (choices, parse: a text-to-value function, metavar, flag: the flag's name when the field
    is named otherwise, off: a second flag that sets it to None)."""
    return field(default=default, metadata={"help": help, **flag})


def subject_list(text):
    try:
        subjects = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated subject ids such as 3,7,15, got {text!r}") from None
    if not subjects:
        raise argparse.ArgumentTypeError("expected at least one subject id")
    return subjects


def gpu_id_list(text):
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices such as 0,1, got {text!r}") from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative GPU indices, got {text!r}")
    return ids


@dataclass(frozen=True)
class Parallel:
    """How several GPUs (or processes) share the work: main_multi_gpu.py only."""
    multi_gpu: str = setting("none", "none: one device; dp: nn.DataParallel in one process; ddp: "
                             "DistributedDataParallel, one process per GPU (under torchrun); fsdp: FSDP2, parameters, "
                             "gradients and optimizer state sharded over the processes", choices=MULTI_GPU_MODES)
    nproc_per_node: int | None = setting(None, "ddp or fsdp without torchrun: processes to launch on this machine "
                                               "(default: the GPUs in use, or 1 on CPU)")
    grad_compression: str = setting("none", "ddp: send gradients as fp16 or bf16 (half the bytes; bf16 where the "
                                    "backend can sum it) or PowerSGD's rank-1 approximation, through DDP's "
                                    "communication hooks", choices=("none", "fp16", "bf16", "powersgd"))
    pool_head: str = setting("replicated", "ddp, a head trained over a feature pool (the default model): "
                             "replicated: every rank steps the whole global batch from its whole pool, so no "
                             "gradient crosses between ranks (the head's all-reduce takes longer than its step); "
                             "ddp: each rank steps its share and DDP all-reduces the gradients",
                             choices=("replicated", "ddp"))
    reshard_after_forward: bool = setting(True, "fsdp: free gathered parameters after each block's forward and "
                                          "gather them again for its backward (less memory); "
                                          "--no-reshard-after-forward keeps them (fewer all-gathers)")


@dataclass(frozen=True)
class Hardware:
    """Devices, processes, data loading and compilation."""
    device: str = setting("auto", "auto picks CUDA when a GPU is visible", choices=("auto", "cuda", "cpu"))
    backend: str = setting("auto", "ddp process-group backend; auto: nccl on CUDA, gloo on CPU",
                           choices=("auto", "nccl", "gloo"))
    gpu_ids: list | None = setting(None, "comma-separated GPU indices to use, e.g. 0,1,3 (default: all visible)",
                                   parse=gpu_id_list)
    num_workers: int = setting(0, "DataLoader worker processes per GPU/process; the data is already in memory, "
                               "so 0 is usually fastest")
    data_path: str = setting("auto", "device: the splits live on the device and batches are cut there (no "
                             "workers, no per-batch copies); dataloader: a DataLoader copies each batch; auto: "
                             "device unless --num-workers > 0 or the splits would take over a quarter of the free "
                             "GPU memory", choices=("auto", "device", "dataloader"))
    compile: bool = setting(False, "torch.compile the model")
    compile_mode: str | None = setting(None, "torch.compile mode (implies --compile); reduce-overhead replays CUDA "
                                       "graphs, which removes most kernel-launch cost from a small model's step "
                                       "(CUDA only)", choices=COMPILE_MODES)
    cuda_graphs: bool | None = setting(None, "record each optimizer step (augmentations, forward, loss, "
                                       "backward, clipping, AdamW, weight average) as one CUDA graph and replay it "
                                       "per batch, so a small model's step stops waiting on the host (default: on "
                                       "for cnn1d and minirocket where the step can be recorded: one process on "
                                       "one GPU, bf16 or fp32, no accumulation, no --compile; asked for where it "
                                       "cannot be, it warns and runs eagerly)")
    dist_timeout: float = setting(600.0, "ddp: seconds a collective may wait for the other ranks before the run "
                                  "stops with an error (a stuck or dead rank)")
    sync_bn: bool = setting(False, "ddp on CUDA: synchronise BatchNorm statistics across processes")
    deterministic: bool = setting(False, "the same kernels every run, so that a repeated or resumed run on a GPU "
                                  "gives the same weights bit for bit: deterministic cuDNN and PyTorch "
                                  "algorithms (a warning for an operation that has none), no cuDNN autotuning, "
                                  "a fixed cuBLAS workspace; slower")


@dataclass(frozen=True)
class Data:
    """Which windows, and how the training subjects split into training and validation."""
    dataset: str = setting("auto", "auto: the kind of data --data-dir holds (a store's folder, the UCI HAR "
                           "Dataset, an .npz file of windows, a folder of labelled recordings), the built-in "
                           "synthetic data when no --data-dir is given (see docs/using_a_model.md); a store is "
                           "streamed from disk", choices=dataset_choices)
    data_dir: str | None = setting(None, "the data: the 'UCI HAR Dataset' folder or the folder that holds it, an .npz "
                                   "file of windows, a store's folder, or a folder of labelled recordings")
    description: str | None = setting(None, "with --dataset npz or recordings: a JSON file that describes the "
                                      "windows (channels "
                                      "with sensor, axis and unit; the rate; each class's label value; the values "
                                      "that mean no class); see docs/using_a_model.md")
    mode: str = setting("flatten", "channels: flatten = all 9; average = x,y,z averaged over the three sensors "
                        "(3); first = body_acc x,y,z (3)", choices=CHANNEL_MODES)
    val_fraction: float = setting(0.2, "share of the training subjects held out (whole subjects) for validation; 0 "
                                  "trains on every subject, and best.pt is then the last epoch's (averaged) weights")
    val_subjects: list | None = setting(None, "comma-separated training subject ids to validate on, instead of a "
                                        "random --val-fraction of them",
                                        parse=subject_list)
    val_split: str = setting("subjects", "how validation is held out: subjects = whole training subjects; time = "
                             "the last --val-fraction of each training subject's windows, in the order the data "
                             "holds them (one person's recording)", choices=("subjects", "time"))
    no_test: bool = setting(False, "never evaluate the test split (e.g. while choosing a recipe)")
    synthetic_seed: int = setting(0, "seed of the synthetic dataset (separate from --seed so runs compare on the "
                                  "same data)")
    synthetic_windows_per_subject: int = setting(DEFAULT_WINDOWS_PER_SUBJECT,
                                                 "synthetic windows per subject (30 subjects)")


@dataclass(frozen=True)
class Model:
    """The network and its size."""
    name: str = setting(DEFAULT_MODEL, "the network, from the models/ registry", choices=lambda: tuple(MODELS),
                        flag="model")
    dropout: float | None = setting(None, "dropout rate (default: the model's own, 0 for minirocket's head, 0.1 "
                                    "for the others)")
    norm: str = setting("batch", "normalisation in the convolutional layers; group and none do not depend on the "
                        "batch split", choices=NORMS)
    width: int | None = setting(None, "transformer: d_model (64); cnn1d: channels of its widest layers (128); "
                                "cnn_lstm: filters and LSTM units (64); minirocket: about this many random-kernel "
                                "features (10000)")
    depth: int | None = setting(None, "transformer: encoder blocks (2)")
    heads: int | None = setting(None, "transformer: attention heads (4); --width must be divisible by it")
    ffn: int | None = setting(None, "transformer: hidden size of each block's feed-forward layer (2 x width)")

    def size(self):
        """The size knobs as build_model takes them."""
        return {"width": self.width, "depth": self.depth, "heads": self.heads, "ffn": self.ffn}

    def build(self, in_channels, num_classes, window_steps=128):
        """The network these settings describe: the one way a config becomes a model (a run, a
        checkpoint read back, a benchmark)."""
        return build_model(self.name, in_channels, num_classes, dropout=self.dropout, norm=self.norm,
                           window_steps=window_steps, **self.size())


@dataclass(frozen=True)
class Recipe:
    """Augmentation, the weight average, label smoothing, feature views and cross-validation."""
    recipe_choice: str = setting("validation", "minirocket over a feature pool: validation = after the epochs, "
                                 "train the head once more on the windows as they are (no augmentation) and keep "
                                 "whichever the validation people score higher (one line says which and why); "
                                 "fixed = the augmentations as --augment sets them",
                                 choices=("validation", "fixed"))
    augment: str = setting("rotate,flip,scale,jitter,shift", "training-batch augmentations, comma-separated from "
                           f"{','.join(AUGMENTATIONS)}, or none; drawn on the device per (seed, epoch, rank)")
    aug_rotate_deg: float = setting(_AUGMENT.rotate_deg, "rotate: largest angle of the random 3-D rotation applied "
                                    "to every sensor's x/y/z together (device placement differs between people)")
    aug_scale: float = setting(_AUGMENT.scale, "scale: amplitude factor drawn uniformly from 1 +- this, one per "
                               "window")
    aug_jitter: float = setting(_AUGMENT.jitter, "jitter: Gaussian noise in units of each channel's standard "
                                "deviation")
    aug_shift_steps: int = setting(_AUGMENT.shift_steps, "shift: circular time shift of up to this many samples")
    aug_flip_classes: str = setting(DEFAULT_FLIP_CLASSES, "flip: comma-separated classes whose windows it may turn "
                                    "(e.g. LAYING: people lie face up or down), or all")
    aug_rotate_wide_classes: str = setting(DEFAULT_ROTATE_WIDE_CLASSES, "rotate: comma-separated classes whose "
                                           "windows turn by up to --aug-rotate-wide-deg instead, or none")
    aug_rotate_wide_deg: float = setting(_AUGMENT.rotate_wide_deg, "rotate: largest angle for the windows of "
                                         "--aug-rotate-wide-classes")
    ema_decay: float = setting(0.998, "decay per optimizer step of the weights' moving average used for "
                               "validation, best.pt and the test; 0 turns it off")
    label_smoothing: float | None = setting(None, "cross-entropy label smoothing (default: the model's own, 0.2 for "
                                            "minirocket's head, 0.1 for the others)")
    feature_views: int | None = setting(None, "minirocket: transform the training windows once, as this many "
                                        "views (the first as they are, the others through --augment), each epoch "
                                        "training the head on the next view; the validation and test windows once "
                                        "too (default: the model's own, 4 for minirocket). 0: transform every batch "
                                        "of every epoch afresh, with new augmentations; a model without fixed "
                                        "features takes no other value")
    cv_folds: int = setting(0, "K > 1: subject-wise cross-validation, K models each validated on one fold of whole "
                            "training subjects (in <save-dir>/fold-k/), summary in cv_report.json; under torchrun "
                            "the folds run concurrently, one process per GPU")
    refit: bool = setting(False, "with --cv-folds: also train one model on every training subject (no validation "
                          "hold-out, --epochs epochs) in <save-dir>/refit/, a job beside the folds")
    ensemble: bool = setting(False, "with --cv-folds: also write <save-dir>/ensemble.pt, the fold models (and the "
                             "refit) averaging their probabilities, and its test report; predict.py and export.py "
                             "take it")

    @property
    def augment_config(self):
        """The AugmentConfig these settings describe, or None when no augmentation is on."""
        kinds = parse_kinds(self.augment)
        if not kinds:
            return None
        return AugmentConfig(kinds, rotate_deg=self.aug_rotate_deg, scale=self.aug_scale, jitter=self.aug_jitter,
                             shift_steps=self.aug_shift_steps, flip_classes=class_list(self.aug_flip_classes, "all"),
                             rotate_wide_classes=class_list(self.aug_rotate_wide_classes, "none"),
                             rotate_wide_deg=self.aug_rotate_wide_deg)


@dataclass(frozen=True)
class Optimisation:
    """Epochs, batch, learning rate and its schedule, precision, seed."""
    epochs: int = setting(20, "passes over the training windows")
    batch_size: int = setting(DEFAULT_BATCH, "per GPU (per process on CPU)")
    lr: float = setting(DEFAULT_LR, "the learning rate for a global batch of --lr-reference-batch samples")
    lr_reference_batch: int = setting(
        DEFAULT_BATCH, "the global batch --lr is meant for (default: the default --batch-size, so --lr is one device's "
                       "at that batch); the peak lr scales with the global batch (--batch-size x GPUs x "
                       "--grad-accum-steps) against it, however the batch is split")
    lr_scaling: str = setting("linear", "peak lr = lr x (global batch / --lr-reference-batch), its square root, "
                              "or lr", choices=("linear", "sqrt", "none"))
    warmup_epochs: float | None = setting(
        None, f"linear warmup, may be fractional (default: {DEFAULT_WARMUP_EPOCHS:g}, or a fifth of the run when that "
              "is shorter)")
    weight_decay: float = setting(1e-4, "AdamW weight decay, applied to weight matrices and kernels only")
    grad_accum_steps: int = setting(1, "micro-batches per optimizer step")
    max_grad_norm: float = setting(1.0, "gradient clipping; 0 disables")
    amp: bool | None = setting(None, "mixed precision (default: on for CUDA, off for CPU)")
    amp_dtype: str | None = setting(None, "default: bf16 where supported, else fp16 with a GradScaler; CPU: bf16",
                                    choices=("bf16", "fp16"))
    head_fit: str = setting("auto", "minirocket's linear head: ridge = solved by ridge regression on the training "
                            "windows (its strength by the error on each person left out; no epochs, views or "
                            "augmentation); adamw = trained by AdamW over --epochs; auto = ridge for a training "
                            "split of at most 1,024 windows, else adamw", choices=("auto", "adamw", "ridge"))
    final_model: str = setting("everyone", "what best.pt holds where validation people choose: everyone = minirocket's "
                               "head trained again on every training person, validation people included, for the "
                               "epochs validation chose (the temperature stays the one fitted on them); validated = "
                               "the weights validation chose, as trained without those people",
                               choices=("everyone", "validated"))
    early_stopping_patience: int = setting(0, "stop after this many epochs without a better validation macro-F1; "
                                           "0 = off")
    seed: int = setting(42, "initial weights, shuffling, dropout, augmentation, validation subjects and "
                        "cross-validation folds")

    @property
    def planned_warmup_epochs(self):
        """The warmup to use: as given, else the default capped at a fifth of the run."""
        return self.warmup_epochs if self.warmup_epochs is not None else min(DEFAULT_WARMUP_EPOCHS, self.epochs / 5)


@dataclass(frozen=True)
class Output:
    """What a run writes, where, how often, and resuming."""
    save_dir: str | None = setting(None, "checkpoints, logs and reports (default: checkpoints/<single|dp|ddp|fsdp>)")
    resume: str | None = setting("auto", "auto: continue from <save-dir>/last.pt when it exists; PATH: that "
                                 "checkpoint", metavar="{auto,PATH}",
                                 off=("--no-resume", "start from scratch even if <save-dir>/last.pt exists"))
    save_every_steps: int = setting(0, "also checkpoint every N optimizer steps inside an epoch (0: only at epoch "
                                    "ends); a killed run then loses fewer than N steps")
    keep_last: int = setting(2, "numbered checkpoints (step-XXXXXXXX.pt) kept beside last.pt and best.pt; a "
                             "corrupt last.pt falls back to them; 0 keeps none")
    stop_after_epochs: int | None = setting(None, "leave after this many epochs of this invocation, with the "
                                            "schedule still planned for --epochs; resume later to continue")
    log_interval: int = setting(10, "optimizer steps between progress-bar and TensorBoard loss updates")
    figures: bool = setting(True, "draw curves.png and confusion_matrix.png (cv_confusion_matrix.png for "
                            "--cv-folds) at the end of a run; --no-figures leaves matplotlib out, e.g. for sweeps")


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run. RunConfig() is main.py's defaults; validate() before use."""
    parallel: Parallel = field(default_factory=Parallel, metadata={"title": "multi-GPU"})
    hardware: Hardware = field(default_factory=Hardware, metadata={"title": "hardware"})
    data: Data = field(default_factory=Data, metadata={"title": "data"})
    model: Model = field(default_factory=Model, metadata={"title": "model"})
    recipe: Recipe = field(default_factory=Recipe, metadata={"title": "generalisation to new people"})
    optim: Optimisation = field(default_factory=Optimisation, metadata={"title": "optimisation"})
    output: Output = field(default_factory=Output, metadata={"title": "checkpoints and logging"})

    @classmethod
    def from_flags(cls, flags):
        """From a mapping of flag names (dests) to values; keys that are not settings are ignored and
        settings it lacks (a run saved before they existed) take their defaults."""
        return cls(**{group.name: group.type(**{item.name: flags[flag] for flag, item in items if flag in flags})
                      for group, items in flag_groups()})

    def flags(self):
        """The flat `flag: value` mapping (plain data: config.yaml, checkpoints)."""
        return {flag: getattr(getattr(self, group.name), item.name) for group, items in flag_groups()
                for flag, item in items}

    def replace(self, **flags):
        """A copy with some flags changed, named as on the command line (with underscores)."""
        unknown = set(flags) - set(self.flags())
        if unknown:
            raise TypeError(f"not settings of a run: {', '.join(sorted(unknown))}")
        return RunConfig.from_flags({**self.flags(), **flags})

    def validate(self):
        """This config with its lists in canonical text and --compile as --compile-mode implies it, or a
        one-line UsageError for the first value that cannot work, before anything is loaded or written."""
        values = SimpleNamespace(**self.flags())
        for check in VALIDATION_ORDER:  # training/config/checks.py
            check(values)
        return RunConfig.from_flags(vars(values))

    @property
    def save_dir(self):
        """--save-dir, else checkpoints/<single|dp|ddp|fsdp> after the parallel mode."""
        if self.output.save_dir:
            return Path(self.output.save_dir)
        return Path("checkpoints") / {"none": "single"}.get(self.parallel.multi_gpu, self.parallel.multi_gpu)

    def data_options(self, **overrides):
        """The keyword arguments of data.sources.load_har_data (DataOptions' fields) that the settings describe."""
        data = self.data
        options = {"dataset": data.dataset, "data_dir": data.data_dir, "mode": data.mode,
                   "val_fraction": data.val_fraction, "split_seed": self.optim.seed,
                   "synthetic_seed": data.synthetic_seed, "val_subjects": data.val_subjects,
                   "synthetic_windows_per_subject": data.synthetic_windows_per_subject, "val_split": data.val_split,
                   "description": data.description}
        return {**options, **overrides}


def flag_groups():
    """[(group field, [(flag, field), ...]), ...] in --help's order: what the command line and the
    flat mapping are made of. A field's flag (its dest) is its name unless its metadata names another."""
    return [(group, [(item.metadata.get("flag", item.name), item) for item in fields(group.type)])
            for group in fields(RunConfig)]
