"""The one command-line parser both entry points share, grouped as --help shows it."""
import argparse
import math
import sys
from pathlib import Path

from data.augment import AUGMENTATIONS, AugmentConfig, parse_kinds
from data.splits import CHANNEL_MODES
from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT
from models import MODELS, NORMS, resolve_size
from training.config.files import IMPLIED_BY_MAIN, parse_with_config
from training.config.settings import RunConfig
from training.errors import UsageError

DEFAULT_WARMUP_EPOCHS = 2.0
DEFAULT_LR = 1e-3  # the reference LR of one device at the default --batch-size
# The default recipe, chosen by 7-fold subject-wise cross-validation on real recordings
# (docs/training.md, "Models that work on new people").
DEFAULT_MODEL = "minirocket"  # chosen by nested subject-wise evaluation (docs/training.md)
DEFAULT_AUGMENT = "rotate,flip,scale,jitter,shift"
# Flip only laying windows: people lie face up or face down, while the tilt of a phone on the waist
# helps to tell sitting from standing, so turning those would blur them (docs/training.md).
DEFAULT_FLIP_CLASSES = "LAYING"
# Turn the moving activities' windows further: how the phone sits differs between people by more
# than the forward lean that upstairs adds, so the tilt must not decide among them (docs/training.md).
DEFAULT_ROTATE_WIDE_CLASSES = "WALKING,WALKING_UPSTAIRS,WALKING_DOWNSTAIRS"
DEFAULT_EMA_DECAY = 0.998
DEFAULT_LABEL_SMOOTHING = 0.1
# Views of the training windows MiniRocket transforms once (training.feature_pool), chosen on the
# nested subject-wise estimate (docs/training.md).
DEFAULT_FEATURE_VIEWS = 4


MULTI_GPU_MODES = ("none", "dp", "ddp", "fsdp")
SHARDED_OR_DDP = ("ddp", "fsdp")  # one process per device, started by torchrun
GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
# The flags only main_multi_gpu.py's parser has.
MULTI_GPU_ONLY_FLAGS = ("--multi-gpu", "--nproc-per-node", "--grad-compression", "--reshard-after-forward",
                        "--no-reshard-after-forward")

# torch.compile's modes; the last two capture CUDA graphs.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def build_parser(multi_gpu):
    """multi_gpu=True adds the --multi-gpu group used by main_multi_gpu.py."""
    prog = "main_multi_gpu.py" if multi_gpu else "main.py"
    parser = argparse.ArgumentParser(
        prog=prog, description="Train a Human Activity Recognition model on UCI HAR or synthetic data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    if multi_gpu:
        group = parser.add_argument_group("multi-GPU")
        group.add_argument("--multi-gpu", choices=MULTI_GPU_MODES, default="none",
                           help="none: one device; dp: nn.DataParallel in one process; ddp: "
                                "DistributedDataParallel, one process per GPU (under torchrun); fsdp: FSDP2, "
                                "parameters, gradients and optimizer state sharded over the processes")
        group.add_argument("--grad-compression", choices=GRAD_COMPRESSIONS, default="none",
                           help="ddp: send gradients as fp16 or bf16 (half the bytes; bf16 where the backend can "
                                "sum it) or PowerSGD's rank-1 approximation, through DDP's communication hooks")
        group.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                           help="fsdp: free gathered parameters after each block's forward and gather them again "
                                "for its backward (less memory); --no-reshard-after-forward keeps them (fewer "
                                "all-gathers)")
        group.add_argument("--nproc-per-node", type=int, default=None,
                           help="ddp or fsdp without torchrun: processes to launch on this machine "
                                "(default: the GPUs in use, or 1 on CPU)")

    group = parser.add_argument_group("hardware")
    group.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto picks CUDA when a GPU is visible")
    group.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                       help="ddp process-group backend; auto: nccl on CUDA, gloo on CPU")
    group.add_argument("--gpu-ids", type=_gpu_id_list, default=None,
                       help="comma-separated GPU indices to use, e.g. 0,1,3 (default: all visible)")
    group.add_argument("--num-workers", type=int, default=0,
                       help="DataLoader worker processes per GPU/process; the data is already in "
                            "memory, so 0 is usually fastest")
    group.add_argument("--data-path", choices=("auto", "device", "dataloader"), default="auto",
                       help="device: the splits live on the device and batches are cut there (no "
                            "workers, no per-batch copies); dataloader: a DataLoader copies each batch; "
                            "auto: device unless --num-workers > 0 or the splits would take over a "
                            "quarter of the free GPU memory")
    group.add_argument("--compile", action="store_true", help="torch.compile the model")
    group.add_argument("--compile-mode", choices=COMPILE_MODES, default=None,
                       help="torch.compile mode (implies --compile); reduce-overhead replays CUDA graphs, "
                            "which removes most kernel-launch cost from a small model's step (CUDA only)")
    group.add_argument("--dist-timeout", type=float, default=600.0,
                       help="ddp: seconds a collective may wait for the other ranks before the run "
                            "stops with an error (a stuck or dead rank)")
    group.add_argument("--sync-bn", action="store_true",
                       help="ddp on CUDA: synchronise BatchNorm statistics across processes")

    group = parser.add_argument_group("data")
    group.add_argument("--dataset", choices=("auto", "uci-har", "synthetic", "npz", "store"), default="auto",
                       help="auto: UCI HAR when --data-dir holds it, else the built-in synthetic data; "
                            "npz: your own windows in an .npz file (see docs/using_a_model.md); store: a "
                            "window store made by python -m data.build_store, streamed from disk")
    group.add_argument("--data-dir", default=None,
                       help="the 'UCI HAR Dataset' folder or the folder that holds it; with --dataset npz, "
                            "the .npz file; with --dataset store, the store's folder")
    group.add_argument("--mode", choices=CHANNEL_MODES, default="flatten",
                       help="channels: flatten = all 9; average = x,y,z averaged over the three "
                            "sensors (3); first = body_acc x,y,z (3)")
    group.add_argument("--val-fraction", type=float, default=0.2,
                       help="share of the training subjects held out (whole subjects) for validation; 0 trains "
                            "on every subject, and best.pt is then the last epoch's (averaged) weights")
    group.add_argument("--val-subjects", type=_subject_list, default=None,
                       help="comma-separated training subject ids to validate on, instead of a random "
                            "--val-fraction of them")
    group.add_argument("--no-test", action="store_true",
                       help="never evaluate the test split (e.g. while choosing a recipe)")
    group.add_argument("--synthetic-seed", type=int, default=0,
                       help="seed of the synthetic dataset (separate from --seed so runs compare "
                            "on the same data)")
    group.add_argument("--synthetic-windows-per-subject", type=int, default=DEFAULT_WINDOWS_PER_SUBJECT,
                       help="synthetic windows per subject (30 subjects)")

    group = parser.add_argument_group("model")
    group.add_argument("--model", choices=tuple(MODELS), default=DEFAULT_MODEL)
    group.add_argument("--dropout", type=float, default=0.1)
    group.add_argument("--norm", choices=NORMS, default="batch",
                       help="normalisation in the convolutional layers; group and none do not "
                            "depend on the batch split")
    group.add_argument("--width", type=int, default=None,
                       help="transformer: d_model (64); cnn1d: channels of its widest layers (128); cnn_lstm: "
                            "filters and LSTM units (64); minirocket: about this many random-kernel features "
                            "(10000)")
    group.add_argument("--depth", type=int, default=None, help="transformer: encoder blocks (2)")
    group.add_argument("--heads", type=int, default=None,
                       help="transformer: attention heads (4); --width must be divisible by it")
    group.add_argument("--ffn", type=int, default=None,
                       help="transformer: hidden size of each block's feed-forward layer (2 x width)")

    group = parser.add_argument_group("generalisation to new people")
    group.add_argument("--augment", default=DEFAULT_AUGMENT,
                       help=f"training-batch augmentations, comma-separated from {','.join(AUGMENTATIONS)}, "
                            "or none; drawn on the device per (seed, epoch, rank)")
    defaults = AugmentConfig()
    group.add_argument("--aug-rotate-deg", type=float, default=defaults.rotate_deg,
                       help="rotate: largest angle of the random 3-D rotation applied to every sensor's "
                            "x/y/z together (device placement differs between people)")
    group.add_argument("--aug-rotate-wide-classes", default=DEFAULT_ROTATE_WIDE_CLASSES,
                       help="rotate: comma-separated classes whose windows turn by up to --aug-rotate-wide-deg "
                            "instead, or none")
    group.add_argument("--aug-rotate-wide-deg", type=float, default=defaults.rotate_wide_deg,
                       help="rotate: largest angle for the windows of --aug-rotate-wide-classes")
    group.add_argument("--aug-scale", type=float, default=defaults.scale,
                       help="scale: amplitude factor drawn uniformly from 1 +- this, one per window")
    group.add_argument("--aug-jitter", type=float, default=defaults.jitter,
                       help="jitter: Gaussian noise in units of each channel's standard deviation")
    group.add_argument("--aug-shift-steps", type=int, default=defaults.shift_steps,
                       help="shift: circular time shift of up to this many samples")
    group.add_argument("--aug-flip-classes", default=DEFAULT_FLIP_CLASSES,
                       help="flip: comma-separated classes whose windows it may turn (e.g. LAYING: people lie "
                            "face up or down), or all")
    group.add_argument("--ema-decay", type=float, default=DEFAULT_EMA_DECAY,
                       help="decay per optimizer step of the weights' moving average used for validation, "
                            "best.pt and the test; 0 turns it off")
    group.add_argument("--label-smoothing", type=float, default=DEFAULT_LABEL_SMOOTHING,
                       help="cross-entropy label smoothing")
    group.add_argument("--feature-views", type=int, default=DEFAULT_FEATURE_VIEWS,
                       help="minirocket: transform the training windows once, as this many views (the first "
                            "as they are, the others through --augment), each epoch training the head on the "
                            "next view; the validation and test windows once too. 0: transform every batch "
                            "of every epoch afresh, with new augmentations")
    group.add_argument("--cv-folds", type=int, default=0,
                       help="K > 1: subject-wise cross-validation, K models each validated on one fold of "
                            "whole training subjects (in <save-dir>/fold-k/), summary in cv_report.json; "
                            "under torchrun the folds run concurrently, one process per GPU")
    group.add_argument("--refit", action="store_true",
                       help="with --cv-folds: also train one model on every training subject (no validation "
                            "hold-out, --epochs epochs) in <save-dir>/refit/, a job beside the folds")
    group.add_argument("--ensemble", action="store_true",
                       help="with --cv-folds: also write <save-dir>/ensemble.pt, the fold models (and the refit) "
                            "averaging their probabilities, and its test report; predict.py and export.py take it")

    group = parser.add_argument_group("optimisation")
    group.add_argument("--epochs", type=int, default=20)
    group.add_argument("--batch-size", type=int, default=32, help="per GPU (per process on CPU)")
    group.add_argument("--lr", type=float, default=DEFAULT_LR,
                       help="reference learning rate for ONE device with no accumulation")
    group.add_argument("--lr-scaling", choices=("linear", "sqrt", "none"), default="linear",
                       help="peak lr = lr x (global batch / batch size), its square root, or lr")
    group.add_argument("--warmup-epochs", type=float, default=None,
                       help=f"linear warmup, may be fractional (default: {DEFAULT_WARMUP_EPOCHS:g}, "
                            "or a fifth of the run when that is shorter)")
    group.add_argument("--weight-decay", type=float, default=1e-4,
                       help="AdamW weight decay, applied to weight matrices and kernels only")
    group.add_argument("--grad-accum-steps", type=int, default=1,
                       help="micro-batches per optimizer step")
    group.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping; 0 disables")
    group.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                       help="mixed precision (default: on for CUDA, off for CPU)")
    group.add_argument("--amp-dtype", choices=("bf16", "fp16"), default=None,
                       help="default: bf16 where supported, else fp16 with a GradScaler; CPU: bf16")
    group.add_argument("--early-stopping-patience", type=int, default=0,
                       help="stop after this many epochs without a better validation macro-F1; 0 = off")
    group.add_argument("--seed", type=int, default=42, help="initialisation, shuffling and dropout")

    group = parser.add_argument_group("checkpoints and logging")
    group.add_argument("--config", default=None, metavar="FILE",
                       help="YAML or JSON file of flags (batch_size: 64 or batch-size: 64); flags given on "
                            "the command line win. Every run writes its own to <save-dir>/config.yaml")
    group.add_argument("--save-dir", default=None,
                       help="checkpoints, logs and reports (default: checkpoints/<single|dp|ddp|fsdp>)")
    group.add_argument("--resume", default="auto", metavar="{auto,PATH}",
                       help="auto: continue from <save-dir>/last.pt when it exists; PATH: that checkpoint")
    group.add_argument("--no-resume", dest="resume", action="store_const", const=None,
                       help="start from scratch even if <save-dir>/last.pt exists")
    group.add_argument("--save-every-steps", type=int, default=0,
                       help="also checkpoint every N optimizer steps inside an epoch (0: only at epoch "
                            "ends); a killed run then loses fewer than N steps")
    group.add_argument("--keep-last", type=int, default=2,
                       help="numbered checkpoints (step-XXXXXXXX.pt) kept beside last.pt and best.pt; "
                            "a corrupt last.pt falls back to them; 0 keeps none")
    group.add_argument("--stop-after-epochs", type=int, default=None,
                       help="leave after this many epochs of this invocation, with the schedule "
                            "still planned for --epochs; resume later to continue")
    group.add_argument("--log-interval", type=int, default=10,
                       help="optimizer steps between progress-bar and TensorBoard loss updates")
    group.add_argument("--figures", action=argparse.BooleanOptionalAction, default=True,
                       help="draw curves.png and confusion_matrix.png (cv_confusion_matrix.png for --cv-folds) "
                            "at the end of a run; --no-figures leaves matplotlib out, e.g. for sweeps")
    group.add_argument("--debug", action="store_true",
                       help="show full tracebacks instead of one-line errors")
    return parser


def parse_config(argv=None, multi_gpu=False):
    """The RunConfig of a command line (after its --config file's flags): what an entry point builds."""
    return RunConfig.from_flags(vars(parse_args(argv, multi_gpu)))


def parse_args(argv=None, multi_gpu=False):
    """The checked flags of a command line (after its --config file's flags), as argparse gives them."""
    try:
        args = parse_with_config(build_parser(multi_gpu), argv)
    except UsageError:
        if not multi_gpu:
            _point_to_multi_gpu_entry(sys.argv[1:] if argv is None else argv)
        raise
    if not multi_gpu:
        vars(args).update(IMPLIED_BY_MAIN)
    check_args(args)
    return args


def _point_to_multi_gpu_entry(argv):
    """A flag of main_multi_gpu.py given to main.py: say which command takes it, rather than argparse's
    'unrecognized arguments'."""
    for token in map(str, argv):
        flag = token.split("=", 1)[0]
        if flag in MULTI_GPU_ONLY_FLAGS:
            raise UsageError(f"main.py trains on one device and has no {flag}; for several GPUs run "
                             "python main_multi_gpu.py --multi-gpu dp [flags] (DataParallel, one process), or "
                             "torchrun --nproc_per_node=N main_multi_gpu.py --multi-gpu ddp (or fsdp) [flags]")


def check_args(args):
    """Reject values that cannot work, before anything is loaded or written."""
    for flag in ("--lr", "--dropout", "--weight-decay", "--max-grad-norm", "--warmup-epochs", "--val-fraction",
                 "--ema-decay", "--label-smoothing", "--aug-rotate-deg", "--aug-scale", "--aug-jitter"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
    positive = {"--epochs": args.epochs, "--batch-size": args.batch_size,
                "--grad-accum-steps": args.grad_accum_steps, "--log-interval": args.log_interval}
    if args.stop_after_epochs is not None:
        positive["--stop-after-epochs"] = args.stop_after_epochs
    if args.nproc_per_node is not None:
        positive["--nproc-per-node"] = args.nproc_per_node
    for flag, value in positive.items():
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    try:  # kept as canonical text ('rotate,shift'), so configurations stay plain data
        args.augment = ",".join(parse_kinds(args.augment)) or "none"
    except ValueError as exc:
        raise UsageError(f"--augment: {exc}") from None
    args.aug_flip_classes = ",".join(class_list(args.aug_flip_classes, "all")) or "all"
    args.aug_rotate_wide_classes = ",".join(class_list(args.aug_rotate_wide_classes, "none")) or "none"
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
    if args.compile_mode is not None:
        args.compile = True
    try:
        resolve_size(args.model, width=args.width, depth=args.depth, heads=args.heads, ffn=args.ffn)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.compile_mode in CUDA_GRAPH_MODES and args.grad_accum_steps > 1:
        # A later micro-batch's replay can overwrite what the graph's memory pool still holds for an
        # earlier one (pytorch/pytorch#169545, open): refused until a CUDA test shows such a run
        # equal to eager.
        raise UsageError(f"--compile-mode {args.compile_mode} (CUDA graphs) is not yet shown to accumulate "
                         f"gradients correctly; with --grad-accum-steps {args.grad_accum_steps} use --compile-mode "
                         "default or max-autotune-no-cudagraphs")
    if args.grad_compression != "none" and args.multi_gpu != "ddp":
        raise UsageError(f"--grad-compression {args.grad_compression} compresses DDP's all-reduce; it needs "
                         f"--multi-gpu ddp (not {args.multi_gpu})")
    if args.multi_gpu == "fsdp" and args.amp_dtype == "fp16":
        raise UsageError("--multi-gpu fsdp with --amp-dtype fp16 is not supported (a GradScaler over sharded "
                         "gradients must agree on overflows across ranks); use --amp-dtype bf16")
    if args.multi_gpu == "fsdp" and args.sync_bn:
        raise UsageError("--sync-bn applies to --multi-gpu ddp; under fsdp BatchNorm keeps each rank's "
                         "statistics and rank 0's are used for evaluation and checkpoints, as under ddp")
    if args.cv_folds == 1 or args.cv_folds < 0:
        raise UsageError(f"--cv-folds must be 0 (off) or at least 2, got {args.cv_folds}")
    if args.refit and not args.cv_folds:
        raise UsageError("--refit follows cross-validation (--cv-folds K); one run on every training subject is "
                         "--val-fraction 0")
    if args.ensemble and not args.cv_folds:
        raise UsageError("--ensemble joins the models of a cross-validation; add --cv-folds K")
    if args.cv_folds and args.val_subjects:
        raise UsageError("--cv-folds chooses the validation subjects of each fold; drop --val-subjects")
    if args.dataset == "synthetic" and args.data_dir:
        raise UsageError("--data-dir is not read with --dataset synthetic; drop one of them")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if not 0 <= args.dropout < 1:
        raise UsageError(f"--dropout must be in [0, 1), got {args.dropout}")
    if not args.dist_timeout > 0 or not math.isfinite(args.dist_timeout):
        raise UsageError(f"--dist-timeout must be a positive number of seconds, got {args.dist_timeout}")
    for flag, value in {"--weight-decay": args.weight_decay, "--max-grad-norm": args.max_grad_norm,
                        "--num-workers": args.num_workers, "--save-every-steps": args.save_every_steps,
                        "--keep-last": args.keep_last,
                        "--early-stopping-patience": args.early_stopping_patience}.items():
        if value < 0:
            raise UsageError(f"{flag} must not be negative, got {value}")
    if args.val_fraction == 0 and args.val_subjects is None and args.early_stopping_patience:
        raise UsageError("--early-stopping-patience needs a validation split, and --val-fraction 0 keeps none; "
                         "drop one of them")
    if args.warmup_epochs is not None:
        if args.warmup_epochs < 0:
            raise UsageError(f"--warmup-epochs must not be negative, got {args.warmup_epochs}")
        if args.warmup_epochs > args.epochs:
            raise UsageError(f"--warmup-epochs {args.warmup_epochs:g} is longer than the run "
                             f"(--epochs {args.epochs}); lower it or train longer")


def data_options(config, **overrides):
    """The keyword arguments of data.splits.load_har_data that the settings describe."""
    data = config.data
    options = {"dataset": data.dataset, "data_dir": data.data_dir, "mode": data.mode,
               "val_fraction": data.val_fraction, "split_seed": config.optim.seed,
               "synthetic_seed": data.synthetic_seed, "val_subjects": data.val_subjects,
               "synthetic_windows_per_subject": data.synthetic_windows_per_subject}
    return {**options, **overrides}


def save_dir_of(config):
    """--save-dir, else checkpoints/<single|dp|ddp|fsdp> after the parallel mode."""
    if config.output.save_dir:
        return Path(config.output.save_dir)
    return Path("checkpoints") / {"none": "single"}.get(config.parallel.multi_gpu, config.parallel.multi_gpu)


def warmup_epochs(optim):
    """The warmup to use: as given, else the default capped at a fifth of the run."""
    if optim.warmup_epochs is not None:
        return optim.warmup_epochs
    return min(DEFAULT_WARMUP_EPOCHS, optim.epochs / 5)


def augment_config(recipe):
    """The AugmentConfig the settings describe, or None when no augmentation is on."""
    kinds = parse_kinds(recipe.augment)
    if not kinds:
        return None
    return AugmentConfig(kinds, rotate_deg=recipe.aug_rotate_deg, scale=recipe.aug_scale, jitter=recipe.aug_jitter,
                         shift_steps=recipe.aug_shift_steps, flip_classes=class_list(recipe.aug_flip_classes, "all"),
                         rotate_wide_classes=class_list(recipe.aug_rotate_wide_classes, "none"),
                         rotate_wide_deg=recipe.aug_rotate_wide_deg)


def class_list(text, empty_word):
    """'laying, sitting' -> ('LAYING', 'SITTING'); '' or `empty_word` (any case) -> (), whose meaning
    is the flag's: every class for flip's 'all', no class for the wide rotation's 'none'."""
    names = tuple(part.strip().upper() for part in text.split(",") if part.strip())
    return () if names in ((), (empty_word.upper(),)) else names


def _subject_list(text):
    try:
        subjects = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated subject ids such as 3,7,15, got {text!r}") from None
    if not subjects:
        raise argparse.ArgumentTypeError("expected at least one subject id")
    return subjects


def _gpu_id_list(text):
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices such as 0,1, got {text!r}") from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative GPU indices, got {text!r}")
    return ids
