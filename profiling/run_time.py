"""The whole run: what `python main.py` with the profiler's flags would take, part by part, on one
process and on N ranks. The optimizer step is the profiler's headline measurement; what a run
does besides stepping (start-up, reading the data, the set-up with a model's feature pool, the
validation and checkpoint after each epoch, the final evaluation) is measured here once, on the
run the profiler built, and the arithmetic that puts them together is predict_run."""
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from profiling.comm_model import ring_allreduce_time_s
from training.loop.step import steps_per_epoch


@dataclass(frozen=True)
class RunParts:
    """What one process measured of a run besides its optimizer steps; seconds unless named."""
    start_up_s: float  # Python and the imports, before the run began
    inputs_s: float  # reading the data (and a checkpoint)
    set_up_s: float  # device, model, fit and the feature pool: everything before the first step
    build_s: float  # of set_up_s, the feature pool's build; 0 without a pool
    validation_s: float  # one pass over the validation split, after every epoch
    save_s: float  # one checkpoint, after every epoch
    final_eval_s: float  # the validation and test passes after the last epoch
    epochs: int
    train_windows: int  # what one epoch trains on: the training split (one view of the pool)
    batch_size: int  # per rank
    grad_accum_steps: int


def epoch_steps(train_windows, world_size, batch_size, grad_accum_steps):
    """Optimizer steps in one epoch on `world_size` ranks: each takes 1/N of the windows (the sampler
    pads to equal shares), in batches of batch_size, the last one partial."""
    per_rank = math.ceil(train_windows / world_size)
    return steps_per_epoch(math.ceil(per_rank / batch_size), grad_accum_steps)


def share_build_s(build_s, world_size, device_type, threads, cores):
    """The feature build's transform on `world_size` ranks, each taking 1/N of the pool's windows.
    On GPUs each rank has a device of its own: 1/N of the time. On CPU the ranks share this host's
    cores: the lone build ran on `threads` of its `cores`, and N ranks together can use at most all
    of them, so the build shrinks by at most cores / threads, whatever N."""
    if world_size <= 1:
        return build_s
    speedup = world_size if device_type != "cpu" else min(world_size, max(cores / threads, 1.0))
    return build_s / speedup


def gather_pool_s(pool_bytes, world_size, link):
    """Every rank gathering the whole pool from the others' shares: one ring pass (all-gather)."""
    return ring_allreduce_time_s(pool_bytes, world_size, link.bandwidth_bytes_per_s, link.latency_s, passes=1)


def predict_run(parts, world_size, step_s, build_s):
    """{part: seconds} of the run on `world_size` ranks whose optimizer step takes step_s and whose
    feature build takes build_s (the lone process's parts.build_s, or a share's). Start-up, inputs and
    the rest of the set-up are each rank's own, as long as on one; the evaluation passes split the
    windows over the ranks; each epoch saves one checkpoint."""
    steps = epoch_steps(parts.train_windows, world_size, parts.batch_size, parts.grad_accum_steps)
    fixed_s = parts.start_up_s + parts.inputs_s + parts.set_up_s - parts.build_s
    stepping_s = parts.epochs * steps * step_s
    training_s = stepping_s + parts.epochs * (parts.validation_s / world_size + parts.save_s)
    evaluation_s = parts.final_eval_s / world_size
    total_s = fixed_s + build_s + training_s + evaluation_s
    return {"world_size": world_size, "steps_per_epoch": steps, "step_s": step_s, "fixed_s": fixed_s,
            "build_s": build_s, "stepping_s": stepping_s, "training_s": training_s, "evaluation_s": evaluation_s,
            "total_s": total_s, "build_share": build_s / total_s if total_s > 0 else 0.0}


def timed_s(call, times=2):
    """Seconds of the last of `times` calls: the first pays for first-call costs."""
    for _ in range(times):
        started = time.perf_counter()
        call()
        seconds = time.perf_counter() - started
    return seconds


def measure_run_parts(work, start_up_s):
    """RunParts of the profiled run: its set-up as build_workload timed it, and the passes after
    the epochs and at the end timed now on its own trainer (in the scratch folder)."""
    trainer, config = work.trainer, work.trainer.config
    validation_s = timed_s(lambda: trainer.evaluate("val")) if trainer.has_validation else 0.0
    save_s = timed_s(lambda: trainer.save(is_best=True))
    test_s = 0.0 if config.data.no_test else timed_s(lambda: trainer.evaluate("test"))
    pool = work.pool or {}
    return RunParts(start_up_s=start_up_s or 0.0, inputs_s=work.inputs_s, set_up_s=work.set_up_s,
                    build_s=pool.get("seconds", 0.0), validation_s=validation_s, save_s=save_s,
                    final_eval_s=validation_s + test_s, epochs=config.optim.epochs, train_windows=work.train_windows,
                    batch_size=work.batch_size, grad_accum_steps=work.grad_accum_steps)


def run_time_entry(parts, work, predictions, link):
    """profile.json's "run_time": the parts, and the whole run predicted for each N the advisor
    predicts, its DDP step as the advisor predicts it."""
    device, lone = work.strategy.device.type, work.strategy.world_size == 1
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1
    pool_bytes = (work.pool or {}).get("bytes", 0)
    runs = []
    for prediction in predictions:
        n = prediction["world_size"]
        build_s = parts.build_s  # a profile on N ranks measured its own build, shares and gather included
        if lone and n > 1:
            build_s = share_build_s(build_s, n, device, threads, cores) + \
                (gather_pool_s(pool_bytes, n, link) if pool_bytes else 0.0)
        runs.append(predict_run(parts, n, prediction["step_s"], build_s))
    return {"parts": asdict(parts), "predictions": runs,
            "what": "total = start-up + inputs + set-up besides the feature pool + the pool's build + epochs x "
                    "(steps per epoch x step time + a validation pass + a checkpoint) + the final validation "
                    "and test passes; figures and the test report's writing are not counted. For N ranks: "
                    "the advisor's DDP step, the evaluation passes split N ways, and the pool built in 1/N "
                    f"shares (on CPU at most {cores} cores / {threads} thread(s) faster, the host's cores "
                    "being shared) and then gathered over the link; a profile of N ranks takes its own "
                    "build for every N"}


def pool_entry(pool, rank=0):
    """profile.json's "feature_pool": the build's figures, with the windows/s of the transform and of
    the views' augmentation apart (this rank's busy time, the augmentation's taken out); None
    without a pool."""
    if not pool:
        return None
    mine = pool["per_rank"][rank]
    transform_s = mine["seconds"] - pool["augment_s"]
    return {**pool, "transform_windows_per_s": mine["windows"] / transform_s if transform_s > 0 else None,
            "augment_windows_per_s": pool["augmented_windows"] / pool["augment_s"] if pool["augment_s"] else None}
