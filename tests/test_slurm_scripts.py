"""The Slurm job scripts: they parse, pass only flags the trainer and torchrun accept, and requeue after a stop."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from conftest import REPO
from training.config.cli import build_parser

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


@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_passes_only_flags_the_trainer_and_torchrun_accept(script):
    text = script.read_text()
    commands = trainer_commands(text)
    assert len(commands) == 1, "expected one trainer command line"
    entry_point, arguments, launcher_words = commands[0]
    assert rejected_flags(text) == []
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
echo "$name $*" >> "$STUB_DIR/log"
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


def start_script(script, tmp_path, exit_at_once=None):
    stub_dir = tmp_path / "stubs"
    stub_dir.mkdir()
    for name in ("python", "torchrun", "srun", "scontrol", "scancel"):
        (stub_dir / name).write_text(STAND_IN)
        (stub_dir / name).chmod(0o755)
    step, stop_code = STEP_OF[script.name]
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "STUB_DIR": str(stub_dir),
           "STEP": step, "STOP_CODE": str(stop_code), "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "har-test",
           "SLURM_GPUS_ON_NODE": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node-[a-b]",
           "SLURM_CPUS_PER_TASK": "4", "SAVE_DIR": str(tmp_path / "save"), "DATA_DIR": str(tmp_path / "data")}
    if exit_at_once is not None:
        env["EXIT_AT_ONCE"] = str(exit_at_once)
    process = subprocess.Popen(["bash", str(script), "--epochs", "3"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, stub_dir


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
    words = next(line for line in (stub_dir / "log").read_text().splitlines() if line.startswith(step + " "))
    words = words.split()
    assert f"{tmp_path / 'save'}" in words and words[-2:] == ["--epochs", "3"]
    if script.name == "one_node.sbatch":
        assert {"--standalone", "--nproc_per_node=2"} <= set(words)
    if script.name == "multi_node.sbatch":
        assert {"--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node-a:29500",
                f"--rdzv_id={JOB_ID}", "--cpus-per-task=4"} <= set(words)
