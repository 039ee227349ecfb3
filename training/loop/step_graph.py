"""Whole-step CUDA graphs (--cuda-graphs): one optimizer step (augmentations, forward, loss, backward,
clipping, AdamW and the weight average) recorded once as a CUDA graph and replayed for every full
batch, so that a small model's step costs the host one launch instead of a few hundred.

What makes the step recordable: the augmentations draw on the GPU from torch's CUDA generator (a
replay advances it as the eager step would), clipping never reads the norm back, AdamW is fused and
capturable with its LR a device scalar that the schedule fills, and the weight average folds with
a device-scalar weight. Batches are copied into the graph's own input buffers. A batch of another
shape (an epoch's last) and every accumulating micro-batch run the eager step on the same
optimizer, so resume and accumulation behave as without graphs.
"""
import torch
import torch.nn.functional as F

# Eager passes on a side stream before recording: they create AdamW's state, cuBLAS's workspace and
# the caching allocator's blocks, which a recording may not. Their effect is undone afterwards.
WARMUP_PASSES = 3


def records_step_graph(wanted, model, strategy, precision, grad_accum_steps, compiled, warn):
    """Whether the run records its step: `wanted` is --cuda-graphs (True), --no-cuda-graphs (False) or
    neither (None: a model whose step was shown to record, STEP_RECORDS, records it wherever the run
    allows). Asked for where the run cannot, `warn` gets a line saying why and the step runs eagerly."""
    if wanted is False or (wanted is None and not model.STEP_RECORDS):
        return False
    fallback = graph_fallback(strategy, precision, grad_accum_steps, compiled)
    if fallback and wanted:
        warn(fallback)
    return fallback is None


def graph_fallback(strategy, precision, grad_accum_steps, compiled=False):
    """Why this run's step cannot be one graph (a line for the log), or None when it can."""
    if compiled:  # --compile and --cuda-graphs together are refused; this is the default meeting --compile
        return "--cuda-graphs: the step runs eagerly under --compile (torch.compile records its own graphs)"
    if strategy.device.type != "cuda":
        return f"--cuda-graphs: the step runs eagerly on {strategy.device.type} (CUDA graphs need a GPU)"
    if strategy.data_parallel_size > 1 and not strategy.replicated:  # replicas step alone: nothing to exchange
        return (f"--cuda-graphs: the step runs eagerly under {strategy.name} (a recorded step cannot hold the "
                "ranks' collectives or DataParallel's threads); one process on one GPU, or each rank of a "
                "replicated head, records it")
    if precision.needs_grad_scaler:
        return ("--cuda-graphs: the step runs eagerly under fp16 (its GradScaler decides on the host whether a "
                "step happens); use --amp-dtype bf16 to record it")
    if grad_accum_steps > 1:
        return (f"--cuda-graphs: the step runs eagerly with --grad-accum-steps {grad_accum_steps} (a recorded "
                "step holds one micro-batch)")
    return None


class WholeStepGraph:
    """The recorded step of one TrainStep; built on the first full batch it is given. Where recording
    fails (an operation a graph cannot hold), `warn` gets one line and every step runs eagerly."""

    def __init__(self, step, warn):
        self.step, self.warn = step, warn
        self.failed = False
        self.graph = None
        self.inputs = None  # (signals, labels): the buffers the graph reads each replay
        self.loss = None  # the buffer it writes the batch's loss to
        self.grads = None  # the gradients it writes: held here, since the eager path sets .grad to None
        device = step.strategy.device
        self.average_weight = torch.zeros((), device=device) if step.ema is not None else None

    def takes(self, signals, labels, window_size):
        """Whether this micro-batch can be a replay: a whole window, shaped as the recorded batch."""
        if window_size != 1 or self.failed:
            return False
        if self.inputs is None:
            return True
        return signals.shape == self.inputs[0].shape and labels.shape == self.inputs[1].shape

    def run(self, signals, labels):
        """The whole optimizer step on this batch (recorded first, if not yet); returns its loss, or None
        where recording failed and the caller must take the step eagerly."""
        if self.graph is None and not self._recorded(signals, labels):
            return None
        self.inputs[0].copy_(signals, non_blocking=True)
        self.inputs[1].copy_(labels, non_blocking=True)
        if self.average_weight is not None:
            self.average_weight.fill_(self.step.ema.next_weight())
        self.graph.replay()
        return self.loss.clone()  # the tally keeps it; the next replay overwrites the buffer

    def before_eager_step(self):
        """An eager step starts from no gradients, not from the last replay's."""
        if self.grads is not None:
            self.step.optimizer.zero_grad(set_to_none=True)

    def _whole_step(self):
        step = self.step
        signals, labels = self.inputs
        if step.augment is not None:
            signals = step.augment(signals, labels)
        # Autocast's cache of cast weights would hold tensors from outside the recording.
        with step.precision.autocast(cache_enabled=False):
            loss = F.cross_entropy(step.model(signals), labels, label_smoothing=step.label_smoothing)
        loss.backward()
        if step.max_grad_norm > 0:
            step.strategy.clip_grad_norm_(step.parameters, step.max_grad_norm)
        step.optimizer.step()
        if step.ema is not None:
            step.ema.fold(self.average_weight)
        return loss.detach()

    def _recorded(self, signals, labels):
        """Warm up and record; False (after one warning line) where that fails, the run's state as before."""
        device = self.step.strategy.device
        self.inputs = (torch.empty_like(signals, device=device), torch.empty_like(labels, device=device))
        self.inputs[0].copy_(signals)
        self.inputs[1].copy_(labels)
        saved = _RunState(self.step)
        generator = torch.cuda.default_generators[device.index if device.index is not None else 0]
        # A recording that fails leaves the generator marked as recording, and every later random
        # draw outside a recording then raises: a copy of its state taken now replaces it after a failure.
        clean_state = generator.clone_state()
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_PASSES):
                    self.step.optimizer.zero_grad(set_to_none=True)
                    self._whole_step()
            torch.cuda.current_stream(device).wait_stream(side)
            saved.restore()
            self.step.optimizer.zero_grad(set_to_none=True)  # the recording allocates the gradients it writes
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.loss = self._whole_step()
        except RuntimeError as exc:  # an operation that a recording refuses
            generator.graphsafe_set_state(clean_state)
            torch.cuda.synchronize(device)
            saved.restore()
            self.step.optimizer.zero_grad(set_to_none=True)
            self.graph, self.inputs, self.failed = None, None, True
            reason = (str(exc).strip().splitlines() or [""])[0][:200]
            self.warn(f"--cuda-graphs: recording the step failed ({type(exc).__name__}: {reason}); "
                      "the run goes on with the eager step (pass --no-cuda-graphs to skip the attempt)")
            return False
        self.grads = [parameter.grad for parameter in self.step.parameters]
        return True


class _RunState:
    """What the warm-up passes change, copied aside and put back in place (the recording keeps the
    tensors' addresses): weights and buffers of the model and its average, AdamW's state (state the
    warm-up created starts from zero, as AdamW's own does), and the random streams."""

    def __init__(self, step):
        self.step = step
        modules = [step.model] + ([step.ema.module] if step.ema is not None else [])
        self.tensors = [tensor for module in modules for tensor in (*module.parameters(), *module.buffers())]
        self.copies = [tensor.detach().clone() for tensor in self.tensors]
        self.optimizer_state = {id(tensor): tensor.clone() for state in step.optimizer.state.values()
                                for tensor in state.values() if isinstance(tensor, torch.Tensor)}
        self.cpu_random, self.cuda_random = torch.get_rng_state(), torch.cuda.get_rng_state(step.strategy.device)

    def restore(self):
        with torch.no_grad():
            for tensor, copy in zip(self.tensors, self.copies, strict=True):
                tensor.copy_(copy)
            for state in self.step.optimizer.state.values():
                for tensor in state.values():
                    if isinstance(tensor, torch.Tensor):
                        saved = self.optimizer_state.get(id(tensor))
                        tensor.copy_(saved) if saved is not None else tensor.zero_()
        torch.set_rng_state(self.cpu_random)
        torch.cuda.set_rng_state(self.cuda_random, self.step.strategy.device)
