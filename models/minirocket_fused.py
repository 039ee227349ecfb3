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

# Windows per program: a [16, T] block of outputs takes 16 registers a thread at T = 128 and 4 warps,
# and each kernel-and-dilation still gets B / 16 programs to spread over the GPU.
WINDOWS_PER_PROGRAM = 16


# One compilation for every dilation and batch: Triton would otherwise compile a variant for each
# integer argument that is 1 or a multiple of 16 (a first run's start-up pays for each).
@triton.jit(do_not_specialize=["windows", "outputs_steps", "first_feature", "dilation", "padding"])
def _ppv_kernel(x_ptr, weights_ptr, used_ptr, biases_ptr, out_ptr, windows, channels, steps, outputs_steps,
                features, first_feature, biases_per_kernel, dilation, padding,
                BLOCK_WINDOWS: tl.constexpr, BLOCK_STEPS: tl.constexpr, KERNEL_LENGTH: tl.constexpr):
    kernel = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_WINDOWS + tl.arange(0, BLOCK_WINDOWS)
    starts = tl.arange(0, BLOCK_STEPS)
    row_ok = rows < windows
    start_ok = starts < outputs_steps
    output = tl.zeros((BLOCK_WINDOWS, BLOCK_STEPS), dtype=tl.float32)
    for channel in range(channels):
        # A kernel sums a few of the channels (its weights are zero on the others): skip the rest.
        if tl.load(used_ptr + kernel * channels + channel) != 0:
            row_starts = x_ptr + (rows[:, None] * channels + channel) * steps
            for tap in tl.static_range(KERNEL_LENGTH):
                weight = tl.load(weights_ptr + (kernel * channels + channel) * KERNEL_LENGTH + tap)
                position = starts[None, :] + tap * dilation - padding  # zeros beyond the ends, as conv1d pads
                inside = row_ok[:, None] & start_ok[None, :] & (position >= 0) & (position < steps)
                output += weight * tl.load(row_starts + position, mask=inside, other=0.0)
    for bias_index in range(biases_per_kernel):
        bias = tl.load(biases_ptr + kernel * biases_per_kernel + bias_index)
        positive = (output > -bias) & start_ok[None, :]
        counts = tl.sum(positive.to(tl.int32), axis=1)
        feature = first_feature + kernel * biases_per_kernel + bias_index
        tl.store(out_ptr + rows * features + feature, counts.to(tl.float32), mask=row_ok)


def fused_counts(x, weights, biases, dilations, paddings):
    """[B, C, T] fp32 windows -> [B, D x 84 x biases] counts of positive positions (as float32), ordered
    as MiniRocket.transform's features, which are these over each feature's T'.
    weights [D, 84, C, 9], biases [D, 84, biases]: the model's buffers. One launch per dilation, whose
    outputs are T + 2 x padding - 8 x dilation steps long."""
    x = x.contiguous().float()
    windows, channels, steps = x.shape
    kernels, per = weights.shape[1], biases.shape[2]
    features = torch.empty(windows, len(dilations) * kernels * per, device=x.device, dtype=torch.float32)
    if not windows:
        return features
    kernel_length = weights.shape[3]
    # [D, 84, C]: the channels each kernel sums; int32 so that every dilation's slice starts 16-byte
    # aligned, as Triton also compiles a variant per pointer alignment.
    used = weights.ne(0).any(dim=3).int()
    grid = (kernels, triton.cdiv(windows, WINDOWS_PER_PROGRAM))
    block_steps = triton.next_power_of_2(steps)  # the longest outputs, the padded dilations'
    for d, (dilation, padding) in enumerate(zip(dilations, paddings, strict=True)):
        outputs_steps = steps + 2 * padding - (kernel_length - 1) * dilation
        _ppv_kernel[grid](x, weights[d].contiguous(), used[d].contiguous(), biases[d].contiguous(), features,
                          windows, channels, steps, outputs_steps, features.shape[1], d * kernels * per, per,
                          dilation, padding,
                          BLOCK_WINDOWS=WINDOWS_PER_PROGRAM, BLOCK_STEPS=block_steps,
                          KERNEL_LENGTH=kernel_length)
    return features
