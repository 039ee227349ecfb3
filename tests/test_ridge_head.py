"""MiniRocket's head solved by ridge regression (--head-fit, training/loop/ridge_head.py): the solve
against scikit-learn's, which runs take it, and what the run writes and resumes."""
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.linear_model import RidgeClassifierCV

from conftest import load_checkpoint, run_in_process, run_subprocess
from data.sources import load_har_data
from data.splits import normalize
from models import MODELS, build_model
from test_bad_input import assert_refused
from test_npz_dataset import train as train_npz
from test_own_sensors import windows, write_npz
from training.assembly import resolve_head_fit
from training.errors import UsageError
from training.loop.ridge_head import (
    ALPHAS,
    RIDGE_MAX_WINDOWS,
    left_out_groups,
    scaled_ridge,
    solve_ridge,
)

SINGLE, FSDP = SimpleNamespace(name="single"), SimpleNamespace(name="fsdp")


@pytest.mark.parametrize("spread", [0.3, 3.0])  # classes far apart choose a weak alpha, close ones a strong one
def test_the_solve_is_scikit_learns_ridge_classifier_with_leave_one_out_alpha(spread):
    rng = np.random.default_rng(0)
    labels = np.arange(60) % 3
    features = rng.normal(size=(60, 200)) + spread * rng.normal(size=(3, 200))[labels]
    reference = RidgeClassifierCV(alphas=ALPHAS).fit(features, labels)
    solution = solve_ridge(torch.from_numpy(features), labels, 3)
    assert solution.alpha == pytest.approx(reference.alpha_)
    np.testing.assert_allclose(solution.weight.numpy(), reference.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(solution.bias.numpy(), reference.intercept_, rtol=1e-4, atol=1e-6)


def test_the_alpha_is_chosen_by_the_error_on_each_group_left_out_as_refitting_without_it_measures():
    rng = np.random.default_rng(1)
    labels, groups = np.arange(48) % 2, np.repeat(np.arange(6), 8)
    # Each group shares an offset, as one person's overlapping windows share samples.
    features = rng.normal(size=(48, 100)) + 2.0 * rng.normal(size=(6, 100))[groups] + 0.5 * labels[:, None]
    alphas = (0.01, 10.0, 1e4)

    def refit_error(alpha):
        """Squared error on each group's +-1 targets of the solve without it, the groups together."""
        errors = []
        for group in range(6):
            out = groups == group
            solution = solve_ridge(torch.from_numpy(features[~out]), labels[~out], 2, alphas=(alpha,))
            predicted = torch.from_numpy(features[out]).float() @ solution.weight.T + solution.bias
            targets = torch.where(torch.nn.functional.one_hot(torch.from_numpy(labels[out]), 2) > 0, 1.0, -1.0)
            errors.append(((predicted - targets) ** 2).sum().item())
        return sum(errors)

    best = min(alphas, key=refit_error)
    assert solve_ridge(torch.from_numpy(features), labels, 2, groups=groups, alphas=alphas).alpha == best
    assert len({round(refit_error(alpha), 3) for alpha in alphas}) == 3  # the choice is not a tie


def test_each_windows_held_out_output_is_the_solve_without_its_group_and_the_scale_keeps_every_prediction():
    rng = np.random.default_rng(2)
    labels, groups = np.arange(40) % 3, np.repeat(np.arange(5), 8)
    features = torch.from_numpy(rng.normal(size=(40, 60)) + 1.5 * rng.normal(size=(3, 60))[labels])
    solution = solve_ridge(features, labels, 3, groups=groups, alphas=(5.0,))
    for group in range(5):
        out = groups == group
        without = solve_ridge(features[~out], labels[~out], 3, alphas=(5.0,))
        expected = features[out].float() @ without.weight.T + without.bias
        torch.testing.assert_close(solution.held_out[out].float(), expected, rtol=1e-4, atol=1e-4)
    weight, bias, _, temperature = scaled_ridge(features, labels, 3, groups)
    solution = solve_ridge(features, labels, 3, groups=groups)  # the strengths scaled_ridge chooses among
    assert temperature != 1.0
    torch.testing.assert_close(weight, solution.weight / temperature)
    outputs = features.float() @ solution.weight.T + solution.bias
    assert torch.equal((features.float() @ weight.T + bias).argmax(dim=1), outputs.argmax(dim=1))
    nll = [torch.nn.functional.cross_entropy(solution.held_out / scale, torch.from_numpy(labels)).item()
           for scale in (1.0, temperature)]
    assert nll[1] < nll[0]


def test_one_persons_windows_are_left_out_in_stretches_of_time():
    assert list(left_out_groups(np.ones(20, dtype=int), blocks=4)) == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    people = np.repeat([4, 7, 9], 3)
    assert list(left_out_groups(people)) == list(people)


def test_auto_solves_small_training_splits_only_where_a_linear_head_is_pooled_whole_on_each_rank():
    minirocket, cnn = MODELS["minirocket"], MODELS["cnn1d"]
    assert resolve_head_fit("auto", minirocket, True, RIDGE_MAX_WINDOWS, SINGLE) == "ridge"
    assert resolve_head_fit("auto", minirocket, True, RIDGE_MAX_WINDOWS + 1, SINGLE) == "adamw"
    for model, pooled, strategy in ((cnn, True, SINGLE), (minirocket, False, SINGLE), (minirocket, True, FSDP)):
        assert resolve_head_fit("auto", model, pooled, 10, strategy) == "adamw"
    assert resolve_head_fit("ridge", minirocket, True, 10 * RIDGE_MAX_WINDOWS, SINGLE) == "ridge"
    with pytest.raises(UsageError, match="more than the 16,384 it takes"):
        resolve_head_fit("ridge", minirocket, True, 100_000, SINGLE)
    assert resolve_head_fit("adamw", minirocket, True, 10, SINGLE) == "adamw"


def test_a_small_set_is_solved_on_its_training_windows_and_the_run_resumes_as_done(tmp_path):
    arrays = windows(subjects=5, per_subject=12, channels=3, steps=48)
    path = write_npz(tmp_path / "w.npz", **arrays, split=np.where(arrays["subjects"] == 5, "test", "train"))
    code, out, err = train_npz(path, tmp_path / "run", "--val-fraction", "0")
    assert code == 0, err
    assert "head: ridge regression on 48 training windows" in out and "epoch 1/1" in out
    checkpoint = load_checkpoint(tmp_path / "run" / "best.pt")
    model = build_model("minirocket", 3, 3, window_steps=48)
    model.load_state_dict(checkpoint["model"])
    data = load_har_data("npz", path, val_fraction=0.0)
    statistics = checkpoint["normalization"]
    train = normalize(data.train, statistics["mean"].numpy(), statistics["std"].numpy())
    weight, bias, _, temperature = scaled_ridge(model.features(torch.from_numpy(train.signals)), train.labels, 3,
                                                left_out_groups(train.subjects))
    assert temperature < 1  # least squares' outputs near +-1 are sharpened
    torch.testing.assert_close(model.head[-1].weight, weight)
    torch.testing.assert_close(model.head[-1].bias, bias)
    torch.testing.assert_close(checkpoint["ema"]["weights"]["head.1.weight"], weight)  # the average is the solve
    assert checkpoint["optimizer"] == {} and checkpoint["scheduler"] == {}  # no step: no optimizer was built
    code, out, err = train_npz(path, tmp_path / "run", "--val-fraction", "0")  # the same command again
    assert code == 0, err
    assert "already solved" in out
    assert torch.equal(load_checkpoint(tmp_path / "run" / "best.pt")["model"]["head.1.weight"], weight)


def test_adamw_trains_the_same_small_set_by_epochs(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(subjects=4, per_subject=12, channels=3, steps=48))
    code, out, err = train_npz(path, tmp_path / "run", "--head-fit", "adamw", "--epochs", "2")
    assert code == 0, err
    assert "ridge" not in out and "epoch 2/2" in out


def test_ridge_is_refused_where_there_is_no_pooled_linear_head(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows())
    for flags, named in ((["--model", "cnn1d"], "--model cnn1d"), (["--feature-views", "0"], "--feature-views 0")):
        code, out, err = run_in_process("main.py", ["--dataset", "npz", "--data-dir", path, "--head-fit", "ridge",
                                                    "--save-dir", tmp_path / "run", *flags])
        assert named in assert_refused((code, out, err), "--head-fit ridge")
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_two_ddp_ranks_solve_the_head_one_process_solves(tmp_path):
    """Every rank holds the whole pool (gathered from the shares) and solves on it: the same head."""
    arrays = windows(subjects=6, per_subject=12, channels=3, steps=48)
    path = write_npz(tmp_path / "w.npz", **arrays, split=np.where(arrays["subjects"] == 6, "test", "train"))
    data = ["--dataset", "npz", "--data-dir", path, "--no-figures"]
    alone = run_subprocess([sys.executable, "main.py", *data, "--save-dir", tmp_path / "one"])
    assert alone.returncode == 0, alone.stderr
    ranks = run_subprocess([sys.executable, "main_multi_gpu.py", "--multi-gpu", "ddp", "--device", "cpu",
                            "--nproc-per-node", "2", *data, "--save-dir", tmp_path / "two"])
    assert ranks.returncode == 0, ranks.stderr
    assert "head: ridge regression on 48 training windows" in ranks.stdout
    assert "the validation people included: 60 training windows" in ranks.stdout  # the final model's solve
    one, two = (load_checkpoint(tmp_path / name / "best.pt")["model"] for name in ("one", "two"))
    for name in ("head.1.weight", "head.1.bias"):
        assert torch.equal(one[name], two[name]), name


def test_cross_validation_with_a_refit_and_an_ensemble_finishes_on_solved_heads(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(subjects=6, per_subject=10, channels=3, steps=48))
    flags = ["--dataset", "npz", "--data-dir", path, "--no-figures", "--save-dir", tmp_path / "cv", "--cv-folds", "2",
             "--refit", "--ensemble"]
    code, out, err = run_in_process("main.py", flags)
    assert code == 0, err
    assert out.count("head: ridge regression") == 3 and "not finished" not in out
    assert (tmp_path / "cv" / "ensemble.pt").is_file()
    # A run killed between the refit's last save and its epoch's line loses that line alone (and
    # leaves the refit unrecorded as finished): its checkpoint still says it is, and the run ends.
    from crossval.folds import IDENTITY
    (tmp_path / "cv" / "refit" / "metrics.jsonl").write_text("")
    (tmp_path / "cv" / "refit" / IDENTITY).unlink()
    (tmp_path / "cv" / "cv_report.json").unlink()
    code, out, err = run_in_process("main.py", flags)
    assert code == 0, err
    assert "already solved by ridge regression" in out and "not finished" not in out, out
    assert (tmp_path / "cv" / "cv_report.json").is_file()


def test_a_solved_run_is_finished_for_the_resume_judge(tmp_path):
    path = write_npz(tmp_path / "w.npz", **windows(subjects=5, per_subject=10, channels=3, steps=48))
    code, _, err = train_npz(path, tmp_path / "run")
    assert code == 0, err
    assert load_checkpoint(tmp_path / "run" / "last.pt")["planned_epochs"] == 1
    line = assert_refused(train_npz(path, tmp_path / "run", "--lr", "0.005"), "--lr")
    assert "a finished run (1 of 1 epochs)" in line
