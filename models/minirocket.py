"""The default model: MiniRocket features with a trained linear head, fixed random convolutions
and a learnt classifier.

After Dempster, Schmidt and Webb, "MiniRocket" (KDD 2021): 84 kernels of length 9 whose weights
are -1 six times and 2 three times, each at a range of dilations, each applied to the sum of a
random subset of the channels; the biases are quantiles of the convolution outputs on training
windows; a feature is the proportion of positive values (PPV) of output + bias over time. Only the
head learns: a linear layer over the standardised features. Kernels, channel subsets, dilations,
biases and the feature statistics are buffers, so checkpoints, DDP, FSDP, ensembles, predict.py
and export carry them like any weights; fit(signals) sets the data-dependent ones once, before
training, from (normalised) training windows.

Windows of unequal lengths come padded at their end with NaN (fit(..., padded=True)): each is read
over its own steps, as if it had been transformed alone. Its padding is zeros to the convolutions
(what a window's own padding holds), the outputs past its own T' count for nothing, its features
divide by its own T', and a feature whose kernel reaches beyond the whole window (an unpadded
dilation over a short one) is left at the training mean. The biases are quantiles of each drawn
window's own outputs (of its whole outputs, padding included, at a dilation no training window
reaches).
"""
import contextlib
import functools
import importlib.util
import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from models.contract import HARModel
from models.minirocket_compiled import compiled_positive_counts, positive_counts

KERNEL_LENGTH = 9
# The 84 kernels: every choice of three positions (of nine) that hold 2; the others hold -1.
KERNEL_TWOS = tuple(itertools.combinations(range(KERNEL_LENGTH), 3))
QUANTILE_SEED = 0  # the fit's draws (which windows and quantiles set the biases) are fixed
# Windows transformed together: on a CPU a few, so that a bias's [windows, 84, T'] comparisons stay
# in its caches (64 ran fastest of 16 to 256 on the development machine); elsewhere (a GPU) many.
TRANSFORM_CHUNK = {"cpu": 64}
TRANSFORM_CHUNK_ELSEWHERE = 1024
# A pool of at least this many windows on a CPU is counted by the compiled loop
# (models.minirocket_compiled): 1.37x to 1.51x the eager transform's windows/s on two threads and
# 1.45x on one (the 2-core development machine, AMD EPYC), about 58 us a window less on two threads,
# so about 190,000 windows win back a first compile of 11 s, and 30,000 one from a warm cache.
COMPILED_COUNT_WINDOWS = 200_000


class MiniRocket(HARModel):
    SIZES = ("width",)  # about this many features (rounded down to a multiple of 84)
    # No dropout before the head: on the nested subject-wise folds it did not pay (docs/training.md),
    # and on a CPU its random mask over 8,820 features cost more than the rest of the head's step.
    DROPOUT = 0.0
    # 0.2 rather than the other models' 0.1: over five seeds on the nested folds the mean was level and
    # the worst fold higher at four, the worst person at three (docs/training.md); it costs nothing.
    LABEL_SMOOTHING = 0.2
    TAKES_WINDOW_STEPS = True  # the dilations reach across the window
    # forward takes windows, features(windows) or pool_features(windows): a pool of counts computed once
    FIXED_FEATURES = True
    FEATURE_VIEWS = 4  # chosen on the nested subject-wise estimate (docs/training.md)
    FITS_TO_DATA = True  # fit(signals): the biases and the feature statistics
    READS_NAN_PADDING = True  # each window over its own length
    FIXED_BUFFERS = True  # kernels, biases, the feature statistics and the padding flag: fit's, then fixed
    LINEAR_HEAD = True  # head = Dropout, Linear over from_counts(pool counts): --head-fit ridge solves it
    STEP_RECORDS = True  # shown for the head's step on the feature pool, the default

    @staticmethod
    def resolve_size(width=10_000):
        if width < len(KERNEL_TWOS):
            raise ValueError(f"--width {width} is below MiniRocket's {len(KERNEL_TWOS)} kernels: use at least that")
        return {"features": width}

    def __init__(self, in_channels, num_classes, dropout=DROPOUT, norm="batch", features=10_000, window_steps=128,
                 max_dilations=32):
        super().__init__()
        generator = torch.Generator().manual_seed(QUANTILE_SEED)
        # The kernels and their draws on the CPU whatever the default device: on the meta device
        # (models.training_bytes) the sizes are counted without drawing.
        kernels = torch.full((len(KERNEL_TWOS), KERNEL_LENGTH), -1.0, device="cpu")
        for index, twos in enumerate(KERNEL_TWOS):
            kernels[index, list(twos)] = 2.0
        # Dilations spread exponentially up to the window (its receptive field then spans it), each
        # given a share of the features; a kernel at a dilation gets `per` biases.
        largest = max(1.0, (window_steps - 1) / (KERNEL_LENGTH - 1))
        dilations = np.unique(np.floor(np.logspace(0, np.log2(largest), max_dilations, base=2)).astype(int))
        per = max(1, features // (len(KERNEL_TWOS) * len(dilations)))
        self.dilations = [int(d) for d in dilations]
        # Every other dilation sees padded windows: MiniRocket alternates padding like this (over
        # kernel-dilation pairs), so that features see both the edges and the middle.
        self.paddings = [(KERNEL_LENGTH - 1) * d // 2 if index % 2 == 0 else 0
                         for index, d in enumerate(self.dilations)]
        self.biases_per_kernel, self.window_steps = per, window_steps
        # Each kernel at each dilation sums a random subset of channels (1 to all, a few usually).
        subsets = torch.zeros(len(self.dilations), len(KERNEL_TWOS), in_channels, device="cpu")
        for d in range(len(self.dilations)):
            for k in range(len(KERNEL_TWOS)):
                count = min(in_channels, int(2 ** torch.empty(1, device="cpu").uniform_(0, np.log2(in_channels + 1),
                                                                           generator=generator)))
                chosen = torch.randperm(in_channels, generator=generator, device="cpu")[:max(1, count)]
                subsets[d, k, chosen] = 1.0
        self.register_buffer("weights", subsets[:, :, :, None] * kernels[None, :, None, :])  # [D, 84, C, 9]
        self.register_buffer("biases", torch.zeros(len(self.dilations), len(KERNEL_TWOS), per))
        num_features = len(self.dilations) * len(KERNEL_TWOS) * per
        self.register_buffer("feature_mean", torch.zeros(num_features))
        self.register_buffer("feature_std", torch.ones(num_features))
        # Each feature's T' over a window: what every training step on a feature pool divides its counts
        # by, kept beside them on the device rather than built from a list (a host copy) each step.
        self.register_buffer("window_positions", self.positions(window_steps, "cpu"), persistent=False)
        # What each dilation adds to a padded window's own length to give its T', beside the lengths on
        # the device for the same reason.
        self.register_buffer("reaches", torch.tensor(self._reaches(), device="cpu"), persistent=False)
        # Whether the windows end in NaN padding: a buffer, so that checkpoints carry it, mirrored on the
        # host (`padded`: set by fit and by loading) rather than read at every batch, where a GPU would wait.
        self.register_buffer("nan_padding", torch.zeros((), dtype=torch.bool, device="cpu"))
        self._padded = False
        self._count = None  # the compiled compare-and-count, once prepare_pool chose it
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(num_features, num_classes))

    def transform(self, x, one_bias_at_a_time=True, fused=True, shared_sums=False):
        """[B, C, T] -> PPV features [B, D x 84 x biases] (no gradient flows into them): each feature's
        count of positive positions over its T' positions, the exact proportion that a mean over them
        gives. one_bias_at_a_time: compare a kernel's output with its biases in turn, through a scratch
        tensor that stays in a CPU's caches; False compares with all of them at once, in fewer and
        larger operations (the same features; benchmarks.gpu_check.minirocket times both).
        fused: on a CUDA GPU with triton, one kernel that counts in registers (models.minirocket_fused;
        its counts differ only where an output lies within float rounding of its bias); shared_sums: its
        variant that reads three taps a kernel and channel beside nine-tap sums computed once (timed
        against it by the same benchmark)."""
        if self.padded:
            lengths = own_lengths(x)
            counts = self._float_counts(torch.nan_to_num(x, nan=0.0), one_bias_at_a_time, fused=False, lengths=lengths)
            return counts / self.own_positions(lengths)
        # The buffer at the model's own window length: a tensor made from a list is a host copy, which
        # a step recorded as a CUDA graph cannot hold.
        steps = self.window_positions if x.shape[2] == self.window_steps else self.positions(x.shape[2], x.device)
        return self._float_counts(x, one_bias_at_a_time, fused, shared_sums=shared_sums) / steps

    def positions(self, window_steps, device):
        """Each feature's T': the positions its kernel's output has over a window of `window_steps`."""
        per_dilation = len(KERNEL_TWOS) * self.biases_per_kernel
        return torch.tensor(self._output_lengths(window_steps), dtype=torch.float32,
                            device=device).repeat_interleave(per_dilation)

    def _output_lengths(self, window_steps):
        """T' of each dilation's outputs over a window of `window_steps`."""
        return [window_steps + reach for reach in self._reaches()]

    def _reaches(self):
        """What each dilation adds to a window's length to give its T' (its padding, less its reach)."""
        return [2 * padding - (KERNEL_LENGTH - 1) * dilation
                for dilation, padding in zip(self.dilations, self.paddings, strict=True)]

    def own_positions(self, lengths):
        """[B, F]: each feature's T' over each window of its own length `lengths` [B]; NaN where the
        kernel reaches beyond the window (no outputs, so no proportion)."""
        per_dilation = (lengths[:, None] + self.reaches).float()
        positions = per_dilation.repeat_interleave(len(KERNEL_TWOS) * self.biases_per_kernel, dim=1)
        return positions.where(positions > 0, float("nan"))

    @property
    def padded(self):
        """Whether windows end in NaN padding (fit's `padded`, or the loaded weights')."""
        return self._padded

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint from before unequal lengths were read holds no flag: its windows had no padding.
        flag = state_dict.setdefault(prefix + "nan_padding", torch.zeros((), dtype=torch.bool))
        self._padded = bool(flag)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def prepare_pool(self, windows, say):
        """Before a pool of `windows` windows is built: on a CPU, from COMPILED_COUNT_WINDOWS up,
        count with the compiled loop (models.minirocket_compiled) once it has given the eager counts
        on a first chunk; anything else, its compile failing included, keeps the eager counts. `say`
        gets one line where the loop was tried."""
        if (self._count is not None or self.padded or self.weights.device.type != "cpu"
                or windows < COMPILED_COUNT_WINDOWS):
            return
        started, channels = time.perf_counter(), self.weights.shape[2]
        chunk = torch.randn(TRANSFORM_CHUNK["cpu"], channels, self.window_steps,
                            generator=torch.Generator().manual_seed(QUANTILE_SEED)).cumsum(dim=2)
        # A chunk and a single window (a batch of one compiles apart), on one thread as the build's
        # chunks run (one_chunk_per_core): the graphs compiled and checked here are the ones it calls.
        checks, threads = (chunk, chunk[:1]), torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                eager = [self._float_counts(check) for check in checks]
                self._count = compiled_positive_counts()
                compiled = [self._float_counts(check) for check in checks]
        except Exception as exc:  # noqa: BLE001 - a compiler missing or failing only costs the speed-up
            self._count = None
            say(f"transform: counting eagerly, the compiled loop failed ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'})")
            return
        finally:
            torch.set_num_threads(threads)
        if not all(map(torch.equal, compiled, eager)):
            self._count = None
            say("transform: counting eagerly, the compiled loop's counts differed from the eager ones on a check")
            return
        say(f"transform: comparisons counted by a compiled loop ({windows:,} windows; ready in "
            f"{time.perf_counter() - started:.1f} s, its counts checked against the eager ones)")

    def __getstate__(self):
        # The compiled loop is this process's and does not pickle: a pickled model counts eagerly.
        return {**super().__getstate__(), "_count": None}

    @property
    def count_dtype(self):
        """The narrowest type that holds every count exactly (a feature pool's: 1/4 or 1/2 of float32),
        from the dilations' T' rather than a pass over every feature's."""
        return torch.uint8 if max(self._output_lengths(self.window_steps)) <= 255 else torch.uint16

    def pool_features(self, x):
        """[B, C, T] windows -> each feature's count of positive positions [B, F] as count_dtype: what a
        feature pool holds; forward turns it back into exactly the features `features` gives. Padded
        windows' counts have no common T' to divide by: their pool holds the features themselves."""
        if self.padded:
            return self.features(x)
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            return self._float_counts(x.float()).to(self.count_dtype)

    def pool_identity_parts(self):
        """Every fixed part in its state (the head's weights learn), then the dilations and paddings, which
        no buffer holds. The padding flag shows in the pool's type (a padded pool holds float features, not
        counts): left out, so that pools written before the flag existed keep their identity."""
        fixed = [tensor for name, tensor in self.state_dict().items()
                 if not name.startswith("head.") and name != "nan_padding"]
        return [*fixed, repr(self.dilations), repr(self.paddings)]

    def _float_counts(self, x, one_bias_at_a_time=True, fused=True, lengths=None, shared_sums=False):
        """Counts [B, F] as floats; with `lengths` [B], each window's over its own outputs only."""
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            # A graph being recorded (export, compile): one pass over the batch, whose size the
            # graph must leave free, and no writes into a scratch tensor of a recorded size.
            return self._counts(x, None, lengths)
        if fused and x.device.type == "cuda" and triton_installed():
            from models.minirocket_fused import fused_counts  # triton's import is paid only where it runs
            return fused_counts(x, self, shared_sums=shared_sums)
        if not len(x):
            return self._counts(x, None, lengths)
        chunk = self._chunk_counts if one_bias_at_a_time else self._all_biases_counts
        size = TRANSFORM_CHUNK.get(x.device.type, TRANSFORM_CHUNK_ELSEWHERE)
        pieces = lengths.split(size) if lengths is not None else [None] * len(x.split(size))
        parts = list(zip(x.split(size), pieces, strict=True))
        if x.device.type == "cpu" and len(parts) > 1 and torch.get_num_threads() > 1:
            return torch.cat(one_chunk_per_core(lambda part: chunk(*part), parts))
        with full_fp32_convolutions(x.device):
            return torch.cat([chunk(*part) for part in parts])

    def _all_biases_counts(self, x, lengths=None):
        return self._counts(x, None, lengths)

    def _chunk_counts(self, x, lengths=None):
        # One scratch tensor for every comparison of the chunk: a fresh one each time would cost page
        # faults on a CPU.
        return self._counts(x, x.new_empty(len(x) * len(KERNEL_TWOS) * x.shape[2]), lengths)  # T' <= T

    def _counts(self, x, scratch, lengths=None):
        features = []
        for d, (dilation, padding, reach) in enumerate(zip(self.dilations, self.paddings, self._reaches(),
                                                           strict=True)):
            output = nn.functional.conv1d(x, self.weights[d], padding=padding, dilation=dilation)  # [B, 84, T']
            if lengths is not None:  # the outputs past each window's own T' are never positive
                beyond = torch.arange(output.shape[2], device=x.device) >= (lengths + reach)[:, None]  # [B, T']
                output.masked_fill_(beyond[:, None, :], float("-inf"))
            # output > -bias written as floats, which vectorises where booleans do not; in IEEE
            # arithmetic it is exactly output + bias > 0, the definition. A sum of ones is exact.
            if scratch is None or self._count is not None:  # all biases at once, or prepare_pool's loop
                count = positive_counts if scratch is None else self._count
                features.append(count(output, -self.biases[d]).flatten(1))
                continue
            # One bias at a time into a [B, 84, T'] scratch: written and read back while it is still in
            # the caches, where all biases at once ([B, 84, biases, T']) went out to memory and back.
            positive = scratch[:output.numel()].view(output.shape)
            shares = [torch.gt(output, -self.biases[d][:, j, None], out=positive).sum(dim=2)
                      for j in range(self.biases_per_kernel)]
            features.append(torch.stack(shares, dim=2).flatten(1))
        return torch.cat(features, dim=1)

    def features(self, x):
        """[B, C, T] windows -> the head's input [B, F]: PPV features standardised, in fp32 whatever
        AMP is on (a bias fitted in fp32 sits within a rounding step of many bf16 outputs, and a
        flipped comparison is a changed feature), with no gradient."""
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            features = (self.transform(x.float()) - self.feature_mean) / self.feature_std
            return torch.nan_to_num(features, nan=0.0) if self.padded else features  # no proportion: the mean

    def from_counts(self, counts):
        """pool_features(windows) [B, F] -> features(windows), the same floats bit for bit: counts are
        divided and standardised; floats (a padded model's pool) are the features already."""
        if counts.is_floating_point():
            return counts
        with torch.no_grad(), torch.autocast(counts.device.type, enabled=False):
            # In place: one new [B, F] tensor, not four (each a fresh megabyte or more, which glibc
            # may hand back and fault in again on the next batch).
            features = counts.to(torch.float32)
            return features.div_(self.window_positions).sub_(self.feature_mean).div_(self.feature_std)

    def forward(self, x):
        # Windows [B, C, T], or computed once (a feature pool): their counts, or their features [B, F].
        if x.dim() == 2:
            return self.head(self.from_counts(x))
        return self.head(self.features(x))

    # 512 windows: the feature statistics' transform is most of the fit, and on the 7 nested outer folds
    # 512 scored as 1,024 did (mean 0.9757 both; worst person 0.917 against 0.911, worst fold 0.957
    # against 0.961) in half the time.
    @torch.no_grad()
    def fit(self, signals, padded=False, max_windows=512):
        """Biases from quantiles of each kernel's output on random training windows, then the mean
        and std of the features over those windows. `signals` [N, C, T]: an array, a tensor, or a
        window store's signals; only the max_windows drawn are read. `padded`: the data's windows end
        in NaN padding, each read over its own length from now on."""
        self.nan_padding.fill_(padded)
        self._padded = padded
        generator = torch.Generator().manual_seed(QUANTILE_SEED)
        positions = torch.randperm(len(signals), generator=generator)[:max_windows]
        if isinstance(signals, torch.Tensor):  # on any device (a GPU tensor has no numpy view)
            sample = signals[positions.to(signals.device)].float()
        else:
            sample = torch.as_tensor(np.asarray(signals[positions.numpy()], dtype=np.float32))
        sample = sample.to(self.weights.device)
        kernels = len(KERNEL_TWOS)
        quantiles = torch.rand(len(self.dilations), kernels, self.biases_per_kernel, generator=generator)
        # MiniRocket takes the quantiles of one random window's output per kernel and dilation; the
        # draws come in the order a loop over dilations, then kernels, would take them.
        drawn = torch.randint(len(sample), (len(self.dilations), kernels), generator=generator)
        lengths = own_lengths(sample).cpu() if padded else None  # beside `drawn`, on the host
        inputs = torch.nan_to_num(sample, nan=0.0) if padded else sample
        with full_fp32_convolutions(sample.device):
            for d, (dilation, padding, reach) in enumerate(zip(self.dilations, self.paddings, self._reaches(),
                                                               strict=True)):
                # Padded: each kernel's window one with outputs at this dilation, and only those read.
                own = own_outputs(lengths, sample.shape[2] + reach, reach, drawn[d], generator) if padded else None
                # Kernel k on its own window: one grouped convolution for the dilation's 84 kernels.
                windows = inputs[drawn[d].to(sample.device)].reshape(1, -1, sample.shape[2])  # [1, 84 x C, T]
                outputs = nn.functional.conv1d(windows, self.weights[d], padding=padding, dilation=dilation,
                                               groups=kernels)[0]  # [84, T']
                self.biases[d] = -row_quantiles(outputs, quantiles[d].to(outputs.device),
                                                own.to(outputs.device) if padded else None)
        features = self.transform(sample)
        if padded:  # over the windows each feature has a proportion for (none: the mean 0, std 1)
            mean = features.nanmean(dim=0)
            spread = ((features - mean) ** 2).nansum(dim=0) / ((~features.isnan()).sum(dim=0) - 1).clamp_min(1)
            self.feature_mean.copy_(mean.nan_to_num(0.0))
            self.feature_std.copy_(spread.sqrt().nan_to_num(1.0).clamp_min(1e-3))
            return
        self.feature_mean.copy_(features.mean(dim=0))
        self.feature_std.copy_(features.std(dim=0).clamp_min(1e-3))


@contextlib.contextmanager
def full_fp32_convolutions(device):
    """cuDNN's convolutions in full fp32 inside the block. By default they round fp32 inputs to TF32
    (10 bits of mantissa) on Ampere and newer GPUs: as coarse as the fp16 that `features` keeps out,
    and every comparison it flips against a bias fitted in fp32 is a changed feature."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    saved, cudnn.allow_tf32 = cudnn.allow_tf32, False
    try:
        yield
    finally:
        cudnn.allow_tf32 = saved


@functools.cache
def triton_installed():
    return importlib.util.find_spec("triton") is not None


def one_chunk_per_core(function, chunks):
    """[function(chunk) for chunk in chunks], a chunk per core at a time, each on one thread. A
    chunk's operations are too small to share out between threads: spread inside each operation,
    they scaled poorly on two cores and fell far below one thread whenever another process wanted
    a core (every operation waits for its slowest thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # for every thread of the process; put back below
    try:
        return list(thread_pool(threads).map(function, chunks))  # the operations release the GIL
    finally:
        torch.set_num_threads(threads)


@functools.cache
def thread_pool(threads):
    # Kept for the process: a transform per training or evaluation batch (--feature-views 0)
    # would otherwise start and join its threads every time.
    return ThreadPoolExecutor(threads, thread_name_prefix="minirocket")


def own_lengths(windows):
    """[B] steps before each window's NaN padding (windows [B, C, T]; the data's checks allow NaN only
    at a window's end, on every channel at once)."""
    return (~torch.isnan(windows).any(dim=1)).sum(dim=1)


def own_outputs(lengths, whole, reach, drawn, generator):
    """Each drawn window's T' at a dilation that adds `reach` to a length. A drawn window with none (a
    kernel reaching beyond it) is drawn again, in place in `drawn`, from those that have some; where
    none has any, its `whole` T', the outputs over its padding included."""
    outputs = lengths + reach
    short = outputs[drawn] <= 0
    eligible = torch.nonzero(outputs > 0).flatten()
    if short.any() and len(eligible):
        drawn[short] = eligible[torch.randint(len(eligible), (int(short.sum()),), generator=generator)]
    return outputs[drawn].where(outputs[drawn] > 0, whole)


def row_quantiles(rows, quantiles, lengths=None):
    """Each row's own quantiles [R, Q] of rows [R, N], interpolated linearly between the two order
    statistics around q x (N - 1), as torch.quantile does for one row at a time; with `lengths` [R],
    of each row's first lengths[r] values only."""
    count = rows.shape[1]
    if lengths is not None:
        rows = rows.masked_fill(torch.arange(count, device=rows.device) >= lengths[:, None], float("inf"))
        count = lengths.clamp(1, count)[:, None].to(quantiles.dtype)
    ordered = rows.sort(dim=1).values
    ranks = quantiles * (count - 1)
    below = ordered.gather(1, ranks.long())
    above = ordered.gather(1, ranks.ceil().long())
    return torch.lerp(below, above, ranks - ranks.long())
