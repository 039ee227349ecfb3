"""Checks of the trainer's parsed flags, one function per concern, run before anything is loaded or
written. A few also write a flag back in its canonical form (the augmentation and class lists, and
--compile that --compile-mode implies), so that a run's configuration is plain, comparable data."""
import math

from data.augment import parse_kinds
from models import resolve_size
from training.config.flags import CUDA_GRAPH_MODES, class_list
from training.errors import UsageError

FINITE_FLAGS = ("--lr", "--dropout", "--weight-decay", "--max-grad-norm", "--warmup-epochs", "--val-fraction",
                "--ema-decay", "--label-smoothing", "--aug-rotate-deg", "--aug-scale", "--aug-jitter")


def check_args(args):
    """Reject values that cannot work, before anything is loaded or written."""
    # In this order: where several flags are wrong, the first of these checks names its own.
    for check in (check_finite, check_counts, canonical_recipe_text, check_recipe_strengths, check_model_size,
                  check_compile, check_parallel_modes, check_cross_validation, check_data_source, check_rates,
                  check_dist_timeout, check_not_negative, check_early_stopping, check_warmup):
        check(args)


def check_finite(args):
    for flag in FINITE_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")


def check_counts(args):
    """Epochs, batches, steps and processes: at least one."""
    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size,
                "--grad-accum-steps": args.grad_accum_steps, "--log-interval": args.log_interval}
    if args.stop_after_epochs is not None:
        positive["--stop-after-epochs"] = args.stop_after_epochs
    if args.nproc_per_node is not None:
        positive["--nproc-per-node"] = args.nproc_per_node
    for flag, value in positive.items():
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")


def canonical_recipe_text(args):
    """--augment and the class lists as canonical text ('rotate,shift'), so configurations stay plain data."""
    try:
        args.augment = ",".join(parse_kinds(args.augment)) or "none"
    except ValueError as exc:
        raise UsageError(f"--augment: {exc}") from None
    args.aug_flip_classes = ",".join(class_list(args.aug_flip_classes, "all")) or "all"
    args.aug_rotate_wide_classes = ",".join(class_list(args.aug_rotate_wide_classes, "none")) or "none"


def check_recipe_strengths(args):
    """The weight average, feature views, label smoothing and the augmentations' strengths."""
    if not 0 <= args.ema_decay < 1:
        raise UsageError(f"--ema-decay must be in [0, 1), got {args.ema_decay}")
    if args.feature_views < 0:
        raise UsageError(f"--feature-views must be 0 (off) or more, got {args.feature_views}")
    if not 0 <= args.label_smoothing < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if not 0 <= args.aug_rotate_deg <= 180 or not 0 <= args.aug_rotate_wide_deg <= 180 \
            or not 0 <= args.aug_scale < 1 or args.aug_jitter < 0 or args.aug_shift_steps < 0:
        raise UsageError("augmentation strengths must be: --aug-rotate-deg and --aug-rotate-wide-deg in [0, 180], "
                         "--aug-scale in [0, 1), --aug-jitter and --aug-shift-steps not negative")


def check_model_size(args):
    """--width, --depth, --heads and --ffn that the chosen model can be built with."""
    try:
        resolve_size(args.model, width=args.width, depth=args.depth, heads=args.heads, ffn=args.ffn)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_compile(args):
    """--compile-mode implies --compile; CUDA graphs do not yet accumulate gradients."""
    if args.compile_mode is not None:
        args.compile = True
    if args.compile_mode in CUDA_GRAPH_MODES and args.grad_accum_steps > 1:
        # A later micro-batch's replay can overwrite what the graph's memory pool still holds for an
        # earlier one (pytorch/pytorch#169545, open): refused until a CUDA test shows such a run
        # equal to eager.
        raise UsageError(f"--compile-mode {args.compile_mode} (CUDA graphs) is not yet shown to accumulate "
                         f"gradients correctly; with --grad-accum-steps {args.grad_accum_steps} use --compile-mode "
                         "default or max-autotune-no-cudagraphs")


def check_parallel_modes(args):
    """What --grad-compression, --amp-dtype and --sync-bn need of --multi-gpu."""
    if args.grad_compression != "none" and args.multi_gpu != "ddp":
        raise UsageError(f"--grad-compression {args.grad_compression} compresses DDP's all-reduce; it needs "
                         f"--multi-gpu ddp (not {args.multi_gpu})")
    if args.multi_gpu == "fsdp" and args.amp_dtype == "fp16":
        raise UsageError("--multi-gpu fsdp with --amp-dtype fp16 is not supported (a GradScaler over sharded "
                         "gradients must agree on overflows across ranks); use --amp-dtype bf16")
    if args.multi_gpu == "fsdp" and args.sync_bn:
        raise UsageError("--sync-bn applies to --multi-gpu ddp; under fsdp BatchNorm keeps each rank's "
                         "statistics and rank 0's are used for evaluation and checkpoints, as under ddp")


def check_cross_validation(args):
    """--cv-folds, and the flags that follow it or that it replaces."""
    if args.cv_folds == 1 or args.cv_folds < 0:
        raise UsageError(f"--cv-folds must be 0 (off) or at least 2, got {args.cv_folds}")
    if args.refit and not args.cv_folds:
        raise UsageError("--refit follows cross-validation (--cv-folds K); one run on every training subject is "
                         "--val-fraction 0")
    if args.ensemble and not args.cv_folds:
        raise UsageError("--ensemble joins the models of a cross-validation; add --cv-folds K")
    if args.cv_folds and args.val_subjects:
        raise UsageError("--cv-folds chooses the validation subjects of each fold; drop --val-subjects")


def check_data_source(args):
    if args.dataset == "synthetic" and args.data_dir:
        raise UsageError("--data-dir is not read with --dataset synthetic; drop one of them")


def check_rates(args):
    """The learning rate and the dropout rate."""
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UsageError(f"--dropout must be in [0, 1), got {args.dropout}")


def check_dist_timeout(args):
    if not args.dist_timeout > 0 or not math.isfinite(args.dist_timeout):
        raise UsageError(f"--dist-timeout must be a positive number of seconds, got {args.dist_timeout}")


def check_not_negative(args):
    for flag, value in {"--weight-decay": args.weight_decay, "--max-grad-norm": args.max_grad_norm,
                        "--num-workers": args.num_workers, "--save-every-steps": args.save_every_steps,
                        "--keep-last": args.keep_last,
                        "--early-stopping-patience": args.early_stopping_patience}.items():
        if value < 0:
            raise UsageError(f"{flag} must not be negative, got {value}")


def check_early_stopping(args):
    """Early stopping reads a validation split."""
    if args.val_fraction == 0 and args.val_subjects is None and args.early_stopping_patience:
        raise UsageError("--early-stopping-patience needs a validation split, and --val-fraction 0 keeps none; "
                         "drop one of them")


def check_warmup(args):
    if args.warmup_epochs is not None:
        if args.warmup_epochs < 0:
            raise UsageError(f"--warmup-epochs must not be negative, got {args.warmup_epochs}")
        if args.warmup_epochs > args.epochs:
            raise UsageError(f"--warmup-epochs {args.warmup_epochs:g} is longer than the run "
                             f"(--epochs {args.epochs}); lower it or train longer")
