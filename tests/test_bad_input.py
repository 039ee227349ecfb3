"""Bad input through the real entry points: exit 2, one line naming the problem, no traceback,
and nothing already in --save-dir touched."""
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, run_in_process, run_subprocess
from data.errors import DataError
from data.uci_har import SIGNAL_NAMES, WINDOW_STEPS
from training.checkpoint.files import load_checkpoint
from training.entry_point import run_entry_point
from training.errors import EXIT_USAGE, UsageError

TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29511"}
VISIBLE_GPUS = torch.cuda.device_count()
NPROC_OVER_GPUS = max(4, VISIBLE_GPUS + 1)  # clearly a multi-GPU request, and more than there are


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The save dir of a real tiny run: last.pt, best.pt, numbered checkpoints, metrics, logs, report."""
    save_dir = tmp_path_factory.mktemp("finished") / "run"
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--save-dir", save_dir])
    assert code == 0, err
    assert (save_dir / "last.pt").is_file()
    return save_dir


@pytest.fixture
def save_dir(finished_run, tmp_path):
    """A copy of the finished run and a keep.txt: a refused command must leave all of it alone."""
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    (folder / "keep.txt").write_text("results worth keeping\n")
    return folder


def snapshot(path):
    """Bytes and modification time of `path`, or of every file under it."""
    if path.is_file():
        return {path.name: (path.read_bytes(), path.stat().st_mtime_ns)}
    if not path.exists():
        return {}
    return {str(file.relative_to(path)): (file.read_bytes(), file.stat().st_mtime_ns)
            for file in sorted(path.rglob("*")) if file.is_file()}


def as_command(script, argv, env=None):
    """(exit code, stdout, stderr) of one entry point run as a real command (run_in_process runs it here)."""
    result = run_subprocess([sys.executable, script, *argv], timeout=180, env=env)
    return result.returncode, result.stdout, result.stderr


def as_torchrun_rank(script, argv):
    """As a real command that finds torchrun's variables (TORCHRUN_ENV) in its environment."""
    return as_command(script, argv, env=TORCHRUN_ENV)


def assert_refused(result, *names):
    """Exit 2, no traceback, one `error:` line, and that line names the problem."""
    code, out, err = result
    detail = f"exit code {code}\n--- stderr ---\n{err[-3000:]}\n--- stdout ---\n{out[-1500:]}"
    assert code == EXIT_USAGE, detail
    assert "Traceback" not in err, detail
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, detail
    for name in names:
        assert name in error_lines[0], detail
    return error_lines[0]


def refuse(script, flags, save_dir, *names, run=run_in_process):
    """Run with tiny synthetic data into `save_dir`; it must be refused and `save_dir` left as it was."""
    before = snapshot(save_dir)
    argv = [*TINY_DATA, "--epochs", "1", "--save-dir", save_dir, *flags]
    line = assert_refused(run(script, argv), *names)
    after = snapshot(save_dir)
    changed = [name for name in before if after.get(name) != before[name]]
    assert not changed, f"changed in --save-dir: {changed}"
    new_checkpoints = [name for name in set(after) - set(before) if name.endswith(".pt")]
    assert not new_checkpoints, f"new checkpoints in --save-dir: {new_checkpoints}"
    return line


# ---------------------------------------------------------------------------
# Flags: values that cannot work, and combinations that cannot work here
# ---------------------------------------------------------------------------

FLAG_CASES = [
    ("main.py", ["--seed", "-1"], "--seed"),
    ("main_multi_gpu.py", ["--multi-gpu", "dp", "--nproc-per-node", "2"], "--nproc-per-node"),
    ("main.py", ["--backend", "nccl"], "--backend nccl"),
    ("main.py", ["--seed", str(2 ** 64)], "--seed"),
    ("main.py", ["--synthetic-seed", "-1"], "--synthetic-seed"),
    ("main.py", ["--batch-size", "0"], "--batch-size"),
    ("main.py", ["--batch-size", "-1"], "--batch-size"),
    ("main.py", ["--grad-accum-steps", "0"], "--grad-accum-steps"),
    ("main.py", ["--epochs", "0"], "--epochs"),
    ("main.py", ["--epochs", "two"], "--epochs"),  # argparse: not an integer
    ("main.py", ["--lr", "0"], "--lr"),
    ("main.py", ["--lr", "-0.001"], "--lr"),
    ("main.py", ["--lr", "nan"], "--lr"),
    ("main.py", ["--val-fraction", "1.5"], "--val-fraction"),
    ("main.py", ["--val-fraction", "-0.5"], "--val-fraction"),
    ("main.py", ["--dropout", "1"], "--dropout"),
    ("main.py", ["--weight-decay", "nan"], "--weight-decay"),
    ("main.py", ["--max-grad-norm", "-1"], "--max-grad-norm"),
    ("main.py", ["--warmup-epochs", "3", "--epochs", "2"], "--warmup-epochs"),
    ("main.py", ["--warmup-epochs", "-1"], "--warmup-epochs"),
    ("main.py", ["--keep-last", "-1"], "--keep-last"),
    ("main.py", ["--save-every-steps", "-1"], "--save-every-steps"),
    ("main.py", ["--early-stopping-patience", "-1"], "--early-stopping-patience"),
    ("main.py", ["--stop-after-epochs", "0"], "--stop-after-epochs"),
    ("main.py", ["--log-interval", "0"], "--log-interval"),
    ("main.py", ["--num-workers", "-1"], "--num-workers"),
    ("main.py", ["--synthetic-windows-per-subject", "0"], "--synthetic-windows-per-subject"),
    ("main.py", ["--model", "resnet50"], "--model"),  # argparse's usage message
    ("main.py", ["--mode", "mean"], "--mode"),
    ("main.py", ["--augment", "rotate,flip", "--aug-flip-classes", "lying"], "--aug-flip-classes"),  # a class it lacks
    ("main.py", ["--aug-rotate-wide-classes", "jogging"], "--aug-rotate-wide-classes"),  # a class it lacks
    # ... also where the head is solved by ridge (this small a split), which augments nothing
    ("main.py", ["--model", "minirocket", "--augment", "flip", "--aug-flip-classes", "lying"], "--aug-flip-classes"),
    ("main.py", ["--aug-rotate-wide-deg", "200"], "--aug-rotate-wide-deg"),
    ("main.py", ["--gpu-ids", "a,b"], "--gpu-ids"),
    ("main.py", ["--gpu-ids", "0,0"], "--gpu-ids"),
    ("main.py", ["--resume"], "--resume"),  # the path left out
    ("main.py", ["--dataset", "uci-har"], "--data-dir"),  # and no --data-dir
    ("main.py", ["--gpu-ids", str(VISIBLE_GPUS)], "--gpu-ids"),  # one past the last GPU there is
    ("main.py", ["--device", "cpu", "--amp", "--amp-dtype", "fp16"], "--amp-dtype fp16"),
    ("main.py", ["--device", "cpu", "--sync-bn"], "--sync-bn"),
    ("main.py", ["--compile-mode", "reduce-overhead", "--grad-accum-steps", "2"], "--grad-accum-steps 2"),
    ("main_multi_gpu.py", ["--multi-gpu", "dp", "--device", "cpu", "--gpu-ids", "0"], "--gpu-ids"),
    ("main_multi_gpu.py", ["--multi-gpu", "dp", "--sync-bn"], "--sync-bn"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--sync-bn"], "--sync-bn"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--backend", "nccl"], "--backend nccl"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--dist-timeout", "0"], "--dist-timeout"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--dist-timeout", "nan"], "--dist-timeout"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--nproc-per-node", "0"], "--nproc-per-node"),
    ("main_multi_gpu.py", ["--multi-gpu", "ddpp"], "--multi-gpu"),
    ("main_multi_gpu.py", ["--grad-compression", "fp16"], "--grad-compression fp16"),
    ("main_multi_gpu.py", ["--multi-gpu", "fsdp", "--device", "cpu", "--grad-compression", "bf16"],
     "--grad-compression bf16"),
    ("main_multi_gpu.py", ["--multi-gpu", "fsdp", "--device", "cpu", "--sync-bn"], "--sync-bn"),
    ("main_multi_gpu.py", ["--multi-gpu", "fsdp", "--amp", "--amp-dtype", "fp16"], "--amp-dtype fp16"),
    ("main.py", ["--model", "transformer", "--width", "100", "--heads", "8"], "--width 100"),
    ("main.py", ["--model", "cnn1d", "--depth", "3"], "--depth"),
    ("main.py", ["--model", "transformer", "--depth", "0"], "at least 1"),
]


@pytest.mark.parametrize("script, flags, name", FLAG_CASES,
                         ids=[f"{script}:{' '.join(flags)}" for script, flags, _ in FLAG_CASES])
def test_flag_that_cannot_work_is_refused(script, flags, name, save_dir):
    refuse(script, flags, save_dir, name)


def test_more_processes_than_gpus_is_refused(save_dir):
    # --device cuda: refused where there are fewer GPUs (none here) rather than start CPU processes the user
    # did not ask for. (--device auto on a machine without a GPU starts CPU processes, as torchrun would:
    # tests/test_launcher.py.) Run as the real command: if it is not refused, it launches torchrun.
    flags = ["--multi-gpu", "ddp", "--device", "cuda", "--nproc-per-node", str(NPROC_OVER_GPUS),
             "--synthetic-windows-per-subject", "4"]
    line = refuse("main_multi_gpu.py", flags, save_dir, "GPU", run=as_command)
    assert str(NPROC_OVER_GPUS) in line or "no GPU" in line


def test_data_parallel_under_torchrun_is_refused(save_dir):
    refuse("main_multi_gpu.py", ["--multi-gpu", "dp"], save_dir, "--multi-gpu dp", "torchrun",
           run=as_torchrun_rank)


def test_main_py_under_torchrun_is_refused(save_dir):
    refuse("main.py", [], save_dir, "main_multi_gpu.py", run=as_torchrun_rank)


@pytest.mark.parametrize("flags, names", [(["--resume", "missing.pt"], ["missing.pt"]),
                                           (["--augment", "flip", "--aug-flip-classes", "NOPE"], ["'NOPE'"])])
def test_self_launch_checks_once_before_starting_any_worker(save_dir, flags, names):
    # Without torchrun, `--multi-gpu ddp` launches the workers itself; a bad --resume or a class the
    # data lacks must stop it first, in one line rather than one per worker and torchrun's report.
    code, out, err = as_command("main_multi_gpu.py", [*TINY_DATA, "--multi-gpu", "ddp", "--device", "cpu",
                                                      "--nproc-per-node", "2", "--save-dir", save_dir, *flags])
    assert_refused((code, out, err), *names)
    assert "launching" not in out and err.count("\n") == 1


# ---------------------------------------------------------------------------
# --save-dir
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags, name", [(["--device", "cpu", "--amp", "--amp-dtype", "fp16"], "--amp-dtype fp16"),
                                         (["--batch-size", "0"], "--batch-size")])
def test_a_refused_run_leaves_no_new_folder_behind(tmp_path, flags, name):
    # The first is refused once the folder is made (by the run's set-up), the second before.
    save_dir = tmp_path / "new" / "run"
    assert_refused(run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--save-dir", save_dir, *flags]), name)
    assert list(tmp_path.iterdir()) == []


def test_save_dir_that_is_a_file(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a folder\n")
    refuse("main.py", [], path, "--save-dir", "results.txt", "is a file")


@pytest.mark.parametrize("name", ["last.pt", "best.pt"])
def test_a_checkpoints_name_held_by_a_folder_is_refused_before_training(save_dir, name):
    # With step checkpoints beside it the run would resume from one, train, and fail at its first save.
    shutil.move(save_dir / name, save_dir / f"{name}.moved")
    (save_dir / name).mkdir()
    (save_dir / name / "mine.txt").write_text("kept\n")
    refuse("main.py", ["--epochs", "2"], save_dir, "--save-dir", f"its {name} is a folder, where the run writes a file")
    assert (save_dir / name / "mine.txt").read_text() == "kept\n"


def test_save_dir_inside_a_file(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a folder\n")
    refuse("main.py", [], path / "run", "--save-dir", "results.txt")
    assert path.read_text() == "not a folder\n"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_save_dir_that_is_not_writable(save_dir):
    save_dir.chmod(0o555)
    try:
        refuse("main.py", [], save_dir, "--save-dir", "not writable")
    finally:
        save_dir.chmod(0o755)


# ---------------------------------------------------------------------------
# --resume
# ---------------------------------------------------------------------------

def test_resume_from_a_missing_file(save_dir, tmp_path):
    refuse("main.py", ["--resume", tmp_path / "missing.pt"], save_dir, "missing.pt", "does not exist")


def test_resume_from_a_folder(save_dir):
    line = refuse("main.py", ["--resume", save_dir], save_dir, str(save_dir))
    assert "does not exist" not in line  # it does: the problem is that it is a folder
    assert any(word in line for word in ("folder", "directory", "not a file")), line


@pytest.mark.parametrize("content", [b"", np.random.default_rng(0).bytes(4096), b"hello", b"a", b"epochs: 1\n"],
                         ids=["empty", "random-bytes", "a-word", "one-letter", "yaml"])
def test_resume_from_a_file_that_is_not_a_checkpoint(content, save_dir, tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(content)
    line = refuse("main.py", ["--resume", path], save_dir, "garbage.pt")
    # Damage, not a hostile file: the message must not send the user hunting for foreign objects.
    assert "holds objects other than tensors" not in line
    assert any(word in line for word in ("unreadable", "truncated", "corrupt", "not a checkpoint")), line


def test_resume_from_a_truncated_checkpoint(save_dir, tmp_path):
    whole = (save_dir / "last.pt").read_bytes()
    path = tmp_path / "truncated.pt"
    path.write_bytes(whole[:len(whole) // 2])
    refuse("main.py", ["--resume", path], save_dir, "truncated.pt", "truncated")


def test_resume_from_weights_alone(save_dir, tmp_path):
    # A bare state_dict loads safely but is not a checkpoint this trainer can continue from.
    path = tmp_path / "weights.pt"
    torch.save(torch.load(save_dir / "last.pt", weights_only=True)["model"], path)
    refuse("main.py", ["--resume", path], save_dir, "weights.pt", "not a checkpoint of this trainer")


@pytest.mark.parametrize("flags, names", [
    (["--model", "transformer"], ["model cnn1d", "this run: transformer"]),
    (["--mode", "average"], ["mode flatten", "this run: average"]),
    (["--norm", "group"], ["norm batch", "this run: group"]),
], ids=["other-model", "other-channel-mode", "other-norm"])
def test_resume_from_a_checkpoint_of_another_configuration(flags, names, save_dir):
    # --resume auto (the default) picks up <save-dir>/last.pt, made with cnn1d / flatten / batch.
    refuse("main.py", flags, save_dir, *names)
    # ... and the same checkpoint named explicitly.
    refuse("main.py", [*flags, "--resume", save_dir / "last.pt"], save_dir, *names)


# ---------------------------------------------------------------------------
# --data-dir: a UCI HAR tree, whole or damaged
# ---------------------------------------------------------------------------

def write_fake_uci(root):
    """The files data/uci_har.py reads, for 12 training windows (subjects 1, 3, 5) and 6 test windows."""
    rng = np.random.default_rng(0)
    for split, count, subjects in (("train", 12, (1, 3, 5)), ("test", 6, (2, 4))):
        inertial = root / split / "Inertial Signals"
        inertial.mkdir(parents=True)
        for name in SIGNAL_NAMES:
            rows = rng.standard_normal((count, WINDOW_STEPS))
            (inertial / f"{name}_{split}.txt").write_text(
                "".join(" " + " ".join(f"{value:.7e}" for value in row) + "\n" for row in rows))
        (root / split / f"y_{split}.txt").write_text("".join(f"{i % 6 + 1}\n" for i in range(count)))
        (root / split / f"subject_{split}.txt").write_text(
            "".join(f"{subjects[i % len(subjects)]}\n" for i in range(count)))
    return root


def edit_line(path, number, edit):
    """Replace line `number` (1-based) of a text file by edit(line); edit returning None drops it."""
    lines = path.read_text().splitlines()
    new = edit(lines[number - 1])
    lines[number - 1:number] = [] if new is None else [new]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def uci_root(tmp_path):
    return write_fake_uci(tmp_path / "UCI HAR Dataset")


def uci_flags(root):
    return ["--dataset", "uci-har", "--data-dir", root, "--batch-size", "4"]


def test_the_intact_fake_dataset_trains(uci_root, tmp_path):
    # So the refusals below come from the damage, not from the fake tree.
    code, out, err = run_in_process("main.py", [*uci_flags(uci_root), "--epochs", "1",
                                                "--save-dir", tmp_path / "fresh"])
    assert code == 0, err
    assert "data: uci-har" in out


def test_data_dir_that_does_not_exist(save_dir, tmp_path):
    refuse("main.py", ["--dataset", "uci-har", "--data-dir", tmp_path / "no-such-folder"], save_dir,
           "no-such-folder", run=as_command)


def test_data_dir_that_does_not_exist_with_dataset_auto(save_dir, tmp_path):
    # --dataset auto (the default) falls back to synthetic data when --data-dir lacks UCI HAR; a
    # --data-dir that does not exist at all is a typo, and training on synthetic data hides it.
    refuse("main.py", ["--dataset", "auto", "--data-dir", tmp_path / "no-such-folder"], save_dir, "no-such-folder")


def test_data_dir_that_is_empty(save_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    refuse("main.py", ["--dataset", "uci-har", "--data-dir", tmp_path / "empty"], save_dir,
           "--data-dir", "empty")


def test_signal_file_missing(uci_root, save_dir):
    (uci_root / "test" / "Inertial Signals" / "body_gyro_z_test.txt").unlink()
    refuse("main.py", uci_flags(uci_root), save_dir, "body_gyro_z_test.txt")


def test_signal_row_of_the_wrong_length(uci_root, save_dir):
    path = uci_root / "train" / "Inertial Signals" / "total_acc_y_train.txt"
    edit_line(path, 3, lambda line: " ".join(line.split()[:-1]))
    refuse("main.py", uci_flags(uci_root), save_dir, "total_acc_y_train.txt", "line 3", "127")


def test_label_count_differs_from_signal_count(uci_root, save_dir):
    edit_line(uci_root / "train" / "y_train.txt", 12, lambda line: None)
    refuse("main.py", uci_flags(uci_root), save_dir, "y_train.txt", "11")


@pytest.mark.parametrize("label", ["0", "7"])
def test_label_outside_1_to_6(label, uci_root, save_dir):
    edit_line(uci_root / "train" / "y_train.txt", 5, lambda line: label)
    refuse("main.py", uci_flags(uci_root), save_dir, "y_train.txt", "line 5", "1..6")


@pytest.mark.parametrize("token", ["NaN", "inf"])
def test_non_finite_value_in_a_signal_file(token, uci_root, save_dir):
    path = uci_root / "train" / "Inertial Signals" / "body_acc_x_train.txt"
    edit_line(path, 2, lambda line: " ".join([token, *line.split()[1:]]))
    # Like every other data error, the message names the file to fix.
    refuse("main.py", uci_flags(uci_root), save_dir, "NaN or infinity", "body_acc_x_train.txt")


def test_damaged_data_is_refused_before_ddp_workers_start(uci_root, save_dir):
    edit_line(uci_root / "train" / "y_train.txt", 5, lambda line: "9")
    line = refuse("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--nproc-per-node", "2",
                                        *uci_flags(uci_root)], save_dir, "y_train.txt", run=as_command)
    assert "line 5" in line


# ---------------------------------------------------------------------------
# --debug and HAR_DEBUG=1 let the traceback through
# ---------------------------------------------------------------------------

def test_debug_flag_shows_the_traceback(tmp_path):
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--batch-size", "0", "--debug",
                             "--save-dir", tmp_path / "run"])
    assert result.returncode not in (0, EXIT_USAGE), result.stderr
    assert "Traceback" in result.stderr and "UsageError" in result.stderr
    assert "--batch-size must be at least 1" in result.stderr


def test_har_debug_environment_variable_shows_the_traceback(tmp_path):
    result = run_subprocess([sys.executable, "main.py", "--dataset", "uci-har", "--data-dir", tmp_path / "nowhere",
                             "--save-dir", tmp_path / "run"], env={"HAR_DEBUG": "1"})
    assert result.returncode not in (0, EXIT_USAGE), result.stderr
    assert "Traceback" in result.stderr and "DataError" in result.stderr and "nowhere" in result.stderr


# ---------------------------------------------------------------------------
# A checkpoint that would run code when unpickled
# ---------------------------------------------------------------------------

class CreatesFile:
    """Unpickling this calls open(path, "w"): a stand-in for any code a hostile file could run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def hostile_checkpoint(path, marker, template):
    """A trainer checkpoint in every other respect, with the code-running object tucked inside."""
    state = torch.load(template, weights_only=True)
    state["config"]["note"] = CreatesFile(marker)
    torch.save(state, path)
    return path


def test_hostile_checkpoint_payload_is_live(save_dir, tmp_path):
    # The control: loaded without weights_only, the file does run its code.
    marker = tmp_path / "control-ran"
    path = hostile_checkpoint(tmp_path / "control.pt", marker, save_dir / "last.pt")
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_resume_refuses_a_checkpoint_that_would_run_code(save_dir, tmp_path):
    marker = tmp_path / "code-ran"
    path = hostile_checkpoint(tmp_path / "hostile.pt", marker, save_dir / "last.pt")
    line = refuse("main.py", ["--resume", path], save_dir, "hostile.pt",
                  "holds objects other than tensors and plain data")
    assert not marker.exists()
    assert line.startswith("error: ")
    assert "\x1b" not in line  # no terminal escape codes from torch's own message in a one-line error


def test_auto_resume_refuses_a_last_pt_that_would_run_code(finished_run, tmp_path):
    marker = tmp_path / "code-ran"
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    hostile_checkpoint(save_dir / "last.pt", marker, finished_run / "last.pt")
    refuse("main.py", [], save_dir, "last.pt", "holds objects other than tensors and plain data")
    assert not marker.exists()


def test_load_checkpoint_refuses_a_checkpoint_that_would_run_code(save_dir, tmp_path):
    marker = tmp_path / "code-ran"
    path = hostile_checkpoint(tmp_path / "hostile.pt", marker, save_dir / "last.pt")
    with pytest.raises(UsageError, match="holds objects other than tensors and plain data") as raised:
        load_checkpoint(path)
    assert "\n" not in str(raised.value) and "hostile.pt" in str(raised.value)
    assert not marker.exists()


class WindowsWithABadOne(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 2:
            raise DataError("window 2 of shard-0.npy holds NaN; rebuild the store")
        return torch.zeros(3)


def test_a_data_error_in_a_loader_worker_is_still_one_line(capsys):
    def read_every_batch(argv):
        for _ in torch.utils.data.DataLoader(WindowsWithABadOne(), batch_size=1, num_workers=1):
            pass
    assert run_entry_point(read_every_batch, []) == EXIT_USAGE
    assert capsys.readouterr().err == "error: window 2 of shard-0.npy holds NaN; rebuild the store\n"


@pytest.mark.parametrize("model, width", [("cnn1d", "10000000"), ("minirocket", "1000000000")])
def test_a_model_too_big_for_the_machine_is_refused_before_it_is_built(model, width, tmp_path):
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--model", model, "--width", width,
                                              "--save-dir", tmp_path / "run"])
    assert code == EXIT_USAGE and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert f"--model {model} --width {width} needs about" in line and "GiB free" in line
