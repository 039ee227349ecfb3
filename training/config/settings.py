"""The run's settings, typed and grouped as --help groups the flags, built once at the entry point.

Each field is one flag (its name is the flag's, with `flag` metadata where the field is named
otherwise), so a RunConfig turns into the flat `flag: value` mapping of config.yaml and
checkpoints and back without a table of names.
"""
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Parallel:
    multi_gpu: str  # none | dp | ddp | fsdp
    nproc_per_node: int | None  # ddp or fsdp started without torchrun: processes to launch here
    grad_compression: str  # ddp: none | fp16 | bf16 | powersgd
    reshard_after_forward: bool  # fsdp


@dataclass(frozen=True)
class Hardware:
    device: str  # auto | cuda | cpu
    backend: str  # auto | nccl | gloo
    gpu_ids: list | None
    num_workers: int
    data_path: str  # auto | device | dataloader
    compile: bool
    compile_mode: str | None
    dist_timeout: float  # seconds
    sync_bn: bool


@dataclass(frozen=True)
class Data:
    dataset: str
    data_dir: str | None
    mode: str  # channel layout
    val_fraction: float
    val_subjects: list | None
    no_test: bool
    synthetic_seed: int
    synthetic_windows_per_subject: int


@dataclass(frozen=True)
class Model:
    name: str = field(metadata={"flag": "model"})
    dropout: float | None  # None: the model's own
    norm: str
    width: int | None  # None: the model's own default (models.build_model)
    depth: int | None
    heads: int | None
    ffn: int | None

    def size(self):
        """The size knobs as build_model takes them."""
        return {"width": self.width, "depth": self.depth, "heads": self.heads, "ffn": self.ffn}


@dataclass(frozen=True)
class Recipe:
    """Generalisation to new people."""
    augment: str  # canonical comma-separated kinds, or none
    aug_rotate_deg: float
    aug_scale: float
    aug_jitter: float
    aug_shift_steps: int
    aug_flip_classes: str  # canonical comma-separated class names, or all
    aug_rotate_wide_classes: str  # canonical comma-separated class names, or none
    aug_rotate_wide_deg: float
    ema_decay: float
    label_smoothing: float
    feature_views: int  # minirocket: views of the training windows transformed once; 0 transforms every batch
    cv_folds: int
    refit: bool  # after the folds, one model on every training subject
    ensemble: bool  # after the folds, their models (and the refit) as one checkpoint


@dataclass(frozen=True)
class Optimisation:
    epochs: int
    batch_size: int  # per GPU, per process on CPU
    lr: float  # reference LR of one device without accumulation
    lr_scaling: str
    warmup_epochs: float | None
    weight_decay: float
    grad_accum_steps: int
    max_grad_norm: float
    amp: bool | None
    amp_dtype: str | None
    early_stopping_patience: int
    seed: int


@dataclass(frozen=True)
class Output:
    """Checkpoints and logging."""
    save_dir: str | None
    resume: str | None  # auto, a path, or None (--no-resume)
    save_every_steps: int
    keep_last: int
    stop_after_epochs: int | None
    log_interval: int
    figures: bool  # curves and confusion matrix PNGs at the end of a run


@dataclass(frozen=True)
class RunConfig:
    parallel: Parallel
    hardware: Hardware
    data: Data
    model: Model
    recipe: Recipe
    optim: Optimisation
    output: Output

    @classmethod
    def from_flags(cls, flags):
        """From a mapping of flag names (dests) to values; keys that are not settings are ignored."""
        return cls(**{group.name: group.type(**{item.name: flags[_flag(item)] for item in fields(group.type)})
                      for group in fields(cls)})

    def flags(self):
        """The flat `flag: value` mapping (plain data: config.yaml, checkpoints)."""
        return {_flag(item): getattr(getattr(self, group.name), item.name)
                for group in fields(self) for item in fields(group.type)}

    def replace(self, **flags):
        """A copy with some flags changed, named as on the command line (with underscores)."""
        unknown = set(flags) - set(self.flags())
        if unknown:
            raise TypeError(f"not settings of a run: {', '.join(sorted(unknown))}")
        return RunConfig.from_flags({**self.flags(), **flags})


def _flag(item):
    return item.metadata.get("flag", item.name)
