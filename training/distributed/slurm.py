"""Tasks that srun started without torchrun, made ranks of one run: their rank, world size and rendezvous
read from Slurm's variables and set as the variables torchrun gives its workers."""
import os
import subprocess
from dataclasses import dataclass

from training.errors import UsageError

# A job's rendezvous port, the rule scripts/slurm/*.sbatch follow too: 20000 + job id % 9000 (20000-28999),
# so jobs sharing a node do not meet on one port. Below torch's defaults (29400 for c10d, 29500 for
# MASTER_PORT), which every job on a node would share, and below Linux's ephemeral ports (32768 on), which
# outgoing connections take. RDZV_PORT overrides it.
PORT_BASE, PORT_SPAN = 20000, 9000
PORT_OVERRIDE = "RDZV_PORT"
HOW_TO_LAUNCH = ("srun --ntasks-per-node=GPUS python main_multi_gpu.py --multi-gpu ddp (one task per GPU), or "
                 "srun --ntasks-per-node=1 torchrun --nproc_per_node=GPUS ... main_multi_gpu.py --multi-gpu ddp")


@dataclass(frozen=True)
class SrunTask:
    """This process as one task of an srun step of several tasks."""
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    step: str  # job id.step id, as Slurm names a step
    nodelist: str  # the step's nodes as Slurm writes them (node-[a-b]); rank 0 runs on the first
    host: str | None  # MASTER_ADDR when the environment gives it, else found from nodelist
    port: int


def srun_task(environ):
    """This process as a task of a several-task srun step that torchrun did not start; None without
    Slurm, in the batch shell, in a one-task step and in torchrun's workers. Reads `environ` only.

    The batch shell has SLURM_PROCID and SLURM_NTASKS as well; only srun gives a step's tasks
    SLURM_STEP_ID (SLURM_STEPID in older versions)."""
    if "LOCAL_RANK" in environ and "WORLD_SIZE" in environ:  # a torchrun worker (entry_point.launched_by_torchrun)
        return None
    step_id = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if step_id is None or "SLURM_PROCID" not in environ:
        return None
    # SLURM_STEP_NUM_TASKS is the step's own count; SLURM_NTASKS is the job's under srun --preserve-env.
    world_size = number(environ, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS")
    if world_size <= 1:
        return None
    nodelist = next((environ[name] for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if environ.get(name)), None)
    if nodelist is None and "MASTER_ADDR" not in environ:
        raise UsageError("srun started this task but no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST says where "
                         "rank 0 runs; set MASTER_ADDR to rank 0's host")
    port = number(environ, "MASTER_PORT") if "MASTER_PORT" in environ else rendezvous_port(environ)
    return SrunTask(rank=number(environ, "SLURM_PROCID"), local_rank=number(environ, "SLURM_LOCALID"),
                    world_size=world_size, local_world_size=tasks_on_this_node(environ),
                    step=f"{environ.get('SLURM_JOB_ID', '?')}.{step_id}", nodelist=nodelist or "",
                    host=environ.get("MASTER_ADDR"), port=port)


def rendezvous_port(environ):
    """RDZV_PORT, else 20000 + SLURM_JOB_ID % 9000."""
    if environ.get(PORT_OVERRIDE):
        return number(environ, PORT_OVERRIDE)
    return PORT_BASE + number(environ, "SLURM_JOB_ID") % PORT_SPAN


def tasks_on_this_node(environ):
    """The step's tasks on this node: SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) at this node's
    index SLURM_NODEID, else SLURM_NTASKS_PER_NODE, which holds for every node."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if environ.get(name):
            counts, node = expand_counts(environ[name], name), number(environ, "SLURM_NODEID")
            if node >= len(counts):
                raise UsageError(f"SLURM_NODEID={node} but {name}={environ[name]} lists {len(counts)} node(s); "
                                 "start the tasks with srun, which sets both")
            return counts[node]
    if environ.get("SLURM_NTASKS_PER_NODE"):
        return number(environ, "SLURM_NTASKS_PER_NODE")
    raise UsageError("srun started this task but no SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE or "
                     "SLURM_NTASKS_PER_NODE says how many run on this node; start the tasks with srun")


def expand_counts(text, name="the count list"):
    """Slurm's per-node counts, '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        count, _, repeat = part.partition("(x")
        try:
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
        except ValueError:
            raise UsageError(f"{name}={text} is not a Slurm count list like 8(x2),4; start the tasks with srun, "
                             "which writes it") from None
    return counts


def number(environ, name):
    try:
        return int(environ[name])
    except ValueError:
        raise UsageError(f"{name}={environ[name]} is not a whole number; unset it or give one") from None


def torchrun_variables(task, host):
    """What torchrun would give this task's worker: its rank and the rendezvous of rank 0."""
    return {"RANK": str(task.rank), "LOCAL_RANK": str(task.local_rank), "WORLD_SIZE": str(task.world_size),
            "LOCAL_WORLD_SIZE": str(task.local_world_size), "MASTER_ADDR": host, "MASTER_PORT": str(task.port)}


def first_host(nodelist):
    """The first host of a Slurm node list (node-[a-b] -> node-a), as `scontrol show hostnames` writes it."""
    hint = "set MASTER_ADDR to the host of rank 0 (the first node of the step)"
    try:
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot find rank 0's host in the Slurm node list {nodelist} ({exc}); {hint}") from None
    hosts = result.stdout.split()
    if result.returncode != 0 or not hosts:
        said = " ".join(result.stderr.split()) or f"exit {result.returncode}, no host"
        raise UsageError(f"scontrol show hostnames {nodelist} failed ({said}); {hint}")
    return hosts[0]


def take_ranks_from_srun(environ=os.environ):
    """When srun started this process as one of several tasks without torchrun: set RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in `environ` as torchrun would, so the
    rest of the run (process group, placement, who writes) sees one run of world_size ranks; rank 0
    says so in one line. Returns the task, or None with `environ` untouched."""
    task = srun_task(environ)
    if task is None:
        return None
    host = task.host or first_host(task.nodelist)
    environ.update(torchrun_variables(task, host))
    if task.rank == 0:
        print(f"ranks from Slurm's variables (srun step {task.step}, no torchrun): {task.world_size} ranks, "
              f"{task.local_world_size} on this node, rendezvous at {host}:{task.port}", flush=True)
    return task


def refuse_srun_tasks(what, environ=os.environ):
    """A one-process mode (`what`) that srun started as several tasks would run that many identical,
    unconnected runs: refuse in one line that says how to launch."""
    task = srun_task(environ)
    if task is not None:
        raise UsageError(f"{what} is one process, but srun started {task.world_size} tasks of it (step "
                         f"{task.step}), which would be {task.world_size} separate runs; give it one task "
                         f"(srun --ntasks=1), or for DDP launch {HOW_TO_LAUNCH}")
