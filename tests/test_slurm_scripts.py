"""The Slurm job scripts: they parse, take the job's shape from the allocation, pass only flags the trainer and
torchrun accept, print each node's command in a dry run, and requeue after a stop."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from conftest import REPO
from training.config.cli import build_parser
from training.distributed.slurm import rendezvous_port

SLURM_DIR = REPO / "scripts" / "slurm"
SCRIPTS = sorted(SLURM_DIR.glob("*.sbatch"))
SCRIPT_IDS = [path.name for path in SCRIPTS]
ENTRY_POINTS = ("main.py", "main_multi_gpu.py")
JOB_ID = "4242"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


# ---------------------------------------------------------------------------
# Reading the trainer and torchrun command lines out of a script
# ---------------------------------------------------------------------------

def logical_lines(text):
    """The script's lines with backslash-newline continuations joined, as the shell reads them."""
    return re.sub(r"\\\n", " ", text).splitlines()


def option_names(words):
    return [word.split("=", 1)[0] for word in words if word.startswith("--")]


def trainer_commands(text):
    """(entry point, its arguments, torchrun's arguments) for each line that runs the trainer."""
    found = []
    for line in logical_lines(text):
        words = shlex.split(line, comments=True)
        at = next((i for i, word in enumerate(words) if Path(word).name in ENTRY_POINTS), None)
        if at is None:
            continue
        launcher = words.index("torchrun") + 1 if "torchrun" in words[:at] else at
        arguments = [word for word in words[at + 1:] if word not in ("$@", "&")]
        found.append((Path(words[at]).name, arguments, words[launcher:at]))
    return found


def rejected_flags(text):
    """Every flag of the trainer and torchrun command lines that would not be taken exactly as written.

    Exact names, not argparse's parse alone: argparse accepts a prefix, so a misspelt
    `--save-every-step` would pass it and mean nothing to a reader."""
    trainer_parser, torchrun_parser = build_parser(multi_gpu=True), get_args_parser()
    problems = []
    for script, arguments, launcher_words in trainer_commands(text):
        problems += [f"{script}: {flag}" for flag in option_names(arguments)
                     if flag not in trainer_parser._option_string_actions]
        problems += [f"torchrun: {flag}" for flag in option_names(launcher_words)
                     if flag not in torchrun_parser._option_string_actions]
        for name, parser, words in (("torchrun", torchrun_parser, [*launcher_words, script]),
                                    (script, trainer_parser, arguments)):
            try:
                parser.parse_args(words)
            except SystemExit:
                problems.append(f"{name}: arguments rejected: {' '.join(words)}")
    return problems


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_is_valid_bash(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_three_scripts_exist():
    assert set(SCRIPT_IDS) == {"single_gpu.sbatch", "one_node.sbatch", "multi_node.sbatch"}


@needs_bash
@pytest.mark.parametrize("data", ["DATA_DIR", "synthetic"])
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_passes_only_flags_the_trainer_and_torchrun_accept(script, data, tmp_path):
    data_dir = str(tmp_path / "data") if data == "DATA_DIR" else None
    code, output, _ = run_script(script, tmp_path, DRY_RUN="1", DATA_DIR=data_dir)
    assert code == 0, output
    lines = dry_run(output).values()
    assert rejected_flags("\n".join(lines)) == []
    for entry_point, arguments, launcher_words in trainer_commands("\n".join(lines)):
        assert {"--save-dir", "--save-every-steps"} <= set(option_names(arguments))
        if script.name == "single_gpu.sbatch":
            assert entry_point == "main.py" and launcher_words == []
        else:
            assert entry_point == "main_multi_gpu.py" and arguments[:2] == ["--multi-gpu", "ddp"]
            assert launcher_words, "the DDP scripts start the trainer through torchrun"


def test_flag_check_catches_misspelt_and_unknown_flags():
    fake = ('python main.py --save-dir "$SAVE_DIR" \\\n'
            '    --save-every-step 50 "$@" &\n'
            'torchrun --standalone --nproc-per-nod=2 main_multi_gpu.py --multi-gpu ddp --keep-lst 2\n'
            'srun torchrun --nnodes=2 main_multi_gpu.py --multi-gpu dpp\n')
    problems = rejected_flags(fake)
    assert "main.py: --save-every-step" in problems  # found on a continued line
    assert "torchrun: --nproc-per-nod" in problems
    assert "main_multi_gpu.py: --keep-lst" in problems
    assert any(p.startswith("main_multi_gpu.py: arguments rejected") and "dpp" in p for p in problems)
    fixed = fake.replace("-step ", "-steps ").replace("-nod=", "-node=").replace("-lst", "-last")
    assert rejected_flags(fixed.replace("dpp", "ddp")) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_asks_for_the_warning_signal_and_requeue(script):
    directives = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in directives
    assert any(re.fullmatch(r"#SBATCH --signal=B:USR1@\d+", line) for line in directives)
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script.read_text()


# ---------------------------------------------------------------------------
# Running the scripts against stand-ins for python, torchrun, srun, scontrol and scancel
# ---------------------------------------------------------------------------

# One stand-in for every command; what it does depends on the name it was called by. The one
# that stands for the training step records its arguments, and on SIGTERM takes a moment (as
# if saving) before it exits with STOP_CODE: 75 for the trainer, 1 for torchrun and srun.
STAND_IN = r"""#!/bin/bash
name="$(basename "$0")"
printf -v words '%q ' "$name" "$@"
echo "${words% }" >> "$STUB_DIR/log"
case "$name" in
    scontrol)
        [ "$1" = show ] && printf 'node-a\nnode-b\n'
        exit 0 ;;
    scancel)
        kill -TERM "$(cat "$STUB_DIR/step.pid")"
        exit 0 ;;
esac
[ "$name" = "$STEP" ] || exit 0
echo $$ > "$STUB_DIR/step.pid"
trap 'echo "$name got TERM" >> "$STUB_DIR/log"; sleep 0.5; exit "$STOP_CODE"' TERM
[ -n "${EXIT_AT_ONCE:-}" ] && exit "$EXIT_AT_ONCE"
touch "$STUB_DIR/ready"
while :; do sleep 0.05; done
"""
STEP_OF = {"single_gpu.sbatch": ("python", 75), "one_node.sbatch": ("torchrun", 1),
           "multi_node.sbatch": ("srun", 1)}


# What the scripts read besides Slurm's own variables: none leaks in from the shell that runs the tests.
SCRIPT_VARIABLES = ("DRY_RUN", "DATASET", "DATA_DIR", "SAVE_DIR", "RDZV_PORT", "MAX_RESTARTS")


def start_script(script, tmp_path, exit_at_once=None, **overrides):
    """Run `script` as its batch shell against the stand-ins, in a job of two nodes with two GPUs each;
    `overrides` change its environment (None: unset)."""
    stub_dir = Path(tempfile.mkdtemp(prefix="stubs-", dir=tmp_path))
    for name in ("python", "torchrun", "srun", "scontrol", "scancel"):
        (stub_dir / name).write_text(STAND_IN)
        (stub_dir / name).chmod(0o755)
    step, stop_code = STEP_OF[script.name]
    inherited = {key: value for key, value in os.environ.items()
                 if not key.startswith("SLURM") and key not in SCRIPT_VARIABLES}
    env = {**inherited, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "STUB_DIR": str(stub_dir),
           "STEP": step, "STOP_CODE": str(stop_code), "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "har-test",
           "SLURM_GPUS_ON_NODE": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node-[a-b]",
           "SLURMD_NODENAME": "node-a", "SLURM_CPUS_PER_TASK": "4", "SAVE_DIR": str(tmp_path / "save"),
           "DATA_DIR": str(tmp_path / "data")}
    if exit_at_once is not None:
        env["EXIT_AT_ONCE"] = str(exit_at_once)
    env.update(overrides)
    env = {key: value for key, value in env.items() if value is not None}
    process = subprocess.Popen(["bash", str(script), "--epochs", "3"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, stub_dir


def run_script(script, tmp_path, **overrides):
    """(exit code, output, the stand-ins' log lines) of a job whose training step ends at once with 0."""
    process, stub_dir = start_script(script, tmp_path, exit_at_once=0, **overrides)
    output, _ = process.communicate(timeout=30)
    log = stub_dir / "log"
    return process.returncode, output, log.read_text().splitlines() if log.exists() else []


def started(script, log):
    """The command line the batch shell started, as words; None when it started nothing."""
    step, _ = STEP_OF[script.name]
    return next((shlex.split(line) for line in log if line.startswith(step + " ")), None)


def dry_run(output):
    """{where: command} for each line of a dry run's output."""
    lines = output.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("dry run: "))
    return dict(line.split(": ", 1) for line in lines[at + 1:])


def wait_for(path, process, timeout=20):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


@needs_bash
@pytest.mark.parametrize("first_signal", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_stop_signal_is_forwarded_once_and_the_job_requeued(script, first_signal, tmp_path):
    process, stub_dir = start_script(script, tmp_path)
    wait_for(stub_dir / "ready", process)
    process.send_signal(first_signal)
    time.sleep(0.1)
    process.send_signal(signal.SIGTERM)  # Slurm's own SIGTERM at the time limit must not stop it twice
    output, _ = process.communicate(timeout=30)
    step, stop_code = STEP_OF[script.name]
    log = (stub_dir / "log").read_text().splitlines()
    assert log.count(f"{step} got TERM") == 1, output
    assert log[-1] == f"scontrol requeue {JOB_ID}", output  # after the step has ended
    assert process.returncode == stop_code, output  # the step's own code, not 128 + signal


@needs_bash
@pytest.mark.parametrize("exit_code", [0, 2])
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_a_run_that_ends_by_itself_is_not_requeued(script, exit_code, tmp_path):
    process, stub_dir = start_script(script, tmp_path, exit_at_once=exit_code)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == exit_code, output
    assert "requeue" not in (stub_dir / "log").read_text(), output


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_slurm_variables_reach_the_command_line(script, tmp_path):
    process, stub_dir = start_script(script, tmp_path, exit_at_once=0)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    step, _ = STEP_OF[script.name]
    words = next(shlex.split(line) for line in (stub_dir / "log").read_text().splitlines()
                 if line.startswith(step + " "))
    assert f"{tmp_path / 'save'}" in words and words[-2:] == ["--epochs", "3"]
    if script.name == "one_node.sbatch":
        assert {"--standalone", "--nproc_per_node=2", "--max-restarts=3"} <= set(words)
    if script.name == "multi_node.sbatch":
        assert {"--nnodes=2", "--nproc_per_node=2", "--max-restarts=3", "--rdzv_backend=c10d",
                "--rdzv_endpoint=node-a:24242", f"--rdzv_id={JOB_ID}", "--cpus-per-task=4"} <= set(words)


# ---------------------------------------------------------------------------
# The job's shape from the allocation, its port, restarts, save dir, data and dry run
# ---------------------------------------------------------------------------

TORCHRUN_SCRIPTS = [SLURM_DIR / "one_node.sbatch", SLURM_DIR / "multi_node.sbatch"]
TORCHRUN_IDS = [path.name for path in TORCHRUN_SCRIPTS]


def test_the_shape_is_set_by_the_sbatch_lines_alone():
    directives = [line for line in (SLURM_DIR / "multi_node.sbatch").read_text().splitlines()
                  if line.startswith("#SBATCH")]
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8"} <= set(directives)  # the shape shipped: 2 x 8 GPUs
    for script in SCRIPTS:
        assert not re.search(r"--(nproc_per_node|nnodes)=\d", script.read_text()), script.name


@needs_bash
@pytest.mark.parametrize("script", TORCHRUN_SCRIPTS, ids=TORCHRUN_IDS)
def test_gpus_and_nodes_come_from_the_allocation(script, tmp_path):
    # What the node was given; else what the job asked per node, with or without a GPU type.
    for gpus in ({"SLURM_GPUS_ON_NODE": "8"}, {"SLURM_GPUS_ON_NODE": None, "SLURM_GPUS_PER_NODE": "h100:8"}):
        code, output, log = run_script(script, tmp_path, SLURM_NNODES="3", SLURM_JOB_NODELIST="node-[a-c]", **gpus)
        assert code == 0, output
        assert "--nproc_per_node=8" in started(script, log), gpus
        assert ("--nnodes=3" in started(script, log)) == (script.name == "multi_node.sbatch")


@needs_bash
@pytest.mark.parametrize("missing, message", [
    ({"SLURM_GPUS_ON_NODE": None}, "the allocation has no GPUs"),
    ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID is not set: submit with sbatch")], ids=["GPUs", "job id"])
@pytest.mark.parametrize("script", TORCHRUN_SCRIPTS, ids=TORCHRUN_IDS)
def test_an_allocation_without_what_the_job_needs_is_one_error_line(script, missing, message, tmp_path):
    code, output, log = run_script(script, tmp_path, **missing)
    assert code == 2 and output.startswith(f"error: {message}") and output.count("\n") == 1, output
    assert started(script, log) is None


@needs_bash
def test_the_rendezvous_port_comes_from_the_job_id(tmp_path):
    script = SLURM_DIR / "multi_node.sbatch"
    for job_id, port in (("4242", 24242), ("13243", 24243), ("98999", 28999)):
        code, output, log = run_script(script, tmp_path, SLURM_JOB_ID=job_id)
        assert code == 0, output
        assert f"--rdzv_endpoint=node-a:{port}" in started(script, log)
        assert rendezvous_port({"SLURM_JOB_ID": job_id}) == port  # the rule srun-started ranks follow
    code, output, log = run_script(script, tmp_path, RDZV_PORT="31111")
    assert "--rdzv_endpoint=node-a:31111" in started(script, log)


@needs_bash
@pytest.mark.parametrize("script", TORCHRUN_SCRIPTS, ids=TORCHRUN_IDS)
def test_torchrun_restarts_a_failed_group(script, tmp_path):
    for setting, flag in ((None, "--max-restarts=3"), ("0", "--max-restarts=0")):
        code, output, log = run_script(script, tmp_path, MAX_RESTARTS=setting)
        assert code == 0, output
        assert flag in started(script, log)
        assert rejected_flags(shlex.join(started(script, log))) == []


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_the_default_save_dir_is_the_jobs_own(script, tmp_path):
    job_name = "har-test"
    for job_id in ("4242", "4243"):  # a requeue keeps the id, so it resumes; another submission does not
        code, output, log = run_script(script, tmp_path, SAVE_DIR=None, SLURM_JOB_ID=job_id)
        assert code == 0, output
        save_dir = f"{tmp_path}/checkpoints/{job_name}-{job_id}"
        words = started(script, log)
        assert words[words.index("--save-dir") + 1] == save_dir
        assert f"save dir {save_dir}" in output.splitlines()[0] and f"SAVE_DIR={save_dir}" in output.splitlines()[0]
    code, output, log = run_script(script, tmp_path, SAVE_DIR=str(tmp_path / "earlier run"))
    words = started(script, log)
    assert words[words.index("--save-dir") + 1] == str(tmp_path / "earlier run")
    assert "from SAVE_DIR" in output.splitlines()[0]


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_synthetic_data_is_asked_for_and_uci_har_read_from_data_dir(script, tmp_path):
    code, output, log = run_script(script, tmp_path, DATASET="synthetic")
    assert code == 0, output
    words = started(script, log)
    assert words[words.index("--dataset") + 1] == "synthetic" and "--data-dir" not in words
    code, output, log = run_script(script, tmp_path)
    words = started(script, log)
    assert words[words.index("--dataset"):words.index("--dataset") + 4] == [
        "--dataset", "uci-har", "--data-dir", str(tmp_path / "data")]


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_a_dry_run_prints_each_nodes_command_on_synthetic_data_and_starts_nothing(script, tmp_path):
    code, output, log = run_script(script, tmp_path, DRY_RUN="1", DATA_DIR=None)
    assert code == 0, output
    assert log in ([], ["scontrol show hostnames node-\\[a-b\\]"])  # the stand-ins: nothing was started
    commands = dry_run(output)
    if script.name == "multi_node.sbatch":
        assert list(commands) == ["batch shell on node-a", "node-a", "node-b"]
        assert commands["node-a"] == commands["node-b"]
        assert commands["node-a"].startswith("torchrun --nnodes=2 --nproc_per_node=2 ")
    else:
        assert list(commands) == ["node-a"]
    for command in commands.values():
        words = shlex.split(command)
        assert words[words.index("--dataset") + 1] == "synthetic" and "--data-dir" not in words, command


@needs_bash
@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_a_dry_run_prints_the_commands_the_job_runs(script, tmp_path):
    overrides = {"SAVE_DIR": str(tmp_path / "a save dir"), "DATA_DIR": str(tmp_path / "data")}
    code, output, _ = run_script(script, tmp_path, DRY_RUN="1", **overrides)
    assert code == 0, output
    commands = {where: shlex.split(command) for where, command in dry_run(output).items()}
    _, _, log = run_script(script, tmp_path, DRY_RUN="0", **overrides)  # 0 is no dry run
    words = started(script, log)
    if script.name == "multi_node.sbatch":
        assert commands["batch shell on node-a"] == words
        assert commands["node-a"] == words[words.index("torchrun"):]  # what srun starts on each node
    else:
        assert commands["node-a"] == words
