"""A short torch.profiler trace of the optimizer step, written for TensorBoard's profiler plugin."""
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from profiling.timing import barrier
from profiling.workload import optimizer_step

# Skip one step, warm the profiler up for two, record three: enough to see a steady step
# while keeping the trace file small.
TRACE_SCHEDULE = {"wait": 1, "warmup": 2, "active": 3, "repeat": 1}


def write_trace(work, trace_dir):
    """Run the schedule's steps under torch.profiler; one *.pt.trace.json per rank in trace_dir.
    Returns the files this call wrote (all ranks' where they share trace_dir)."""
    activities = [ProfilerActivity.CPU]
    if work.strategy.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    handler = tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{work.strategy.rank}")
    steps = TRACE_SCHEDULE["wait"] + TRACE_SCHEDULE["warmup"] + TRACE_SCHEDULE["active"]
    pattern = "rank*.pt.trace.json*"
    before = set(trace_dir.glob(pattern))
    with profile(activities=activities, schedule=schedule(**TRACE_SCHEDULE), on_trace_ready=handler,
                 record_shapes=True, profile_memory=True) as profiler:
        for _ in range(steps):
            optimizer_step(work, sync_gradients=True)
            profiler.step()
    work.strategy.synchronize()
    barrier(work.strategy)  # every rank's file is written before any rank lists them
    return sorted(str(path) for path in set(trace_dir.glob(pattern)) - before)

