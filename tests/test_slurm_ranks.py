"""Tasks srun starts without torchrun: read as the ranks of one run from Slurm's variables, or refused in one line."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, TINY_DATA, load_checkpoint, read_metrics, run_in_process
from profiling.entry_points import env_without_torchrun
from training.distributed import slurm
from training.errors import EXIT_USAGE, UsageError

# Task 1 of a step of 16 tasks, 8 on each of two nodes, as srun gives it (Slurm 23.x names).
STEP_TASK = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_PROCID": "9",
             "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16",
             "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NNODES": "2",
             "SLURM_STEP_NODELIST": "node-[a-b]", "SLURM_JOB_NODELIST": "node-[a-b]"}
# The batch shell of that job: SLURM_PROCID and SLURM_NTASKS too, but no step.
BATCH_SHELL = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
               "SLURM_NTASKS": "16", "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NNODES": "2",
               "SLURM_JOB_NODELIST": "node-[a-b]"}
TORCHRUN_WORKER = {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
# Stands in for Slurm's scontrol: `scontrol show hostnames LIST` prints the names of a plain comma list.
SCONTROL = '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] || exit 1\ntr , "\\n" <<< "$3"\n'


def stand_in_scontrol(folder):
    folder.mkdir(exist_ok=True)
    (folder / "scontrol").write_text(SCONTROL)
    (folder / "scontrol").chmod(0o755)
    return folder


# ---------------------------------------------------------------------------
# Reading Slurm's variables (a pure function of the environment)
# ---------------------------------------------------------------------------

def test_a_task_of_a_several_task_step_is_a_rank():
    task = slurm.srun_task(STEP_TASK)
    assert (task.rank, task.local_rank, task.world_size, task.local_world_size) == (9, 1, 16, 8)
    assert (task.step, task.nodelist, task.host) == ("4242.0", "node-[a-b]", None)
    assert task.port == 20000 + 4242 % 9000


ONE_TASK_STEP = {**STEP_TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}


@pytest.mark.parametrize("environment", [{}, BATCH_SHELL, ONE_TASK_STEP, {**STEP_TASK, **TORCHRUN_WORKER}],
                         ids=["no Slurm", "batch shell", "one-task step", "torchrun worker under srun"])
def test_what_is_not_a_task_of_a_several_task_step(environment):
    assert slurm.srun_task(environment) is None


def test_the_step_counts_win_over_the_jobs():
    # srun --preserve-env leaves SLURM_NTASKS at the job's count; the step's own is SLURM_STEP_NUM_TASKS.
    task = slurm.srun_task({**STEP_TASK, "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "4",
                            "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1", "SLURM_PROCID": "3",
                            "SLURM_LOCALID": "0"})
    assert (task.world_size, task.local_world_size) == (4, 1)
    newer_only = ("SLURM_STEP_ID", "SLURM_STEP_TASKS_PER_NODE")
    older = {key: value for key, value in STEP_TASK.items() if key not in newer_only}
    assert slurm.srun_task(older).local_world_size == 8  # SLURM_STEPID, SLURM_TASKS_PER_NODE: older versions


def test_slurm_count_lists_expand():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("8") == [8]
    with pytest.raises(UsageError, match="SLURM_STEP_TASKS_PER_NODE=8x2"):
        slurm.expand_counts("8x2", "SLURM_STEP_TASKS_PER_NODE")


def test_the_port_comes_from_the_job_id_unless_given():
    assert slurm.rendezvous_port({"SLURM_JOB_ID": "4242"}) == 24242
    assert slurm.rendezvous_port({"SLURM_JOB_ID": str(4242 + slurm.PORT_SPAN)}) == 24242
    ports = {slurm.rendezvous_port({"SLURM_JOB_ID": str(job)}) for job in range(20_000)}
    assert min(ports) == 20000 and max(ports) == 28999  # under torch's 29400 and 29500, and the ephemeral ports
    assert slurm.rendezvous_port({"SLURM_JOB_ID": "4242", "RDZV_PORT": "31111"}) == 31111
    given = slurm.srun_task({**STEP_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29999"})
    assert (given.host, given.port) == ("10.0.0.1", 29999)


def test_a_bad_variable_is_one_line_naming_it():
    with pytest.raises(UsageError, match="^SLURM_PROCID=x is not a whole number"):
        slurm.srun_task({**STEP_TASK, "SLURM_PROCID": "x"})
    with pytest.raises(UsageError, match="SLURM_NODEID=2 but SLURM_STEP_TASKS_PER_NODE=8"):
        slurm.srun_task({**STEP_TASK, "SLURM_NODEID": "2"})


# ---------------------------------------------------------------------------
# Setting torchrun's variables, and the refusals
# ---------------------------------------------------------------------------

def test_ranks_are_set_as_torchrun_sets_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{stand_in_scontrol(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    environment = {**STEP_TASK, "SLURM_STEP_NODELIST": "node-a,node-b"}
    slurm.take_ranks_from_srun(environment)
    assert {key: environment[key] for key in TORCHRUN_WORKER} == {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16",
                                                                  "LOCAL_WORLD_SIZE": "8"}
    assert (environment["MASTER_ADDR"], environment["MASTER_PORT"]) == ("node-a", "24242")
    assert capsys.readouterr().out == ""  # only rank 0 says where the ranks came from
    rank0 = {**STEP_TASK, "SLURM_STEP_NODELIST": "node-a,node-b", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0"}
    slurm.take_ranks_from_srun(rank0)
    assert capsys.readouterr().out == ("ranks from Slurm's variables (srun step 4242.0, no torchrun): 16 ranks, 8 on "
                                       "this node, rendezvous at node-a:24242\n")
    untouched = dict(BATCH_SHELL)
    assert slurm.take_ranks_from_srun(untouched) is None and untouched == BATCH_SHELL


def test_without_scontrol_the_host_of_rank_0_is_asked_for_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    with pytest.raises(UsageError, match="node-\\[a-b\\].*set MASTER_ADDR") as refused:
        slurm.take_ranks_from_srun(dict(STEP_TASK))
    assert "\n" not in str(refused.value)


def srun_environment(monkeypatch, tasks=2):
    """This process as task 0 of `tasks`, as srun would start it."""
    for key in TORCHRUN_WORKER:
        monkeypatch.delenv(key, raising=False)
    for key, value in {**STEP_TASK, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                       "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
                       "SLURM_STEP_TASKS_PER_NODE": str(tasks)}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("script, flags", [("main.py", []), ("main_multi_gpu.py", ["--multi-gpu", "dp"])],
                         ids=["main.py", "dp"])
def test_one_process_modes_under_several_srun_tasks_are_refused_in_one_line(script, flags, monkeypatch, tmp_path):
    srun_environment(monkeypatch)
    code, _, err = run_in_process(script, [*flags, "--device", "cpu", *TINY_DATA, "--epochs", "1",
                                           "--save-dir", tmp_path / "run"])
    assert code == EXIT_USAGE, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "srun started 2 tasks" in err
    assert "srun --ntasks-per-node=GPUS python main_multi_gpu.py --multi-gpu ddp" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------
# Two tasks, started as srun starts them, train as one run
# ---------------------------------------------------------------------------

def free_port_in_the_job_range():
    """A port of 20000-28999 nobody listens on now, and the job id the port rule maps to it."""
    for offset in range(os.getpid() % slurm.PORT_SPAN, os.getpid() % slurm.PORT_SPAN + slurm.PORT_SPAN):
        port = slurm.PORT_BASE + offset % slurm.PORT_SPAN
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port, 100 * slurm.PORT_SPAN + port - slurm.PORT_BASE
    raise RuntimeError("no free port in 20000-28999")


def test_two_srun_tasks_form_one_two_rank_ddp_run(tmp_path):
    port, job_id = free_port_in_the_job_range()
    save_dir = tmp_path / "run"
    slurm = {"PATH": f"{stand_in_scontrol(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}",
             "SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "2",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "127.0.0.1"}
    command = [sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu", *TINY_DATA,
               "--synthetic-windows-per-subject", "8", "--batch-size", "64", "--epochs", "1", "--no-test",
               "--save-dir", str(save_dir)]
    tasks = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env_without_torchrun(**slurm, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank)))
             for rank in (0, 1)]
    outputs = [task.communicate(timeout=120)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    said = f"ranks from Slurm's variables (srun step {job_id}.0, no torchrun): 2 ranks, 2 on this node, " \
           f"rendezvous at 127.0.0.1:{port}"
    assert said in outputs[0] and "ranks from Slurm" not in outputs[1]
    assert "run: ddp with 2 processes (gloo), rank 0 on cpu" in outputs[0]
    checkpoint = load_checkpoint(save_dir / "last.pt")
    assert checkpoint["world_size"] == 2 and len(checkpoint["rng"]) == 2  # one run, each rank's random streams
    assert [entry["device"] for entry in read_metrics(save_dir)[0]["memory"]] == ["rank0:cpu", "rank1:cpu"]
