"""What a run reads and writes around training: --config files, the resolved config.yaml, the
PNG figures, test_report.json's names, and the lock that keeps two runs out of one --save-dir."""
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import matplotlib.image
import pytest
import torch
import yaml

from conftest import REPO, TINY_DATA, load_checkpoint, run_in_process
from evaluation import figures
from profiling.cli import parse_profiler_args
from training.config.cli import load_config_file, parse_config
from training.errors import EXIT_USAGE, UsageError
from training.reporting.logger import process_age_s, read_time_line
from training.run_inputs import LOCK_NAME, SaveDirLock

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A tiny run whose settings all differ from the defaults somewhere, so a lost key shows.
CONFIG = {"dataset": "synthetic", "synthetic-windows-per-subject": 8, "epochs": 2, "batch_size": 16,
          "lr": "2e-3", "norm": "group", "dropout": 0.0, "seed": 7, "max_grad_norm": 0.5, "amp": False,
          "head-fit": "adamw"}


def parse_args(argv):
    """The settings of a main.py command line by flag name."""
    return SimpleNamespace(**parse_config(argv).flags())


def write_yaml(path, values):
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("error:")]


def resolved(save_dir):
    return yaml.safe_load((save_dir / "config.yaml").read_text())


@pytest.fixture(scope="module")
def config_run(tmp_path_factory):
    """A finished run started from a config file: its save dir, and the file."""
    folder = tmp_path_factory.mktemp("config_run")
    path = write_yaml(folder / "run.yaml", CONFIG)
    code, out, err = run_in_process("main.py", ["--config", path, "--save-dir", folder / "run"])
    assert code == 0, err
    (folder / "stdout.txt").write_text(out)
    return folder / "run", path


# ---------------------------------------------------------------------------
# --config
# ---------------------------------------------------------------------------

def test_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", {**CONFIG, "gpu-ids": [0, 2], "resume": None})
    args = parse_args(["--config", str(path), "--batch-size", "64", "--lr", "5e-4"])
    assert (args.batch_size, args.lr) == (64, 5e-4)  # given on the command line
    assert (args.epochs, args.norm, args.dropout, args.seed, args.amp) == (2, "group", 0.0, 7, False)
    assert args.synthetic_windows_per_subject == 8  # a key spelt with hyphens
    assert args.gpu_ids == [0, 2] and args.resume is None  # a list, and resume: null = --no-resume
    assert parse_args(["--config", str(path), "--amp"]).amp is True


def test_config_flag_abbreviated_still_reads_the_file(tmp_path):
    # argparse accepts --conf for --config; the file must not be skipped silently then.
    path = write_yaml(tmp_path / "run.yaml", {"epochs": 3, "data_dir": "-odd-name"})
    args = parse_args([f"--conf={path}"])
    assert (args.epochs, args.data_dir) == (3, "-odd-name")  # a value that looks like a flag stays a value


def test_json_config_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"batch_size": 8, "model": "transformer"}))
    args = parse_args(["--config", str(path)])
    assert (args.batch_size, args.model) == (8, "transformer")


def test_profiler_reads_a_training_config(config_run):
    args = parse_profiler_args(["--config", str(config_run[0] / "config.yaml"), "--steps", "5"])
    assert (args.batch_size, args.norm, args.steps) == (16, "group", 5)


@pytest.mark.parametrize("content, names", [
    ("batchsize: 64\n", ["unknown key 'batchsize'", "did you mean 'batch_size'"]),
    ("learning_rate: 0.1\n", ["unknown key 'learning_rate'"]),
    ("epochs: two\n", ["run.yaml", "--epochs", "two"]),
    ("model: resnet50\n", ["run.yaml", "--model"]),
    ("compile: 3\n", ["run.yaml", "compile", "true or false"]),
    ("batch_size: 8\nbatch-size: 16\n", ["batch_size", "batch-size"]),
    ("epochs: [1\n", ["run.yaml", "not valid YAML", "line 2"]),
    ("- 1\n- 2\n", ["run.yaml", "list"]),
    ("lr: 0.1\nepochs: 1\nlr: 0.2\n", ["run.yaml", "line 3", "'lr' is given twice"]),
    ('{"lr": 0.1, "lr": 0.2}', ["run.json", "'lr' is given twice"]),
], ids=["misspelt", "unknown", "bad-int", "bad-choice", "bad-bool", "twice", "broken-yaml", "not-a-mapping",
        "repeated-key", "repeated-json-key"])
def test_bad_config_file_is_one_line(content, names, tmp_path):
    path = tmp_path / ("run.json" if content.startswith("{") else "run.yaml")
    path.write_text(content)
    code, out, err = run_in_process("main.py", ["--config", path, "--save-dir", tmp_path / "run"])
    assert code == EXIT_USAGE and "Traceback" not in err, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_a_yaml_merge_key_loads_and_later_keys_override_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: &base {epochs: 1, batch_size: 8}\n<<: *base\nepochs: 2\n")
    values = load_config_file(path)["values"]
    assert (values["epochs"], values["batch_size"]) == (2, 8)


def test_a_resumed_run_with_nothing_left_to_train_still_writes_its_config(tmp_path):
    first = [*TINY_DATA, "--epochs", "1", "--save-dir", tmp_path / "a"]
    assert run_in_process("main.py", first)[0] == 0
    code, _, err = run_in_process("main.py", [*first[:-1], tmp_path / "b", "--resume", tmp_path / "a" / "last.pt"])
    assert code == 0, err
    assert resolved(tmp_path / "b")["epochs"] == 1 and (tmp_path / "b" / "test_report.json").is_file()


def test_help_gives_each_default_once_and_never_as_none():
    import re

    from training.config.cli import build_parser
    text = build_parser(multi_gpu=True).format_help()
    assert "(default: None)" not in text and not re.search(r"\(default:[^)]*\)\s*\(default:", text)
    assert re.search(r"--model .*\n.*\(default:\s+minirocket\)", text) and "(default: 20)" in text


def test_missing_config_file(tmp_path):
    with pytest.raises(UsageError, match="missing.yaml does not exist"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])


# ---------------------------------------------------------------------------
# config.yaml: resolved, with versions, and round-tripping to the same run
# ---------------------------------------------------------------------------

def test_resolved_config_names_every_flag_and_the_versions(config_run):
    save_dir, _ = config_run
    config = resolved(save_dir)
    defaults = vars(parse_args([]))
    assert set(config) == set(defaults) - {"config", "debug"}
    assert config["save_dir"] == str(save_dir)
    assert (config["batch_size"], config["lr"], config["norm"], config["seed"]) == (16, 0.002, "group", 7)
    assert config["weight_decay"] == defaults["weight_decay"]  # defaults are written out too
    versions = next(line for line in (save_dir / "config.yaml").read_text().splitlines()
                    if line.startswith("# versions:"))
    assert f"torch {torch.__version__}," in versions and f"cuda {torch.version.cuda or 'none'}," in versions
    assert "nccl " in versions and "git_commit " in versions


def test_saved_config_repeats_the_run_exactly(config_run, tmp_path):
    first, _ = config_run
    code, _, err = run_in_process("main.py", ["--config", first / "config.yaml", "--save-dir", tmp_path / "again"])
    assert code == 0, err
    assert {**resolved(first), "save_dir": None} == {**resolved(tmp_path / "again"), "save_dir": None}
    expected, actual = load_checkpoint(first / "last.pt"), load_checkpoint(tmp_path / "again" / "last.pt")
    assert actual["step"] == expected["step"] > 0
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def test_resume_names_each_changed_flag(config_run, tmp_path):
    _, path = config_run
    save_dir = tmp_path / "run"
    code, _, err = run_in_process("main.py", ["--config", path, "--save-dir", save_dir, "--stop-after-epochs", "1"])
    assert code == 0, err
    assert (save_dir / "curves.png").is_file() and not (save_dir / "confusion_matrix.png").exists()
    # Flags that leave the data, the model and the LR schedule alone may change on resume (those
    # that do not are refused: tests/test_resume_refusal.py).
    code, out, err = run_in_process("main.py", ["--config", path, "--save-dir", save_dir, "--weight-decay", "0.01",
                                                "--max-grad-norm", "2"])
    assert code == 0, err
    changed = [line for line in err.splitlines() if "changed flag" in line]
    assert changed == [
        "warning: resumed with a changed flag: --weight-decay: 0.0001 in the checkpoint's run, 0.01 now",
        "warning: resumed with a changed flag: --max-grad-norm: 0.5 in the checkpoint's run, 2.0 now"]
    assert out.index("RESUMING") < out.index("epoch 2/2")  # said before training went on
    assert resolved(save_dir)["weight_decay"] == 0.01  # config.yaml now describes the resumed run


# ---------------------------------------------------------------------------
# Figures and test_report.json
# ---------------------------------------------------------------------------

def test_run_draws_curves_and_confusion_matrix(config_run):
    save_dir, _ = config_run
    for name in ("curves.png", "confusion_matrix.png"):
        path = save_dir / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400, (name, image.shape)
        assert image.std() > 0.05, name  # not a blank canvas
    report = json.loads((save_dir / "test_report.json").read_text())
    matrix = torch.tensor(report["confusion_matrix"])
    assert report["accuracy"] == pytest.approx(matrix.diag().sum().item() / matrix.sum().item())
    assert "acc" not in report and 0 <= report["macro_f1"] <= 1


def test_a_run_ends_with_where_its_time_went(config_run):
    save_dir, _ = config_run
    output = (save_dir.parent / "stdout.txt").read_text()
    assert sum(line.startswith("time: ") for line in output.splitlines()) == 1
    laps = read_time_line(output)
    started_at = laps.pop("start-up", None)
    assert list(laps) == ["inputs (data, checkpoint)", "set-up (device, model, features)", "training", "evaluation",
                          "figures"]
    assert all(value >= 0 for value in laps.values()) and laps["set-up (device, model, features)"] > 0
    age = process_age_s()
    if age is not None:  # Linux: this test's process started the run, laps ago (each rounded to 0.05 s)
        assert 0 < started_at <= age - sum(laps.values()) + 0.05 * len(laps) + 0.1


def test_process_age_counts_from_the_process_start():
    started = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6); "
                            "from training.reporting.logger import process_age_s; print(process_age_s())"],
                           cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    wall = time.perf_counter() - started
    if child.stdout.strip() == "None":
        pytest.skip("no /proc here: the age is not known")
    assert 0.6 <= float(child.stdout) <= wall + 0.02


def test_failure_to_draw_is_a_warning(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n')  # no losses to plot
    warnings = []
    assert figures.write_run_figures(tmp_path, warnings.append) == []
    assert len(warnings) == 1 and "could not draw" in warnings[0] and "val_macro_f1" in warnings[0]


def test_run_still_succeeds_when_drawing_fails(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")
    monkeypatch.setattr(figures, "plot_curves", broken)
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--synthetic-windows-per-subject", "8", "--epochs", "1",
                                              "--figures", "--save-dir", tmp_path])
    assert code == 0, err
    assert "could not draw the run's figures (RuntimeError: no fonts)" in err
    assert (tmp_path / "test_report.json").is_file()


# ---------------------------------------------------------------------------
# One run per --save-dir
# ---------------------------------------------------------------------------

def test_second_run_into_a_busy_save_dir_is_refused(tmp_path):
    save_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "main.py", *TINY_DATA, "--epochs", "50", "--save-dir", save_dir],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (save_dir / "config.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # written just before training starts, long after the lock is taken
        code, _, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "50", "--save-dir", save_dir])
        lines = error_lines(err)
        assert code == EXIT_USAGE and len(lines) == 1, err
        assert f"pid {first.pid} " in lines[0] and "in use by another run" in lines[0]
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()


def test_lock_of_a_killed_run_does_not_stick(tmp_path):
    holder = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys; sys.path.insert(0, '.');"
        "from training.run_inputs import SaveDirLock;"
        f"lock = SaveDirLock({str(tmp_path)!r}).acquire(); os.kill(os.getpid(), signal.SIGKILL)")], cwd=REPO)
    assert holder.returncode == -signal.SIGKILL
    assert "pid" in (tmp_path / LOCK_NAME).read_text()  # left behind, but no longer locked
    lock = SaveDirLock(tmp_path).acquire()
    assert f"pid {os.getpid()} " in (tmp_path / LOCK_NAME).read_text()
    with pytest.raises(UsageError, match=f"in use by another run \\(pid {os.getpid()} "):
        SaveDirLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    SaveDirLock(tmp_path).acquire().release()


def test_a_killed_runs_lock_does_not_live_on_in_its_forked_children(tmp_path):
    # DataLoader workers are forked children: one still alive when its run is killed must not keep the
    # folder locked (it would for the seconds an orphaned worker takes to notice).
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, sys, time; sys.path.insert(0, '.');"
        "from training.run_inputs import SaveDirLock;"
        f"lock = SaveDirLock({str(tmp_path)!r}).acquire();"
        "child = os.fork();"
        "time.sleep(60) if child == 0 else (print(child, flush=True), os.kill(os.getpid(), signal.SIGKILL))")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline())
    try:
        assert holder.wait(timeout=60) == -signal.SIGKILL
        os.kill(child, 0)  # the child lives on
        SaveDirLock(tmp_path).acquire().release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_fresh_run_in_a_used_folder_starts_its_own_metrics(tmp_path):
    run = [*TINY_DATA, "--epochs", "1", "--synthetic-windows-per-subject", "8", "--save-dir", tmp_path]
    for flags in ([], ["--no-resume"]):
        code, _, err = run_in_process("main.py", [*run, *flags])
        assert code == 0, err
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1]
