"""A checkpoint as one deployable file: raw-unit windows [B, C, T] in, logits out, with the
normalisation inside, as TorchScript or ONNX (dynamic batch size). A fold ensemble is one graph too:
its logits are the log of its members' mean probabilities."""
import errno
import io
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import torch

from outputs.safety import write_atomic
from training.errors import UsageError

ONNX_OPSET = 18  # the lowest the exporter built on torch.export writes without converting
PARITY_BATCH = 3  # traced with one batch size, checked with another: the batch must stay dynamic
# Largest |logit difference| from the PyTorch model an export may show, per unit of the logits' scale
# (at least 1): float32 kernels that differ in order stay near 1e-5, a wrong graph far above.
PARITY_TOLERANCE = 1e-3
EXPORT_FORMATS = ("torchscript", "onnx")


def example_windows(bundle, batch_size, seed=0):
    """Windows at the scale of the training data (mean +- std per channel); for a model that reads
    windows padded with NaN, all but the first cut shorter and padded so."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch_size, len(bundle.channel_names), bundle.window_steps, generator=generator)
    windows = noise * torch.from_numpy(bundle.std)[None, :, None] + torch.from_numpy(bundle.mean)[None, :, None]
    if bundle.padded:
        for index, window in enumerate(windows):
            window[:, bundle.window_steps - index * bundle.window_steps // batch_size:] = float("nan")
    return windows


def export_torchscript(bundle, path):
    model = bundle.model.eval()
    # torch.jit.trace warns that it is deprecated; it is still the one path whose file loads with
    # torch.jit.load alone. No grad while tracing: the transformer then records the same fused
    # inference path it takes in eval, so the traced graph does not depend on autograd state.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example_windows(bundle, 2), check_trace=False)
    # Saved in memory, then written by Python: torch.jit.save's own file writer aborts the process
    # where the disk refuses a write (a full disk), where Python raises an OSError export() explains.
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    Path(path).write_bytes(buffer.getvalue())


def export_onnx(bundle, path):
    # The exporter built on torch.export (dynamo=True): the TorchScript-based one is deprecated.
    # It writes through onnxscript, an optional dependency like onnx itself.
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UsageError("--format onnx needs the onnx and onnxscript packages: "
                         "pip install onnx onnxscript onnxruntime") from None
    model = bundle.model.eval()
    batch = torch.export.Dim("batch")
    # ONNX has no operator for PyTorch's fused transformer-layer kernel: export the plain layers.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    # The exporter logs, for every call, that torchvision's operators are not registered.
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.export's notes on deprecated internals, at every call
            program = torch.onnx.export(model, (example_windows(bundle, 2),), dynamo=True, input_names=["signals"],
                                        output_names=["logits"], dynamic_shapes={"signals": {0: batch}},
                                        opset_version=ONNX_OPSET, verbose=False)
        program.save(str(path))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        logger.setLevel(level)


def run_exported(path, fmt, windows):
    """Logits of an exported file for a float32 [B, C, T] array; None when onnxruntime is missing."""
    if fmt == "torchscript":
        with torch.no_grad():
            return torch.jit.load(str(path)).eval()(torch.from_numpy(windows)).numpy()
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"signals": windows})[0]


def check_suffix(path, fmt):
    """Refuse a file named for the other format (an ONNX runtime refuses a TorchScript file named
    .onnx only when it is opened, far from here); other names, or none, are the user's choice."""
    named = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript"}.get(path.suffix.lower())
    if named is not None and named != fmt:
        raise UsageError(f"--out {path} is named as a{'n' if named == 'onnx' else ''} {named} file but --format "
                         f"{fmt} writes a{'n' if fmt == 'onnx' else ''} {fmt} file; rename it or change --format")


def export(bundle, fmt, path):
    """Write the file under a temporary name beside `path`, check it against the PyTorch model, and
    put it in place only if it passes; returns the largest |logit difference|, or None where it could
    not be checked (no onnxruntime)."""
    differences = []

    def write_checked(partial):
        {"torchscript": export_torchscript, "onnx": export_onnx}[fmt](bundle, partial)
        windows = example_windows(bundle, PARITY_BATCH, seed=1).numpy()
        logits = run_exported(partial, fmt, windows)
        if logits is not None:
            with torch.no_grad():
                reference = bundle.model.eval()(torch.from_numpy(windows)).numpy()
            with np.errstate(invalid="ignore"):  # infinity - infinity: NaN, which check_parity refuses
                differences.append(float(np.max(np.abs(logits - reference))))
            check_parity(differences[0], reference, fmt, path)
    try:
        write_atomic(path, write_checked)
    except OSError as exc:  # a full disk, a file the system keeps from being replaced: nothing was put in place
        fix = "free space there" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "choose another --out"
        raise UsageError(f"--out {path} could not be written ({exc.strerror or exc}); {fix} and export again") from None
    return differences[0] if differences else None


def check_parity(difference, reference, fmt, path):
    """Refuse an export whose logits differ from the PyTorch model's by NaN or more than the tolerance."""
    tolerance = PARITY_TOLERANCE * max(1.0, float(np.max(np.abs(reference))))
    if not math.isfinite(difference):
        raise UsageError(f"--out {path} not written: the {fmt} model's logits differ from the PyTorch model's by "
                         f"{difference} on windows at the training data's scale, where the model gives NaN or "
                         "infinity (weights too large for float32); export another of the run's checkpoints, or "
                         "train again")
    if difference > tolerance:
        other = next(name for name in EXPORT_FORMATS if name != fmt)
        raise UsageError(f"--out {path} not written: the {fmt} model's logits differ from the PyTorch model's by "
                         f"{difference:.2e}, above the tolerance {tolerance:.1e}, so it does not compute what the "
                         f"checkpoint does; try --format {other}")
