"""A torchrun worker leaves through training.entry_point.exit_process, not through the interpreter's
teardown, where a gloo worker thread that still touches Python aborts the process."""
import sys

from conftest import REPO, run_subprocess

# Rank 0 leaves while its all-reduce still waits for rank 1; the all-reduce's Python callback then runs
# on a gloo worker thread. A slow teardown (the object's __del__) keeps the interpreter tearing down
# when rank 1 arrives, so a plain sys.exit would die by SIGABRT there; exit_process never tears down.
WORKER = """
import os, sys, time
import torch
import torch.distributed as dist
from training.entry_point import exit_process

dist.init_process_group("gloo")
marker = sys.argv[1]
if dist.get_rank() == 1:
    while not os.path.exists(marker):
        time.sleep(0.05)
    time.sleep(0.5)  # rank 0 is inside exit_process by now
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass  # rank 0 has gone: expected once it leaves without waiting
    exit_process(0)


class SlowTeardown:
    def __del__(self):
        time.sleep(3)


keep = SlowTeardown()
dist.all_reduce(torch.ones(1), async_op=True).get_future().then(lambda future: future.value())
print("rank 0 leaving")
open(marker, "w").close()
exit_process(0)
"""


def test_torchrun_worker_leaves_without_teardown_while_gloo_threads_are_busy(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result = run_subprocess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             script, tmp_path / "rank0-left"], timeout=120, env={"PYTHONPATH": str(REPO)})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "rank 0 leaving" in result.stdout and "terminate called" not in output


LAUNCHER = """
import atexit, sys
from training.entry_point import exit_process

atexit.register(lambda: open(sys.argv[1], "w").close())  # stands for the interpreter's teardown
if sys.argv[2] == "watched":
    sys.settrace(lambda *event: None)  # as a coverage tool or debugger would
print("workers ended")
exit_process(3, at_once=sys.argv[2] != "plainly")
"""


def test_a_run_that_has_ended_leaves_at_once_with_its_exit_code_unless_a_tool_watches(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    for how, tears_down in (("at-once", False), ("plainly", True), ("watched", True)):
        marker = tmp_path / f"torn-down-{how}"
        result = run_subprocess([sys.executable, script, marker, how], env={"PYTHONPATH": str(REPO)})
        assert result.returncode == 3 and result.stdout == "workers ended\n", result.stderr
        assert marker.exists() == tears_down, how


# main_multi_gpu.py's launcher for CPU ranks: workers forked from a process that imported torch with
# two intra-op threads (as on a host of two or more cores), before torchrun set OMP_NUM_THREADS.
FORKING_LAUNCHER = """
import os, sys, time
import torch
os.environ.pop("OMP_NUM_THREADS", None)  # torchrun sets 1 for its two workers
torch.set_num_threads(2)
from training.distributed.launch import run_torchrun, torchrun_arguments
time.sleep(1.0)  # the launcher's own start, which the workers' time line counts
from training.entry_point import exit_process
exit_process(run_torchrun(torchrun_arguments(sys.argv[1], sys.argv[2:], 2, fork=True)), at_once=True)
"""
FORKED_WORKER = """
import multiprocessing, os, signal, sys
import torch
from training.entry_point import exit_process, run_entry_point
from training.reporting.logger import process_age_s

def main(argv):
    rank = int(os.environ["RANK"])
    handlers = signal.getsignal(signal.SIGINT) is signal.default_int_handler and \
        all(signal.getsignal(number) is signal.SIG_DFL for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))
    print(f"rank {rank}: forked {multiprocessing.parent_process() is not None}, "
          f"{torch.get_num_threads()} thread(s), age counts the launcher's start {process_age_s() >= 1.0}, "
          f"a fresh interpreter's signal handlers {handlers}", flush=True)
    if argv[rank] == "boom":
        raise RuntimeError(f"boom on rank {rank}")
    return int(argv[rank])

exit_process(run_entry_point(main))
"""


def test_forked_workers_start_as_fresh_ones_would_and_give_back_their_exit_codes(tmp_path):
    # As a fresh worker: torchrun's threads, its own handlers for signals (not the agent's, which the
    # launcher had when it forked), a time line from the command's start, and a traceback of its own.
    launcher, worker = tmp_path / "launcher.py", tmp_path / "worker.py"
    launcher.write_text(FORKING_LAUNCHER)
    worker.write_text(FORKED_WORKER)
    for codes, expected in ((("0", "0"), 0), (("0", "3"), 3), (("0", "boom"), 1)):
        result = run_subprocess([sys.executable, launcher, worker, *codes], timeout=120,
                                env={"PYTHONPATH": str(REPO)})
        assert result.returncode == expected, result.stderr[-3000:]
        said = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
        assert said == [f"rank {rank}: forked True, 1 thread(s), age counts the launcher's start True, a fresh "
                        "interpreter's signal handlers True" for rank in (0, 1)], result.stdout
        # The worker's own traceback, once; torchrun's report of the failure, in one line without its own.
        assert result.stderr.count("Traceback") == (expected == 1), result.stderr[-3000:]
        assert ("RuntimeError: boom on rank 1" in result.stderr) == (expected == 1), result.stderr[-3000:]
