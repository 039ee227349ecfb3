"""MiniRocket's PPV transform as one Triton kernel: each program convolves a block of windows with one
kernel at one dilation, compares the outputs with that kernel's biases and counts the positive ones
in registers, writing only the counts. The reference transform (MiniRocket.transform) instead
writes every [windows, 84, T'] output and comparison to memory and reads them back, which bounds a
GPU at the speed of its memory. On a CPU the kernel runs only under TRITON_INTERPRET=1 (the tests),
far slower than the reference; models.minirocket uses it on CUDA GPUs where triton is installed.
"""
import torch
import triton
import triton.language as tl

# Outputs per program, [windows, steps]: 16 registers a thread at 4 warps. A dilation whose outputs
# are short takes more windows per program, so that no program spends most of its work on steps
# beyond its outputs' end (half the dilations are unpadded: 16 to 112 outputs of 128 steps).
OUTPUTS_PER_PROGRAM = 2048
WARPS = 4
# Each tap's multiply and add as one fused multiply-add (one rounding, one instruction). Triton fused
# them unless told otherwise up to 3.9; from 3.10 it will not by default, so the choice is made here.
FP_FUSION = True


@triton.jit
def _block(windows, outputs_steps, BLOCK_WINDOWS: tl.constexpr, BLOCK_STEPS: tl.constexpr):
    """This program's windows and output starts, each with where it is real."""
    rows = tl.program_id(1) * BLOCK_WINDOWS + tl.arange(0, BLOCK_WINDOWS)
    starts = tl.arange(0, BLOCK_STEPS)
    # A block's last rows beyond the batch read its last window (every read in bounds, no mask to
    # build per tap) and store nothing.
    return rows, rows < windows, tl.minimum(rows, windows - 1), starts, starts < outputs_steps


@triton.jit
def _store_counts(output, kernel, rows, row_ok, start_ok, biases_ptr, out_ptr, features, first_feature,
                  biases_per_kernel):
    """A kernel's outputs [windows, starts] compared with each of its biases, the positive ones counted."""
    for bias_index in range(biases_per_kernel):
        bias = tl.load(biases_ptr + kernel * biases_per_kernel + bias_index)
        positive = (output > -bias) & start_ok[None, :]
        counts = tl.sum(positive.to(tl.int32), axis=1)
        feature = first_feature + kernel * biases_per_kernel + bias_index
        tl.store(out_ptr + rows * features + feature, counts.to(tl.float32), mask=row_ok)


# One compilation for every dilation and batch: Triton would otherwise compile a variant for each
# integer argument that is 1 or a multiple of 16 (a first run's start-up pays for each).
@triton.jit(do_not_specialize=["windows", "padded_steps", "outputs_steps", "first_feature", "dilation", "offset"])
def _ppv_kernel(x_ptr, weights_ptr, used_ptr, biases_ptr, out_ptr, windows, channels, padded_steps, outputs_steps,
                features, first_feature, biases_per_kernel, dilation, offset,
                BLOCK_WINDOWS: tl.constexpr, BLOCK_STEPS: tl.constexpr, KERNEL_LENGTH: tl.constexpr):
    kernel = tl.program_id(0)
    rows, row_ok, rows_read, starts, start_ok = _block(windows, outputs_steps, BLOCK_WINDOWS, BLOCK_STEPS)
    output = tl.zeros((BLOCK_WINDOWS, BLOCK_STEPS), dtype=tl.float32)
    for channel in range(channels):
        # A kernel sums a few of the channels (its weights are zero on the others): skip the rest.
        if tl.load(used_ptr + kernel * channels + channel) != 0:
            # The windows come padded with zeros on both sides, wide enough for every dilation's
            # taps from every start: conv1d's zero padding without a bounds test per read.
            first_tap = x_ptr + (rows_read[:, None] * channels + channel) * padded_steps + offset + starts[None, :]
            for tap in tl.static_range(KERNEL_LENGTH):
                weight = tl.load(weights_ptr + (kernel * channels + channel) * KERNEL_LENGTH + tap)
                output += weight * tl.load(first_tap + tap * dilation)
    _store_counts(output, kernel, rows, row_ok, start_ok, biases_ptr, out_ptr, features, first_feature,
                  biases_per_kernel)


# MiniRocket's kernels weigh six taps -1 and three taps 2, so an output over a channel is three times
# its three taps less the sum of all nine, and that sum is the same for all 84 kernels of a dilation.
@triton.jit(do_not_specialize=["windows", "padded_steps", "outputs_steps", "first_feature", "dilation", "offset"])
def _ppv_shared_sums_kernel(x_ptr, sums_ptr, twos_ptr, used_ptr, biases_ptr, out_ptr, windows, channels, padded_steps,
                            outputs_steps, features, first_feature, biases_per_kernel, dilation, offset,
                            BLOCK_WINDOWS: tl.constexpr, BLOCK_STEPS: tl.constexpr):
    kernel = tl.program_id(0)
    rows, row_ok, rows_read, starts, start_ok = _block(windows, outputs_steps, BLOCK_WINDOWS, BLOCK_STEPS)
    # The kernel's three taps that weigh 2, as offsets along the padded window.
    first = tl.load(twos_ptr + kernel * 3) * dilation
    second = tl.load(twos_ptr + kernel * 3 + 1) * dilation
    third = tl.load(twos_ptr + kernel * 3 + 2) * dilation
    output = tl.zeros((BLOCK_WINDOWS, BLOCK_STEPS), dtype=tl.float32)
    for channel in range(channels):
        if tl.load(used_ptr + kernel * channels + channel) != 0:
            row = (rows_read[:, None] * channels + channel) * padded_steps + offset + starts[None, :]
            twos = tl.load(x_ptr + row + first) + tl.load(x_ptr + row + second) + tl.load(x_ptr + row + third)
            output += 3.0 * twos - tl.load(sums_ptr + row)
    _store_counts(output, kernel, rows, row_ok, start_ok, biases_ptr, out_ptr, features, first_feature,
                  biases_per_kernel)


def fused_counts(x, model, *, outputs_per_program=OUTPUTS_PER_PROGRAM, warps=WARPS, shared_sums=False):
    """[B, C, T] fp32 windows -> [B, D x 84 x biases] counts of positive positions (as float32), ordered
    as MiniRocket.transform's features, which are these over each feature's T'.
    `model`: a fitted MiniRocket, whose buffers weights [D, 84, C, 9] and biases [D, 84, biases], and
    dilations and paddings, the kernels read. One launch per dilation, whose outputs are
    T + 2 x padding - 8 x dilation steps long. shared_sums: each dilation's nine-tap sums computed once
    for its 84 kernels, which then read three taps a channel instead of nine
    (benchmarks.gpu_check.minirocket times both ways)."""
    weights, biases, dilations, paddings = model.weights, model.biases, model.dilations, model.paddings
    windows, channels, steps = x.shape
    kernels, per = weights.shape[1], biases.shape[2]
    features = torch.empty(windows, len(dilations) * kernels * per, device=x.device, dtype=torch.float32)
    if not windows:
        return features
    kernel_length = weights.shape[3]
    reach = (kernel_length - 1) * max(dilations)
    left = max(paddings)
    # Zeros to the left for the widest padding, and to the right for the furthest tap of the longest
    # block of starts (a power of two at least T), so that every read of the kernel lands inside.
    padded = torch.nn.functional.pad(x.float(), (left, triton.next_power_of_2(steps) + reach - steps)).contiguous()
    # [D, 84, C]: the channels each kernel sums; int32 so that every dilation's slice starts 16-byte
    # aligned, as Triton also compiles a variant per pointer alignment.
    used = weights.ne(0).any(dim=3).int()
    if shared_sums:
        sums = torch.empty_like(padded)  # each dilation's nine-tap sums in turn
        twos = twos_taps(weights)
    for d, (dilation, padding) in enumerate(zip(dilations, paddings, strict=True)):
        outputs_steps = steps + 2 * padding - (kernel_length - 1) * dilation
        block_steps = triton.next_power_of_2(outputs_steps)
        block_windows = max(1, outputs_per_program // block_steps)
        grid = (kernels, triton.cdiv(windows, block_windows))
        if shared_sums:
            nine_tap_sums(padded, dilation, kernel_length, sums)
            _ppv_shared_sums_kernel[grid](padded, sums, twos[d], used[d].contiguous(), biases[d].contiguous(),
                                          features, windows, channels, padded.shape[2], outputs_steps,
                                          features.shape[1], d * kernels * per, per, dilation, left - padding,
                                          BLOCK_WINDOWS=block_windows, BLOCK_STEPS=block_steps, num_warps=warps,
                                          enable_fp_fusion=FP_FUSION)
            continue
        _ppv_kernel[grid](padded, weights[d].contiguous(), used[d].contiguous(), biases[d].contiguous(), features,
                          windows, channels, padded.shape[2], outputs_steps, features.shape[1], d * kernels * per,
                          per, dilation, left - padding,
                          BLOCK_WINDOWS=block_windows, BLOCK_STEPS=block_steps, KERNEL_LENGTH=kernel_length,
                          num_warps=warps, enable_fp_fusion=FP_FUSION)
    return features


@triton.jit(do_not_specialize=["padded_steps", "starts", "dilation"])
def _nine_tap_sums_kernel(x_ptr, sums_ptr, padded_steps, starts, dilation, BLOCK_STEPS: tl.constexpr,
                          KERNEL_LENGTH: tl.constexpr):
    row = tl.program_id(0)  # one channel of one window
    columns = tl.program_id(1) * BLOCK_STEPS + tl.arange(0, BLOCK_STEPS)
    inside = columns < starts
    first_tap = x_ptr + row * padded_steps + columns
    total = tl.zeros((BLOCK_STEPS,), dtype=tl.float32)
    for tap in tl.static_range(KERNEL_LENGTH):  # in tap order: the same sums wherever they run
        total += tl.load(first_tap + tap * dilation, mask=inside, other=0.0)
    tl.store(sums_ptr + row * padded_steps + columns, total, mask=inside)


def nine_tap_sums(padded, dilation, kernel_length, out):
    """`out` [B, C, L] (padded's shape) holding each padded window's sum of `kernel_length` taps
    `dilation` apart from every start whose taps all lie inside it; the later columns are left as
    they were (no output reads them)."""
    starts = padded.shape[2] - (kernel_length - 1) * dilation
    block = min(1024, triton.next_power_of_2(starts))
    grid = (padded.shape[0] * padded.shape[1], triton.cdiv(starts, block))
    _nine_tap_sums_kernel[grid](padded, out, padded.shape[2], starts, dilation, BLOCK_STEPS=block,
                                KERNEL_LENGTH=kernel_length)
    return out


def twos_taps(weights):
    """[D, 84, 3] int32: for weights [D, 84, C, 9], the three taps of each kernel that weigh 2. Sorted
    rather than found by nonzero, whose result's size would make the host wait for the device."""
    twos = (weights == 2).any(dim=2).int()
    return twos.argsort(dim=2, descending=True, stable=True)[:, :, :3].int().contiguous()
