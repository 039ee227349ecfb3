"""The trainer's flags as --help shows them: one function per argument group, the defaults they give,
and the little parsers of their comma-separated values. Checks of the values are in checks.py."""
import argparse

from data.augment import AUGMENTATIONS, AugmentConfig
from data.splits import CHANNEL_MODES
from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT
from models import MODELS, NORMS

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
        add_multi_gpu_flags(parser)
    # In the order --help shows them.
    for add_group in (add_hardware_flags, add_data_flags, add_model_flags, add_generalisation_flags,
                      add_optimisation_flags, add_checkpoint_flags):
        add_group(parser)
    return parser


def add_multi_gpu_flags(parser):
    """How several GPUs (or processes) share the work: main_multi_gpu.py only."""
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


def add_hardware_flags(parser):
    """Devices, processes, data loading and compilation."""
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


def add_data_flags(parser):
    """Which windows, and how the training subjects split into training and validation."""
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


def add_model_flags(parser):
    """The network and its size."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", choices=tuple(MODELS), default=DEFAULT_MODEL)
    group.add_argument("--dropout", type=float, default=None,
                       help="dropout rate (default: the model's own, 0 for minirocket's head, 0.1 for the others)")
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


def add_generalisation_flags(parser):
    """Augmentation, the weight average, label smoothing, feature views and cross-validation."""
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


def add_optimisation_flags(parser):
    """Epochs, batch, learning rate and its schedule, precision, seed."""
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


def add_checkpoint_flags(parser):
    """What a run writes, where, how often, and resuming."""
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
