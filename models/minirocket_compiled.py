"""MiniRocket's compare-and-count on a CPU as one compiled loop. The eager path writes each bias's
comparisons with a kernel's outputs to a scratch tensor and reads them back to sum them; compiled
by torch.compile (its C++ backend), the comparison and the sum over time are one loop and nothing
is written but the counts. The counts are the same: each comparison is exact and a sum of ones in
float32 is exact below 2**24.

Compiling costs seconds (11 s the first time on the 2-core development machine, under 2 s once
torch's compile cache holds it), so a model counts this way only for a pool large enough to win
them back (MiniRocket.prepare_pool)."""
import functools

import torch


def positive_counts(outputs, negative_biases):
    """Outputs [B, 84, T'] and their kernels' biases negated [84, biases] -> [B, 84, biases]: how many
    of each kernel's outputs lie above each of its negated biases, as floats."""
    return (outputs[:, :, None, :] > negative_biases[None, :, :, None]).to(outputs.dtype).sum(dim=3)


@functools.cache
def compiled_positive_counts():
    """positive_counts compiled once for the process, for every batch and T' (dynamic shapes). Called
    without gradients wherever it runs: a thread's grad mode is its own (one_chunk_per_core's workers
    have theirs on), and the compiled graphs are kept per grad mode, so each would compile again."""
    compiled = torch.compile(positive_counts, dynamic=True)

    def counts(outputs, negative_biases):
        with torch.no_grad():
            return compiled(outputs, negative_biases)
    return counts
