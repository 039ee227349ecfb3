"""models.minirocket_fused: the Triton kernel that convolves, compares and counts in registers, against
the reference transform. Without a GPU the kernel runs under Triton's interpreter (slow: the windows
are few and short), in a process of its own: TRITON_INTERPRET is read when triton's own functions are
defined, at its first import, which may have happened in this one."""
import sys
from unittest import mock

import pytest
import torch

from conftest import REPO, run_subprocess
from models import build_model

pytest.importorskip("triton")

CHANNELS, STEPS = 3, 30  # three dilations (1, 2, 3): padded, unpadded, padded; outputs of 30, 14 and 30 steps


def fitted_model(device):
    torch.manual_seed(0)
    model = build_model("minirocket", CHANNELS, 6, width=504, window_steps=STEPS).to(device).eval()
    signals = (torch.randn(64, CHANNELS, STEPS).cumsum(dim=2) * 0.1).to(device)
    model.fit(signals)
    return model, signals


def counts_allowed(model, windows, shared_sums=False):
    """Per feature, the fewest and most positive outputs a correct fp32 transform can count. Each
    output is a sum of C x 9 products, and any order of summing them in fp32 lands within
    n x 2^-24 x sum |w x| of the exact sum (n terms): an output that close to its bias may fall either side.
    With shared_sums an output over a channel is 3 x (its three taps weighing 2) less the sum of all nine:
    12 terms a channel, of magnitude sum |x| + 3 x sum over those three |x|."""
    lowest, highest = [], []
    terms = CHANNELS * (12 if shared_sums else model.weights.shape[3])
    for d, (dilation, padding) in enumerate(zip(model.dilations, model.paddings, strict=True)):
        outputs = torch.nn.functional.conv1d(windows.double(), model.weights[d].double(), padding=padding,
                                             dilation=dilation)
        exact = outputs[:, :, None, :] + model.biases[d].double()[None, :, :, None]
        weights = model.weights[d].double()
        scale = weights.ne(0) * (1 + 3 * weights.eq(2)) if shared_sums else weights.abs()
        magnitude = torch.nn.functional.conv1d(windows.double().abs(), scale.double(),
                                               padding=padding, dilation=dilation)[:, :, None, :]
        rounding = terms * 2.0 ** -24 * magnitude
        lowest.append((exact > rounding).sum(dim=3).flatten(1))
        highest.append((exact >= -rounding).sum(dim=3).flatten(1))
    return torch.cat(lowest, dim=1), torch.cat(highest, dim=1)


def output_steps(model, windows):
    return torch.cat([torch.full((model.biases[d].numel(),), STEPS + 2 * padding - 8 * dilation)
                      for d, (dilation, padding) in enumerate(zip(model.dilations, model.paddings, strict=True))])


def check_against_the_reference(device):
    for shared_sums in (False, True):
        check_one_kernel(device, shared_sums)
    check_nine_tap_sums(device)


def check_nine_tap_sums(device):
    """The shared-sums kernel's nine-tap sums equal the taps added in order, bit for bit."""
    from models.minirocket_fused import nine_tap_sums
    padded = torch.randn(5, CHANNELS, 80, device=device)
    for dilation in (1, 3, 9):
        sums = nine_tap_sums(padded, dilation, 9, torch.full_like(padded, float("nan")))
        starts = 80 - 8 * dilation
        expected = padded[:, :, :starts].clone()
        for tap in range(1, 9):
            expected += padded[:, :, tap * dilation:tap * dilation + starts]
        assert torch.equal(sums[:, :, :starts], expected)
        assert sums[:, :, starts:].isnan().all()  # the later columns are left as they were


def check_one_kernel(device, shared_sums):
    from models.minirocket_fused import fused_counts
    model, signals = fitted_model(device)
    # Windows the biases were drawn from (outputs equal to a bias: ties) and fresh ones, 10 in all: at
    # 256 outputs a program, a whole block of 8 windows and a part of the next at the padded dilations
    # (32 starts), a part of one block of 16 at the unpadded one (14 outputs, 16 starts). Under the
    # interpreter each program costs its time, so the windows are as few as cover those cases.
    windows = torch.cat([signals[:5], (torch.randn(5, CHANNELS, STEPS).cumsum(dim=2) * 0.1).to(device)])
    # Ties by construction as well: the first bias of every kernel at the first dilation equals one
    # output of the first window, which the reference counts as not positive.
    tied = torch.nn.functional.conv1d(windows[:1], model.weights[0], padding=model.paddings[0])[0, :, 5]
    model.biases[0, :, 0] = -tied
    counted = fused_counts(windows, model, outputs_per_program=256, shared_sums=shared_sums).long().cpu()
    # The default blocks (every window in one block here) count the same.
    assert torch.equal(fused_counts(windows, model, shared_sums=shared_sums).cpu(), counted.float())
    reference = model.transform(windows, fused=False)
    steps = output_steps(model, windows).to(device)
    reference_counts = torch.round(reference * steps).long().cpu()
    lowest, highest = (bound.cpu() for bound in counts_allowed(model, windows, shared_sums))
    # Every count of the kernel is one a correct transform may give...
    assert ((lowest <= counted) & (counted <= highest)).all()
    # ...so a window's features may differ from the reference's only where one of its outputs lies
    # within float rounding of a bias; everywhere else they are equal, and such windows are few.
    ambiguous = (lowest != highest).any(dim=1)
    differs = (counted != reference_counts).any(dim=1)
    assert not (differs & ~ambiguous).any() and differs.sum() <= ambiguous.sum() < len(windows) // 2
    assert torch.equal(counted[~ambiguous], reference_counts[~ambiguous])
    assert fused_counts(windows[:0], model, shared_sums=shared_sums).shape == (0, 504)


def test_the_fused_kernel_counts_what_the_reference_counts_but_for_rounding():
    done = run_subprocess([sys.executable, __file__], env={"TRITON_INTERPRET": "1", "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_kernels_compile_for_an_h100_without_one():
    """Triton's own ptxas turns each kernel into an sm_90 binary (H100, H200) here, so a kernel that the
    interpreter runs but the compiler refuses fails before a GPU is lent."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from models.minirocket_fused import (
        FP_FUSION,
        OUTPUTS_PER_PROGRAM,
        _nine_tap_sums_kernel,
        _ppv_kernel,
        _ppv_shared_sums_kernel,
    )

    def ptx(kernel, pointers, integers, constants):
        signature = {**pointers, **dict.fromkeys(integers, "i32"),
                     **dict.fromkeys(constants, "constexpr")}
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                                  target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": FP_FUSION})
        assert compiled.asm["cubin"] and f".visible .entry {kernel.__name__}" in compiled.asm["ptx"]
        return compiled.asm["ptx"]

    counts = ("windows", "channels", "padded_steps", "outputs_steps", "features", "first_feature",
              "biases_per_kernel", "dilation", "offset")
    blocks = {"BLOCK_WINDOWS": OUTPUTS_PER_PROGRAM // 128, "BLOCK_STEPS": 128}
    taps = ptx(_ppv_kernel, {"x_ptr": "*fp32", "weights_ptr": "*fp32", "used_ptr": "*i32", "biases_ptr": "*fp32",
                             "out_ptr": "*fp32"}, counts, {**blocks, "KERNEL_LENGTH": 9})
    assert "fma.rn.f32" in taps  # each tap a fused multiply-add, whatever Triton's default
    shared = ptx(_ppv_shared_sums_kernel, {"x_ptr": "*fp32", "sums_ptr": "*fp32", "twos_ptr": "*i32",
                                           "used_ptr": "*i32", "biases_ptr": "*fp32", "out_ptr": "*fp32"},
                 counts, blocks)
    # Three taps and a sum a channel, not nine taps: fewer loads of the window (static counts).
    assert shared.count("ld.global") < taps.count("ld.global") / 2
    ptx(_nine_tap_sums_kernel, {"x_ptr": "*fp32", "sums_ptr": "*fp32"}, ("padded_steps", "starts", "dilation"),
        {"BLOCK_STEPS": 256, "KERNEL_LENGTH": 9})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_transform_runs_the_fused_kernel_and_agrees():
    cudnn = torch.backends.cudnn
    saved, cudnn.allow_tf32 = cudnn.allow_tf32, False  # the reference's convolutions in fp32, as the bounds assume
    try:
        check_against_the_reference(torch.device("cuda"))
    finally:
        cudnn.allow_tf32 = saved
    from models.minirocket_fused import fused_counts
    model, signals = fitted_model(torch.device("cuda"))
    counts = fused_counts(signals, model)
    with mock.patch("models.minirocket_fused.fused_counts", wraps=fused_counts) as kernel:
        features = model.transform(signals)
    assert kernel.called  # the transform ran the kernel, not the reference
    assert torch.equal(features, counts / model.positions(signals.shape[2], signals.device))


if __name__ == "__main__":  # the CPU test's own process, under Triton's interpreter
    check_against_the_reference(torch.device("cpu"))
