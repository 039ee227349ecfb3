"""export.py: TorchScript and ONNX files that take raw-unit windows and match the PyTorch model."""
import errno
import os
import sys

import numpy as np
import pytest
import torch

from conftest import run_subprocess
from inference_fixtures import make_checkpoint
from test_bad_input import assert_refused, hostile_checkpoint
from test_predict import run_script

MODELS = ("cnn1d", "cnn_lstm", "transformer", "minirocket")
BATCH_SIZES = (1, 4, 9)


def expected_logits(checkpoint, windows):
    """The checkpoint's model on (windows - mean) / std, built here without the export code."""
    from models import build_model
    state = torch.load(checkpoint, weights_only=True)
    config = state["config"]
    model = build_model(config["model"], state["in_channels"], state["num_classes"], norm=config["norm"])
    model.load_state_dict(state["model"])
    normalised = (torch.from_numpy(windows) - state["normalization"]["mean"][None, :, None]) / \
        state["normalization"]["std"][None, :, None]
    with torch.no_grad():
        return model.eval()(normalised).numpy()


def raw_windows(batch_size, steps, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.4, (batch_size, 9, steps)) + 0.2).astype(np.float32)


def run_torchscript(path, windows):
    with torch.no_grad():
        return torch.jit.load(str(path))(torch.from_numpy(windows)).numpy()


def run_onnx(path, windows):
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["signals"]
    return session.run(["logits"], {"signals": windows})[0]


@pytest.mark.parametrize("fmt, runner", [("torchscript", run_torchscript), ("onnx", run_onnx)])
@pytest.mark.parametrize("model", MODELS)
def test_export_matches_pytorch(model, fmt, runner, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxscript")
        pytest.importorskip("onnxruntime")
    steps = 96 if model == "transformer" else 128  # the transformer also off its default length
    checkpoint = make_checkpoint(tmp_path / "best.pt", model=model, window_steps=steps)
    out = tmp_path / f"model.{fmt}"
    code, stdout, err = run_script("export", ["--checkpoint", checkpoint, "--format", fmt, "--out", out])
    assert code == 0, err
    assert "largest logit difference" in stdout
    for seed, batch_size in enumerate(BATCH_SIZES):
        windows = raw_windows(batch_size, steps, seed)
        got = runner(out, windows)
        want = expected_logits(checkpoint, windows)
        assert got.shape == (batch_size, 6)
        assert np.abs(want).max() > 0.05  # a model that outputs ~0 would match anything
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_exported_model_normalises_inside(tmp_path):
    # Fed normalised windows, the export must disagree: the normalisation is its job.
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    out = tmp_path / "model.pt"
    assert run_script("export", ["--checkpoint", checkpoint, "--format", "torchscript", "--out", out])[0] == 0
    windows = raw_windows(4, 128, 0)
    state = torch.load(checkpoint, weights_only=True)
    normalised = ((windows - state["normalization"]["mean"].numpy()[None, :, None]) /
                  state["normalization"]["std"].numpy()[None, :, None]).astype(np.float32)
    assert np.abs(run_torchscript(out, normalised) - expected_logits(checkpoint, windows)).max() > 1e-2


def test_export_refuses_bad_input(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"keep me")
    assert_refused(run_script("export", ["--checkpoint", checkpoint, "--format", "onnx", "--out", existing]),
                   "exists", "--overwrite")
    assert existing.read_bytes() == b"keep me"
    assert_refused(run_script("export", ["--checkpoint", checkpoint, "--format", "onnx", "--out", tmp_path]),
                   "is a folder")
    checkpoint_bytes = checkpoint.read_bytes()
    assert_refused(run_script("export", ["--checkpoint", checkpoint, "--format", "torchscript", "--out", checkpoint,
                                         "--overwrite"]), "a file this command reads")
    assert checkpoint.read_bytes() == checkpoint_bytes
    assert_refused(run_script("export", ["--checkpoint", checkpoint, "--format", "tflite", "--out", existing]),
                   "--format")
    marker = tmp_path / "code-ran"
    hostile = hostile_checkpoint(tmp_path / "hostile.pt", marker, checkpoint)
    assert_refused(run_script("export", ["--checkpoint", hostile, "--format", "torchscript",
                                         "--out", tmp_path / "m.pt"]), "holds objects other than tensors")
    assert not marker.exists() and not (tmp_path / "m.pt").exists()


def test_a_long_output_name_is_written_and_one_too_long_refused(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    longest = tmp_path / ("a" * 252 + ".pt")  # 255 bytes: the temporary name beside it must still fit
    code, _, err = run_script("export", ["--checkpoint", checkpoint, "--format", "torchscript", "--out", longest])
    assert code == 0 and longest.is_file(), err
    assert_refused(run_script("export", ["--checkpoint", checkpoint, "--format", "torchscript",
                                         "--out", tmp_path / ("a" * 300 + ".pt")]), "303 bytes long", "at most 255")


@pytest.mark.parametrize("error, says", [(errno.ENOSPC, "free space there"), (errno.EPERM, "choose another --out")])
def test_an_export_the_disk_refuses_stops_in_one_line_and_leaves_the_old_file(tmp_path, monkeypatch, error, says):
    from data import store
    from inference.bundle import load_bundle
    from inference.export import export
    from training.errors import UsageError
    out = tmp_path / "m.pt"
    out.write_bytes(b"the earlier export")

    def refused(source, target):
        raise OSError(error, os.strerror(error))
    monkeypatch.setattr(store.os, "replace", refused)
    with pytest.raises(UsageError, match=f"--out {out} could not be written .*; {says} and export again"):
        export(load_bundle(make_checkpoint(tmp_path / "best.pt")), "torchscript", out)
    assert out.read_bytes() == b"the earlier export"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "m.pt"]  # no temporary file left


def test_an_output_named_for_the_other_format_a_folder_or_a_dangling_link_is_refused(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    export = ["--checkpoint", checkpoint, "--format", "torchscript", "--out"]
    assert_refused(run_script("export", [*export, tmp_path / "m.onnx"]),
                   "is named as an onnx file but --format torchscript writes a torchscript file")
    assert_refused(run_script("export", [*export, f"{tmp_path / 'newdir'}/"]), "names a folder")
    link = tmp_path / "link.pt"
    link.symlink_to(tmp_path / "nowhere.pt")
    assert_refused(run_script("export", [*export, link]), "exists", "--overwrite")
    assert link.is_symlink() and not (tmp_path / "newdir").exists() and not (tmp_path / "m.onnx").exists()


LIMITED_EXPORT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # as a disk that fills after 4 KiB
sys.argv = ["export.py", *sys.argv[1:]]
import runpy
runpy.run_path("export.py", run_name="__main__")
"""


def test_a_torchscript_export_the_disk_cuts_short_stops_in_one_line_and_leaves_the_old_file(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best.pt")
    out = tmp_path / "m.pt"
    out.write_bytes(b"the earlier export")
    result = run_subprocess([sys.executable, "-c", LIMITED_EXPORT, "--checkpoint", checkpoint, "--format",
                             "torchscript", "--out", out, "--overwrite"], env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: --out {out} could not be written (File too large)")
    assert len(result.stderr.splitlines()) == 1, result.stderr[-2000:]
    assert out.read_bytes() == b"the earlier export"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "m.pt"]  # no temporary file left
