"""The whole run: what `python main.py` with the profiler's flags would take, part by part, on one
process and on N ranks. The optimizer step is the profiler's headline measurement; what a run
does besides stepping (start-up, reading the data, the set-up with a model's feature pool, the
validation and checkpoint after each epoch, the final evaluation) is measured here once, on the
run the profiler built, and the arithmetic that puts them together is predict_run."""
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from profiling.comm_model import rank_step_s, ring_allreduce_time_s
from profiling.entry_points import REPO, env_without_torchrun
from profiling.topology import available_cores, ranks_on_node, ring_link
from training.loop.epochs import train_epoch
from training.loop.step import steps_per_epoch
from training.reporting.final_report import report_best_weights
from training.reporting.logger import process_age_s


@dataclass(frozen=True)
class RunParts:
    """What one process measured of a run besides its optimizer steps; seconds unless named."""
    start_up_s: float  # Python and main.py's imports, before the run began
    imports_s: float  # the imports main.py's run adds that the profiler's timed set-up did not pay
    exit_s: float  # the interpreter's teardown after the run
    inputs_s: float  # reading the data (and a checkpoint)
    set_up_s: float  # device, model, fit and the feature pool: everything before the first step
    build_s: float  # of set_up_s, the feature pool's build; 0 without a pool
    loop_s: float  # per optimizer step, what the epoch loop adds to the step (progress, logging, the epoch's ends)
    validation_s: float  # one pass over the validation split, after every epoch
    save_s: float  # one checkpoint, after every epoch
    final_eval_s: float  # the final report: best.pt reloaded, judged on the validation and test splits
    epochs: int
    train_windows: int  # what one epoch trains on: the training split (one view of the pool)
    batch_size: int  # per rank
    grad_accum_steps: int
    # {N: seconds of a step on N ranks' batches at once}, where N ranks would each step the whole
    # global batch on a replica of the head (profiling.measure.replica_steps_s); None elsewhere.
    replica_step_s: dict = None
    # What main_multi_gpu.py's launcher adds to a run of 2+ ranks on this host (launcher_s); None where
    # not measured, and one more start-up stands for it.
    launcher_s: float = None
    # Epochs' worth of steps after the run's own epochs (training/loop/refit.py): the recipe's plain
    # candidate (--epochs, each validated) and the final model (at most --epochs, on the training and
    # validation windows): an upper bound, since the final model trains for the epochs validation
    # chooses. after_validations: the validation passes among them.
    after_epochs: float = 0.0
    after_validations: int = 0


def epoch_steps(train_windows, world_size, batch_size, grad_accum_steps):
    """Optimizer steps in one epoch on `world_size` ranks: each takes 1/N of the windows (the sampler
    pads to equal shares), in batches of batch_size, the last one partial."""
    per_rank = math.ceil(train_windows / world_size)
    return steps_per_epoch(math.ceil(per_rank / batch_size), grad_accum_steps)


def share_build_s(build_s, world_size, on_node, device_type, threads, cores):
    """The feature build's transform on `world_size` ranks, each taking 1/N of the pool's windows, with
    `on_node` of them on the busiest node. On GPUs each rank has a device of its own: 1/N of the time.
    On CPU a node's ranks share its cores: the lone build ran on `threads` of `cores` (all of them at
    most), and a node's ranks together can use no more than its cores, so one node shrinks the build
    by at most cores / threads, and each further node adds its own cores."""
    if world_size <= 1:
        return build_s
    if device_type != "cpu":
        return build_s / world_size
    lone_threads = min(threads, cores)
    return build_s * on_node * lone_threads / (world_size * min(on_node * lone_threads, cores))


def gather_pool_s(pool_bytes, world_size, link):
    """Every rank receiving the others' shares of the pool (each share broadcast by its owner): the
    bytes of one ring pass (an all-gather), (N - 1) / N of the pool into each rank."""
    return ring_allreduce_time_s(pool_bytes, world_size, link.bandwidth_bytes_per_s, link.latency_s, passes=1)


def predict_run(parts, world_size, step_s, build_s):
    """{part: seconds} of the run on `world_size` ranks whose optimizer step takes step_s and whose
    feature build takes build_s (the lone process's parts.build_s, or a share's). Start-up, inputs and
    the rest of the set-up are each rank's own, as long as on one; 2+ ranks start after their
    launcher (torchrun's agent, an interpreter that imports torch first; CPU ranks are forked from it,
    and then a rank's start-up stands for the launcher's), which also waits for their end:
    parts.launcher_s where measured, else about one start-up more;
    the evaluation passes split the windows over the ranks; each epoch saves one checkpoint; the head's
    passes after the epochs (parts.after_epochs) step as the epochs do."""
    steps = epoch_steps(parts.train_windows, world_size, parts.batch_size, parts.grad_accum_steps)
    launcher_s = 0.0 if world_size <= 1 else parts.start_up_s if parts.launcher_s is None else parts.launcher_s
    fixed_s = (launcher_s + parts.start_up_s + parts.imports_s + parts.inputs_s + parts.set_up_s - parts.build_s
               + parts.exit_s)
    stepping_s = (parts.epochs + parts.after_epochs) * steps * (step_s + parts.loop_s)
    training_s = (stepping_s + parts.epochs * (parts.validation_s / world_size + parts.save_s)
                  + parts.after_validations * parts.validation_s / world_size)
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


# A fresh interpreter that starts as `python main.py` does (its age once main.py is imported), then
# imports the modules named on its stdin (the seconds that takes), then exits as main.py does, at
# once (the rest of its wall time).
FRESH_MAIN = """import importlib, sys, time
import main
from training.entry_point import exit_process
from training.reporting.logger import process_age_s
age, started = process_age_s(), time.perf_counter()
for name in sys.stdin.read().split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
print(age, time.perf_counter() - started)
exit_process(0, at_once=True)
"""
# Imported by main.py's run but never by the profiler's quiet one: TensorBoard's writer.
RUN_ONLY_MODULES = ("torch.utils.tensorboard",)
PROFILER_ONLY = ("profiler", "profiling", "benchmarks", "tests", "conftest", "pytest", "_pytest", "__main__",
                 "__mp_main__")


# main_multi_gpu.py's launcher in a fresh interpreter: torch.distributed.run in this process over the
# workers named (a script that does nothing, how many, and "fork" where they are forked from it), then
# left at once as main_multi_gpu.py leaves.
FRESH_LAUNCHER = """import sys
from training.distributed.launch import run_torchrun, torchrun_arguments
from training.entry_point import exit_process
exit_process(run_torchrun(torchrun_arguments(sys.argv[1], [], int(sys.argv[2]), fork=sys.argv[3] == "fork")),
             at_once=True)
"""
# The launcher's own start and exit, without a launch.
LAUNCHER_START = """from training.distributed.launch import run_torchrun
from training.entry_point import exit_process
exit_process(0, at_once=True)
"""


LAUNCH_TIMEOUT_S = 120  # a launch that takes longer is not measured: a start-up stands for it


def launcher_s(world_size=2, fork=False):
    """Seconds main_multi_gpu.py's launcher adds to a run of `world_size` ranks on this host: a fresh
    launcher over that many workers that do nothing, from its start to its end, less the start and
    exit the ranks' own start-up and exit count. Workers in fresh interpreters (GPU ranks) each start
    one: less one bare interpreter's. Workers forked from the launcher (CPU ranks, fork) start inside
    it, torch imported: less the launcher's own start and exit, a rank's start-up standing for that.
    The rendezvous, the workers' start and the wait for their end are the rest. None where the launch
    fails."""
    def run(command):
        return subprocess.run(command, cwd=REPO, env=env_without_torchrun(), capture_output=True, check=True,
                              timeout=LAUNCH_TIMEOUT_S)

    with tempfile.TemporaryDirectory(prefix="har-launch-") as scratch:
        worker = Path(scratch) / "worker.py"
        worker.write_text("")
        own_start = [sys.executable, "-c", LAUNCHER_START] if fork else [sys.executable, str(worker)]
        try:
            start_s = timed_s(lambda: run(own_start))
            job_s = timed_s(lambda: run([sys.executable, "-c", FRESH_LAUNCHER, str(worker), str(world_size),
                                         "fork" if fork else "fresh"]), times=1)
        except (OSError, subprocess.SubprocessError):  # failed or timed out
            return None
    return max(job_s - start_s, 0.0)


def main_start_and_exit_s(loaded_before_set_up):
    """(seconds before main.py's run begins, seconds of imports its run adds that the profiler's
    timed set-up did not pay, seconds its interpreter takes to exit), from a fresh interpreter. The
    profiler's own start cannot stand for main.py's: it imports at its start the FSDP, DTensor and
    compiler modules its advisor measures (0.45 s more on the 2-core development machine), which
    main.py imports during its set-up instead; those (the modules loaded before the profiler's set-up,
    less its own) and TensorBoard's are imported by the fresh interpreter after main.py, timed apart.
    Where main.py cannot be imported (a copy without it), the profiler's own start and nothing else."""
    names = [name for name in loaded_before_set_up if name.split(".")[0] not in PROFILER_ONLY]
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", FRESH_MAIN], cwd=REPO, capture_output=True, text=True,
                            input=" ".join([*names, *RUN_ONLY_MODULES]))
    wall_s = time.perf_counter() - started
    try:
        age_s, imports_s = map(float, result.stdout.strip().splitlines()[-1].split())
    except (ValueError, IndexError):  # no /proc (age None), or no main.py
        return process_age_s() or 0.0, 0.0, 0.0
    return age_s, imports_s, max(wall_s - age_s - imports_s, 0.0)


EPOCH_PASS_LIMIT_S = 10.0  # one real epoch pass is timed where it takes no longer than this


def loop_s_per_step(trainer, step_s, steps):
    """What the trainer's epoch loop adds to each optimizer step (its progress and check-ins, the
    loader's epoch start, the epoch's partial last batch), from one real epoch pass
    (training.loop.epochs.train_epoch) against the measured step; 0 where a pass would take
    longer than EPOCH_PASS_LIMIT_S."""
    if steps * step_s > EPOCH_PASS_LIMIT_S:
        return 0.0
    result = train_epoch(trainer, 0)
    return max(result.train_time_s / max(result.steps, 1) - step_s, 0.0)


def measure_run_parts(work, step_s, loaded_before_set_up=(), replica_step_s=None, predicts_ranks=False):
    """RunParts of the profiled run, whose optimizer step took step_s: its set-up as build_workload
    timed it, and what main.py does besides (an epoch pass's loop, a validation pass and a checkpoint
    after each epoch, the final report) timed now on the profiled run's own trainer, in its scratch
    folder. Call it after the step's measurements: it trains an epoch, and the report reloads
    best.pt, the weights the checkpoint has just saved. loaded_before_set_up: the names in
    sys.modules when the profiler began its set-up (main_start_and_exit_s). predicts_ranks: runs of
    2+ ranks are predicted, so one process measures their launcher (launcher_s)."""
    trainer, config = work.trainer, work.trainer.config
    loop_s = loop_s_per_step(trainer, step_s, work.steps_per_epoch)
    validation_s = timed_s(lambda: trainer.evaluate("val")) if trainer.has_validation else 0.0
    save_s = timed_s(lambda: trainer.save(is_best=True))
    report_s = timed_s(lambda: report_best_weights(trainer), times=1)  # once, as a run reports
    pool = work.pool or {}
    # Rank 0's alone, the one written: fresh interpreters started on every rank at once would share the
    # cores and time each other.
    start_up_s, imports_s, exit_s = main_start_and_exit_s(loaded_before_set_up) if work.strategy.is_main \
        else (0.0, 0.0, 0.0)
    after_epochs, after_validations = passes_after_the_epochs(trainer)
    return RunParts(start_up_s=start_up_s, imports_s=imports_s, exit_s=exit_s, inputs_s=work.inputs_s,
                    set_up_s=work.set_up_s,
                    build_s=pool.get("seconds", 0.0), loop_s=loop_s, validation_s=validation_s, save_s=save_s,
                    final_eval_s=report_s, epochs=config.optim.epochs, train_windows=work.train_windows,
                    batch_size=work.batch_size, grad_accum_steps=work.grad_accum_steps, replica_step_s=replica_step_s,
                    launcher_s=launcher_s(fork=work.strategy.device.type == "cpu")
                    if predicts_ranks and work.strategy.world_size == 1 else None,
                    after_epochs=after_epochs, after_validations=after_validations)


def passes_after_the_epochs(trainer):
    """(epochs' worth of steps, validation passes) the run takes after its epochs: the recipe's plain
    candidate where it chooses, the final model (at most --epochs, on the validation windows too)
    where it trains one by steps."""
    epochs = trainer.config.optim.epochs
    chooses = epochs if trainer.chooses else 0
    val_share = len(trainer.data.val) / max(len(trainer.data.train), 1)
    refits = epochs * (1 + val_share) if trainer.refits and trainer.head_pool is None else 0.0
    return chooses + refits, chooses


def run_time_entry(parts, work, predictions, topology, host_effects=None):
    """profile.json's "run_time": the parts, and the whole run predicted for each N the advisor
    predicts, its DDP step as the advisor predicts it, or where the ranks would step replicas of the
    head, the step on N batches at once, slowed as neighbours on the host slow a rank's step."""
    device, lone = work.strategy.device.type, work.strategy.world_size == 1
    threads, cores = torch.get_num_threads(), available_cores()
    pool_bytes = (work.pool or {}).get("bytes", 0)
    runs = []
    for prediction in predictions:
        n = prediction["world_size"]
        build_s = parts.build_s  # a profile on N ranks measured its own build, shares and gather included
        if lone and n > 1:
            build_s = share_build_s(build_s, n, ranks_on_node(n, topology.ranks_per_node), device, threads, cores) + \
                (gather_pool_s(pool_bytes, n, ring_link(topology, n)) if pool_bytes else 0.0)
        step_s = prediction["step_s"]
        if parts.replica_step_s and n in parts.replica_step_s:
            step_s = rank_step_s(parts.replica_step_s[n], n, host_effects, strategy="replicated")
        runs.append(predict_run(parts, n, step_s, build_s))
    return {"parts": asdict(parts), "predictions": runs, "ridge_in_main": work.ridge_in_main,
            "what": "total = start-up, the imports main.py's run adds, and exit (of a fresh interpreter "
                    "importing main.py; with N ranks, main_multi_gpu.py's launcher as a fresh one over 2 "
                    "workers that do nothing took on this host, else one start-up more) + inputs + set-up "
                    "besides the feature pool + the pool's build + epochs x (steps per epoch x (step time + the "
                    "epoch loop's own cost per step) + a validation pass + a checkpoint) + the final report "
                    "(best.pt judged on the validation and test splits); figures are not counted. For N ranks: "
                    "the advisor's DDP step (or, where the ranks would step replicas of the head, the step "
                    "on N batches at once with no all-reduce), the evaluation passes split N ways, and the "
                    "pool built in 1/N "
                    f"shares (on CPU at most {cores} cores / {threads} thread(s) faster on each node, a node's "
                    "cores being shared by its ranks) and then each share sent to the other ranks over the "
                    "slowest link of their ring; a profile of N ranks takes its own build for every N"}


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
