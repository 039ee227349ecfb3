"""End-to-end runs through the real entry points, and the equivalences proven on weights."""
import json
import os
import sys

import pytest
import torch

from conftest import (
    ONE_THREAD,
    TINY_DATA,
    load_checkpoint,
    max_abs_difference,
    read_metrics,
    requires_cuda,
    run_in_process,
    run_subprocess,
)

# The configuration where one process x 32, DDP 2 x 16 and accumulation 2 x 16 are the same
# mathematics: no batch-dependent layers, no dropout, the same LR whatever the split.
# The recipe is off too: DDP ranks draw their own augmentations, so they cannot equal one process,
# and the float tolerance below was set for plain cross-entropy. (--no-resume stays last: some
# tests drop it.)
EQUIVALENT = [*TINY_DATA, "--norm", "none", "--dropout", "0", "--lr-scaling", "none", "--augment", "none",
              "--label-smoothing", "0", "--ema-decay", "0", "--no-resume"]
# Differences of float32 summation order only; a real mismatch is orders of magnitude larger.
WEIGHT_TOLERANCE = 2e-5
# Compiled kernels fuse and reorder more of the arithmetic; still far below a real mismatch.
COMPILE_TOLERANCE = 1e-4
# The runs in this process compute on one thread, as torchrun's workers do (conftest.ONE_THREAD): what
# is compared is weights and written files, not speed.
pytestmark = pytest.mark.usefixtures("one_thread")
EPOCH_KEYS = {"epoch", "train_loss", "val_loss", "val_acc", "val_macro_f1", "lr", "samples_per_s",
              "epoch_time_s", "world_size", "memory"}


def torchrun():
    # The running interpreter's launcher: a `torchrun` on PATH may belong to another Python.
    return [sys.executable, "-m", "torch.distributed.run"]


def assert_run_outputs(save_dir, epochs, world_size):
    """What every finished run leaves: checkpoints, per-epoch metrics, TensorBoard, test report."""
    records = read_metrics(save_dir)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))  # one writer: no duplicates
    for record in records:
        assert record.keys() >= EPOCH_KEYS
        assert record["world_size"] == world_size and record["samples_per_s"] > 0
        assert len(record["memory"]) == world_size
        assert all(entry["peak_rss_gib"] > 0 for entry in record["memory"])
    report = json.loads((save_dir / "test_report.json").read_text())
    assert set(report["per_class"]) == set(report["class_names"]) and len(report["class_names"]) == 6
    matrix = torch.tensor(report["confusion_matrix"])
    assert matrix.shape == (6, 6) and matrix.sum().item() == report["num_samples"] > 0
    assert report["accuracy"] == pytest.approx(matrix.diag().sum().item() / matrix.sum().item())
    assert list((save_dir / "logs").glob("events.out.tfevents.*"))
    checkpoint = load_checkpoint(save_dir / "last.pt")  # weights_only=True
    assert {"model", "optimizer", "scheduler", "scaler", "epoch", "step", "config", "normalization",
            "world_size", "best_metric"} <= checkpoint.keys()
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in checkpoint["model"])
    assert checkpoint["epoch"] == epochs and checkpoint["world_size"] == world_size
    best = load_checkpoint(save_dir / "best.pt")
    assert best["best_metric"] == max(r["val_macro_f1"] for r in records)
    return records, checkpoint


def test_main_py_trains_end_to_end(tmp_path):
    # As a user starts it (the threads it chooses itself), on 8 windows a person: 5 steps an epoch.
    result = run_subprocess([sys.executable, "main.py", *TINY_DATA, "--synthetic-windows-per-subject", "8",
                             "--epochs", "2", "--save-dir", tmp_path / "run"])
    assert result.returncode == 0, result.stderr
    assert "data: synthetic" in result.stdout and "parameters" in result.stdout
    assert "peak 1.00e-03" in result.stdout  # one device, no accumulation: the reference LR
    assert "macro-F1" in result.stdout and "Traceback" not in result.stderr
    assert_run_outputs(tmp_path / "run", epochs=2, world_size=1)


def test_data_parallel_on_cpu_falls_back_to_the_plain_module(tmp_path):
    result = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "dp", *TINY_DATA,
                             "--epochs", "1", "--save-dir", tmp_path / "dp"], env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    assert "no GPU is visible: running the plain module on cpu" in result.stdout
    assert_run_outputs(tmp_path / "dp", epochs=1, world_size=1)


def test_ddp_two_ranks_equal_one_process_with_the_global_batch(tmp_path):
    """torchrun, 2 gloo ranks x 16 == one process x 32, compared on the weights after 34 steps."""
    ddp = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py",
                          "--multi-gpu", "ddp", "--device", "cpu", *EQUIVALENT, "--batch-size", "16",
                          "--epochs", "2", "--save-dir", tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr
    records, ddp_checkpoint = assert_run_outputs(tmp_path / "ddp", epochs=2, world_size=2)
    assert [entry["device"] for entry in records[-1]["memory"]] == ["rank0:cpu", "rank1:cpu"]
    assert ddp.stdout.count("epoch 2/2 |") == 1  # rank 0 alone prints

    code, _, err = run_in_process("main.py", [*EQUIVALENT, "--batch-size", "32", "--epochs", "2",
                                              "--save-dir", tmp_path / "one"])
    assert code == 0, err
    one_checkpoint = load_checkpoint(tmp_path / "one" / "last.pt")
    assert ddp_checkpoint["step"] == one_checkpoint["step"] == 34
    assert max_abs_difference(ddp_checkpoint["model"], one_checkpoint["model"]) < WEIGHT_TOLERANCE
    # Each person's test accuracy comes out of the ranks' gathered predictions as out of one process's
    # (to a window: the weights agree to float rounding, not bit for bit).
    ddp_people, one_people = (json.loads((tmp_path / name / "test_report.json").read_text())["per_subject"]
                              for name in ("ddp", "one"))
    assert ddp_people.keys() == one_people.keys() and len(one_people) == 9
    for subject, row in one_people.items():
        assert ddp_people[subject]["windows"] == row["windows"]
        assert abs(ddp_people[subject]["accuracy"] - row["accuracy"]) <= 1 / row["windows"] + 1e-9, subject

    # The comparison has teeth: half the batch per step is a different run.
    code, _, err = run_in_process("main.py", [*EQUIVALENT, "--batch-size", "16", "--epochs", "1",
                                              "--save-dir", tmp_path / "half"])
    assert code == 0, err
    half = load_checkpoint(tmp_path / "half" / "last.pt")
    assert max_abs_difference(half["model"], one_checkpoint["model"]) > 100 * WEIGHT_TOLERANCE


def test_ddp_validates_every_shard_with_rank_0s_batchnorm_statistics(tmp_path):
    # DDP no longer broadcasts buffers before each forward; the trainer copies rank 0's before
    # evaluating. Rank 1's own statistics would give another validation loss than rank 0's weights.
    flags = [*EQUIVALENT[:EQUIVALENT.index("--norm")], *EQUIVALENT[EQUIVALENT.index("--norm") + 2:],
             "--norm", "batch", "--batch-size", "16", "--epochs", "1"]
    ddp = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py", "--multi-gpu",
                          "ddp", "--device", "cpu", *flags, "--save-dir", tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr
    logged = read_metrics(tmp_path / "ddp")[-1]["val_loss"]
    from data.sources import load_har_data
    from data.splits import normalize
    from models import build_model
    from training.config.cli import parse_config
    checkpoint = load_checkpoint(tmp_path / "ddp" / "last.pt")
    data = load_har_data(**parse_config([*flags, "--save-dir", str(tmp_path / "x")]).data_options())
    val = normalize(data.val, checkpoint["normalization"]["mean"].numpy(), checkpoint["normalization"]["std"].numpy())
    model = build_model("cnn1d", 9, 6, dropout=0.0, norm="batch")
    model.load_state_dict(checkpoint["model"])
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.eval()(torch.from_numpy(val.signals)),
                                                     torch.from_numpy(val.labels)).item()
    assert abs(logged - expected) < 1e-5, (logged, expected)


def test_ddp_with_augmentation_is_reproducible_and_really_augments(tmp_path):
    """Each rank draws its own augmentation from (seed, epoch, rank): a rerun repeats it bit for bit."""
    def ddp_run(name, augment):
        result = run_subprocess([*torchrun(), "--standalone", "--nproc_per_node=2", "main_multi_gpu.py",
                                 "--multi-gpu", "ddp", "--device", "cpu", *TINY_DATA, "--batch-size", "16",
                                 "--epochs", "1", "--augment", augment, "--save-dir", tmp_path / name],
                                env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
        return load_checkpoint(tmp_path / name / "last.pt")

    first, again = ddp_run("first", "rotate,scale,jitter,shift"), ddp_run("again", "rotate,scale,jitter,shift")
    assert all(torch.equal(first["model"][name], again["model"][name]) for name in first["model"])
    plain = ddp_run("plain", "none")
    assert max_abs_difference(first["model"], plain["model"]) > 100 * WEIGHT_TOLERANCE


def test_accumulation_2x16_equals_batch_32(tmp_path):
    runs = {}
    for name, flags in {"accum": ["--batch-size", "16", "--grad-accum-steps", "2"],
                        "batch": ["--batch-size", "32"],
                        "no-accum": ["--batch-size", "16"]}.items():
        code, out, err = run_in_process("main.py", [*EQUIVALENT, *flags, "--epochs", "2",
                                                    "--save-dir", tmp_path / name])
        assert code == 0, err
        runs[name] = load_checkpoint(tmp_path / name / "last.pt")
    assert runs["accum"]["step"] == runs["batch"]["step"] == 34
    # 34 steps of float32 sums in another order drift the deepest layer by a few 1e-5; a real
    # difference (batch 16 without accumulation) moves it hundreds of times further.
    drift = max_abs_difference(runs["accum"]["model"], runs["batch"]["model"])
    real = max_abs_difference(runs["no-accum"]["model"], runs["batch"]["model"])
    assert drift < 1e-4 and real > 100 * drift, (drift, real)


def test_resume_after_two_epochs_matches_four_straight_epochs(tmp_path):
    # Default model with BatchNorm and dropout: the RNG and every state must come back exactly.
    common = [*TINY_DATA, "--epochs", "4", "--warmup-epochs", "1"]
    code, _, err = run_in_process("main.py", [*common, "--no-resume", "--save-dir", tmp_path / "straight"])
    assert code == 0, err
    code, out, err = run_in_process("main.py", [*common, "--stop-after-epochs", "2", "--save-dir",
                                                tmp_path / "split"])
    assert code == 0, err
    assert "continue from epoch 3" in out and not (tmp_path / "split" / "test_report.json").exists()
    assert load_checkpoint(tmp_path / "split" / "last.pt")["epoch"] == 2
    code, out, err = run_in_process("main.py", [*common, "--save-dir", tmp_path / "split"])
    assert code == 0, err
    assert "RESUMING from" in out and "2 epochs" in out

    straight = load_checkpoint(tmp_path / "straight" / "last.pt")
    resumed = load_checkpoint(tmp_path / "split" / "last.pt")
    for key, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key
    for key, state in straight["optimizer"]["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, resumed["optimizer"]["state"][key][name]), (key, name)
    for key in ("last_epoch", "_last_lr"):  # the schedule is rebuilt at its position on resume
        assert straight["scheduler"][key] == resumed["scheduler"][key]
    assert straight["best_metric"] == resumed["best_metric"]
    assert [r["epoch"] for r in read_metrics(tmp_path / "split")] == [1, 2, 3, 4]
    reports = [json.loads((tmp_path / name / "test_report.json").read_text()) for name in ("straight", "split")]
    for report in reports:
        del report["checkpoint"]  # the only field that names the folder
    assert reports[0] == reports[1]


def test_checkpoints_cross_load_between_main_py_and_ddp(tmp_path):
    # One process writes epoch 1 of 2 ...
    code, _, err = run_in_process("main.py", [*EQUIVALENT, "--epochs", "2", "--stop-after-epochs", "1",
                                              "--save-dir", tmp_path / "single"])
    assert code == 0, err
    # ... DDP (through main_multi_gpu.py's own launcher) loads it and finishes the run ...
    ddp = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--nproc-per-node", "2",
                          "--device", "cpu", *EQUIVALENT[:-1], "--batch-size", "16", "--epochs", "2",
                          "--resume", tmp_path / "single" / "last.pt", "--save-dir", tmp_path / "ddp"])
    assert ddp.returncode == 0, ddp.stderr
    assert "torch.distributed.run" in ddp.stdout and "RESUMING" in ddp.stdout
    records = read_metrics(tmp_path / "ddp")
    assert [r["epoch"] for r in records] == [2] and records[0]["world_size"] == 2
    ddp_checkpoint = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert ddp_checkpoint["epoch"] == 2 and ddp_checkpoint["world_size"] == 2
    # ... and one process loads the DDP checkpoint again.
    code, out, err = run_in_process("main.py", [*EQUIVALENT[:-1], "--epochs", "3",
                                                "--resume", tmp_path / "ddp" / "last.pt",
                                                "--save-dir", tmp_path / "back"])
    assert code == 0, err
    assert "RESUMING" in out and load_checkpoint(tmp_path / "back" / "last.pt")["epoch"] == 3


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--grad-accum-steps", "-1"], "--grad-accum-steps must be at least 1"),
    (["--warmup-epochs", "5", "--epochs", "2"], "longer than the run"),
    (["--resume", "/nonexistent/last.pt"], "does not exist"),
    (["--device", "cpu", "--gpu-ids", "0"], "--gpu-ids was given with --device cpu"),
    (["--warmup-epochs", "nan"], "--warmup-epochs must be a finite number"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, flags, message):
    code, out, err = run_in_process("main.py", [*TINY_DATA, *flags, "--save-dir", tmp_path / "bad"])
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_ddp_flags_that_cannot_work_on_cpu_fail_before_launching(tmp_path):
    # Checked before torchrun starts, so the user sees one line rather than one per rank.
    code, _, err = run_in_process("main_multi_gpu.py", ["--multi-gpu", "ddp", "--device", "cpu", "--sync-bn",
                                                        *TINY_DATA, "--save-dir", tmp_path / "x"])
    assert code == 2 and "--sync-bn needs CUDA" in err


@requires_cuda
def test_cuda_amp_fp16_uses_a_grad_scaler(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--device", "cuda", "--amp", "--amp-dtype", "fp16",
                                                "--epochs", "1", "--save-dir", tmp_path / "amp"])
    assert code == 0, err
    assert "AMP fp16 autocast with GradScaler" in out
    checkpoint = load_checkpoint(tmp_path / "amp" / "last.pt")
    assert checkpoint["scaler"]["scale"] > 0
    assert "allocated_gib" in read_metrics(tmp_path / "amp")[0]["memory"][0]


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path):
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "1", "--save-dir", tmp_path / "run"])
    assert code == 0, err
    before = (tmp_path / "run" / "last.pt").read_bytes()
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--epochs", "2", "--model", "transformer",
                                              "--save-dir", tmp_path / "run"])
    assert code == 2 and "model cnn1d (this run: transformer)" in err and err.count("\n") == 1
    assert (tmp_path / "run" / "last.pt").read_bytes() == before


def test_compiled_model_saves_unprefixed_weights(tmp_path):
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--synthetic-windows-per-subject", "4", "--epochs", "1",
                                              "--compile", "--save-dir", tmp_path / "compiled"])
    assert code == 0, err
    weights = load_checkpoint(tmp_path / "compiled" / "last.pt")["model"]
    from models import build_model
    build_model("cnn1d", 9, 6).load_state_dict(weights)  # strict: no _orig_mod. prefixes


def test_compiled_ddp_accumulation_gives_the_eager_weights(tmp_path):
    # torch.compile wraps the DDP module, so no_sync must still govern the micro-batches of an
    # accumulation window through the compiled forward; fused kernels may only reorder float sums.
    common = ["--multi-gpu", "ddp", "--nproc-per-node", "2", "--device", "cpu", *EQUIVALENT, "--batch-size", "8",
              "--grad-accum-steps", "2", "--epochs", "1"]
    weights = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        result = run_subprocess([sys.executable, "main_multi_gpu.py", *common, *extra, "--save-dir", tmp_path / name])
        assert result.returncode == 0, result.stderr[-3000:]
        checkpoint = load_checkpoint(tmp_path / name / "last.pt")
        assert checkpoint["step"] == 17 and checkpoint["config"]["compile"] == bool(extra)
        weights[name] = checkpoint["model"]
    assert max_abs_difference(weights["eager"], weights["compiled"]) < COMPILE_TOLERANCE


def test_deterministic_runs_choose_the_same_algorithms_in_every_process(tmp_path, monkeypatch):
    # Set, then removed, so that monkeypatch takes away what the run sets as well (a delenv of an
    # absent name records nothing to undo).
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.deterministic, cudnn.benchmark)
    try:
        code, out, err = run_in_process("main.py", [*TINY_DATA, "--synthetic-windows-per-subject", "4", "--epochs",
                                                    "1", "--deterministic", "--save-dir", tmp_path])
        assert code == 0, err
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert cudnn.deterministic and not cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.deterministic, cudnn.benchmark = saved[2:]
    assert "| deterministic algorithms" in out
    assert load_checkpoint(tmp_path / "last.pt")["config"]["deterministic"] is True


def test_cuda_graph_compile_modes_are_refused_on_cpu(tmp_path):
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--device", "cpu", "--compile-mode", "reduce-overhead",
                                              "--save-dir", tmp_path / "run"])
    assert code == 2 and err.count("\n") == 1
    assert "--compile-mode reduce-overhead records CUDA graphs" in err and not (tmp_path / "run").exists()


def test_resume_with_a_larger_global_batch_follows_the_new_lr_schedule(tmp_path):
    from training.loop.step import warmup_cosine
    common = [*TINY_DATA, "--epochs", "3", "--save-dir", tmp_path / "run"]
    code, _, err = run_in_process("main.py", [*common, "--stop-after-epochs", "1"])
    assert code == 0, err
    # Another global batch is another run: resumed only when named with --resume.
    code, out, err = run_in_process("main.py", [*common, "--grad-accum-steps", "2", "--stop-after-epochs", "1",
                                                "--resume", tmp_path / "run" / "last.pt"])
    assert code == 0, err
    assert "global batch changes from 32 to 64" in err
    # 17 batches of 32 -> 9 steps per epoch with accumulation 2; peak LR 2e-3 (linear scaling);
    # default warmup min(2, 3 / 5) = 0.6 epochs -> 5 steps; 27 steps in all; 2 epochs done.
    record = read_metrics(tmp_path / "run")[-1]
    assert record["epoch"] == 2
    assert record["lr"] == pytest.approx(2e-3 * warmup_cosine(18, 5, 27), rel=1e-9)


def test_resume_refuses_a_file_that_is_not_a_trainer_checkpoint(tmp_path):
    from models import build_model
    torch.save(build_model("cnn1d", 9, 6).state_dict(), tmp_path / "weights.pt")
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--resume", tmp_path / "weights.pt",
                                              "--save-dir", tmp_path / "run"])
    assert code == 2 and "is not a checkpoint of this trainer" in err and "Traceback" not in err


def test_an_early_stopped_run_is_not_extended_by_rerunning_it(tmp_path):
    # A vanishing LR leaves validation macro-F1 flat, so patience 1 stops after epoch 2.
    command = [*TINY_DATA, "--epochs", "8", "--lr", "1e-9", "--early-stopping-patience", "1",
               "--save-dir", tmp_path / "run"]
    code, out, err = run_in_process("main.py", command)
    assert code == 0, err
    epochs_done = len(read_metrics(tmp_path / "run"))
    assert "early stopping" in out and epochs_done < 8
    code, out, err = run_in_process("main.py", command)
    assert code == 0, err
    assert "already stopped early" in out and len(read_metrics(tmp_path / "run")) == epochs_done


def test_non_ddp_modes_refuse_to_run_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for script, flags in (("main.py", []), ("main_multi_gpu.py", ["--multi-gpu", "dp"])):
        code, _, err = run_in_process(script, [*flags, *TINY_DATA, "--save-dir", tmp_path / "x"])
        assert code == 2 and "torchrun" in err
    assert not (tmp_path / "x").exists()
