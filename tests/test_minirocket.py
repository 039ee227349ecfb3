"""--model minirocket: fixed random dilated kernels, PPV features, a trained linear head."""
import contextlib
import json
from unittest import mock

import numpy as np
import pytest
import torch

from conftest import TINY_DATA, load_checkpoint, run_in_process
from models import build_model, count_parameters
from models.minirocket import KERNEL_LENGTH, QUANTILE_SEED, TRANSFORM_CHUNK, row_quantiles, triton_installed


@pytest.fixture
def fitted():
    torch.manual_seed(0)
    model = build_model("minirocket", 9, 6, width=2520).eval()  # two biases per kernel and dilation
    model.fit(torch.randn(64, 9, 128).cumsum(dim=2) * 0.1)  # random walks: smooth, unlike white noise
    return model


def ppv_by_hand(model, window, dilation_index, kernel, bias_index):
    """One feature computed with numpy loops: the kernel's weights summed over its channels, dilated,
    padded on the dilations that are padded, then the share of outputs above -bias."""
    dilation = model.dilations[dilation_index]
    weights = model.weights[dilation_index, kernel].numpy()  # [C, 9]
    padding = (KERNEL_LENGTH - 1) * dilation // 2 if dilation_index % 2 == 0 else 0
    signal = np.pad(window, ((0, 0), (padding, padding)))
    span = (KERNEL_LENGTH - 1) * dilation
    outputs = [sum(float(weights[:, tap] @ signal[:, start + tap * dilation]) for tap in range(KERNEL_LENGTH))
               for start in range(signal.shape[1] - span)]
    return float(np.mean(np.array(outputs) + float(model.biases[dilation_index, kernel, bias_index]) > 0))


def test_features_are_the_proportion_of_positive_values_of_each_dilated_kernel(fitted):
    window = np.cumsum(np.random.default_rng(1).normal(size=(9, 128)), axis=1).astype(np.float32) * 0.1
    features = fitted.transform(torch.from_numpy(window)[None])[0].numpy()
    per = fitted.biases_per_kernel
    assert per == 2
    for dilation_index, kernel, bias_index in ((0, 0, 0), (1, 37, 1), (len(fitted.dilations) - 1, 83, 1)):
        index = (dilation_index * 84 + kernel) * per + bias_index
        assert features[index] == pytest.approx(ppv_by_hand(fitted, window, dilation_index, kernel, bias_index),
                                                abs=1e-6)


def test_fit_sets_biases_from_the_data_and_only_the_head_learns(fitted):
    features = fitted.transform(torch.randn(32, 9, 128).cumsum(dim=2) * 0.1)
    # Quantile biases put most features strictly between "never" and "always" positive.
    assert ((features > 0) & (features < 1)).float().mean() > 0.5
    assert fitted.biases.abs().sum() > 0
    assert count_parameters(fitted) == sum(p.numel() for p in fitted.head.parameters())
    names = set(fitted.state_dict())  # the fixed parts travel with the checkpoint
    assert {"weights", "biases", "feature_mean", "feature_std"} <= names


def test_the_dilations_follow_the_window_length():
    short, long = (build_model("minirocket", 9, 6, window_steps=steps) for steps in (64, 256))
    assert max(short.dilations) * (KERNEL_LENGTH - 1) < 64 <= max(long.dilations) * (KERNEL_LENGTH - 1)
    with pytest.raises(ValueError, match="--width 50 is below"):
        build_model("minirocket", 9, 6, width=50)


def test_a_trained_minirocket_predicts_what_its_test_report_says(tmp_path):
    code, out, err = run_in_process("main.py", [*TINY_DATA, "--model", "minirocket", "--width", "840",
                                                "--synthetic-windows-per-subject", "8", "--epochs", "2",
                                                "--save-dir", tmp_path])
    assert code == 0, err
    checkpoint = load_checkpoint(tmp_path / "best.pt")
    assert checkpoint["ema"]["weights"]["biases"].abs().sum() > 0  # fitted before the average copied it
    assert torch.equal(checkpoint["ema"]["weights"]["biases"], checkpoint["model"]["biases"])
    from data.sources import load_har_data
    from inference.bundle import load_bundle, probabilities
    test = load_har_data("synthetic", synthetic_windows_per_subject=8).test
    predicted = probabilities(load_bundle(tmp_path / "best.pt"), test.signals, torch.device("cpu")).argmax(axis=1)
    report = json.loads((tmp_path / "test_report.json").read_text())
    assert report["accuracy"] == pytest.approx(float(np.mean(predicted == test.labels)))


def test_features_stay_fp32_under_autocast(fitted):
    seen = []
    fitted.head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    windows = torch.randn(8, 9, 128).cumsum(dim=2) * 0.1
    fitted(windows)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fitted(windows)
    assert seen[1].dtype == torch.float32 and torch.equal(seen[0], seen[1])  # not one comparison flipped


def reference_transform(model, windows):
    """The straightforward transform: every kernel's output compared with every bias as booleans."""
    features = []
    for d, (dilation, padding) in enumerate(zip(model.dilations, model.paddings, strict=True)):
        output = torch.nn.functional.conv1d(windows, model.weights[d], padding=padding, dilation=dilation)
        features.append((output[:, :, None, :] + model.biases[d][None, :, :, None] > 0).float().mean(dim=3).flatten(1))
    return torch.cat(features, dim=1)


def reference_biases(model, signals, max_windows=1024):
    """The fit's biases one kernel at a time with torch.quantile, drawing in the same order."""
    generator = torch.Generator().manual_seed(QUANTILE_SEED)
    sample = signals[torch.randperm(len(signals), generator=generator)[:max_windows]]
    quantiles = torch.rand(model.biases.shape, generator=generator)
    biases = torch.empty(model.biases.shape)
    for d, (dilation, padding) in enumerate(zip(model.dilations, model.paddings, strict=True)):
        for k in range(model.biases.shape[1]):
            window = sample[int(torch.randint(len(sample), (1,), generator=generator))][None]
            output = torch.nn.functional.conv1d(window, model.weights[d, k:k + 1], padding=padding,
                                                dilation=dilation).flatten()
            biases[d, k] = -torch.quantile(output, quantiles[d, k])
    return biases


def test_the_fast_fit_draws_as_the_straightforward_one_and_agrees_to_rounding():
    torch.manual_seed(3)
    model = build_model("minirocket", 9, 6, width=2520)
    signals = torch.randn(300, 9, 128).cumsum(dim=2) * 0.1
    model.fit(signals, max_windows=200)
    # The same windows and quantile positions; the grouped and the plain convolution may add their
    # terms in another order (a CPU's choice), so a bias may differ by the rounding of one output
    # (about 1e-6 here), far less than a wrong window or position would move it.
    torch.testing.assert_close(model.biases, reference_biases(model, signals, max_windows=200), rtol=0, atol=1e-5)


def test_the_fast_transform_equals_the_straightforward_one_on_exact_outputs():
    torch.manual_seed(3)
    model = build_model("minirocket", 9, 6, width=2520)
    model.fit(torch.randn(300, 9, 128).cumsum(dim=2) * 0.1, max_windows=200)
    # Two whole chunks of the CPU's transform and a part of one. Whole numbers as signals: the
    # kernels' weights are whole too, so every convolution output is exact whatever order a CPU adds
    # in, and the features (comparisons with the biases) are equal on every machine, ties included.
    windows = torch.randint(-3, 4, (2 * TRANSFORM_CHUNK["cpu"] + 7, 9, 128)).cumsum(dim=2).float()
    # Outputs that meet a bias exactly count as not positive: tie the first bias of every kernel at
    # the first dilation to one output of the first window.
    tied = torch.nn.functional.conv1d(windows[:1], model.weights[0], padding=model.paddings[0])[0, :, 5]
    model.biases[0, :, 0] = -tied
    expected, threads = reference_transform(model, windows), torch.get_num_threads()
    try:
        for count in (1, 2):  # one thread, and a chunk per thread at a time
            torch.set_num_threads(count)
            assert torch.equal(model.transform(windows), expected)
            assert torch.equal(model.transform(windows, one_bias_at_a_time=False), expected)
            assert torch.get_num_threads() == count
    finally:
        torch.set_num_threads(threads)
    assert model.transform(windows[:0]).shape == (0, model.feature_mean.numel())


def test_a_pool_holds_exact_counts_in_the_narrowest_type_and_the_head_sees_the_same_floats():
    for steps, dtype in ((128, torch.uint8), (300, torch.uint16)):  # T' <= 255 fits a byte; 300 does not
        torch.manual_seed(4)
        model = build_model("minirocket", 3, 6, width=840, window_steps=steps).eval()
        model.fit(torch.randn(50, 3, steps).cumsum(dim=2) * 0.1)
        windows = torch.randn(2 * TRANSFORM_CHUNK["cpu"] + 5, 3, steps).cumsum(dim=2) * 0.1
        counts = model.pool_features(windows)
        assert counts.dtype == dtype and counts.element_size() < 4
        assert counts.float().max() > 255 if dtype == torch.uint16 else True  # the wider type is needed there
        # The straightforward PPV (a mean over each feature's T' positions), standardised: bit for bit.
        expected = (reference_transform(model, windows) - model.feature_mean) / model.feature_std
        assert torch.equal(model.from_counts(counts), expected)
        assert torch.equal(model.features(windows), expected)
        assert torch.equal(model(counts), model(windows))


def test_row_quantiles_equal_torch_quantile_row_by_row():
    rows, quantiles = torch.randn(20, 57), torch.rand(20, 5)
    quantiles[0] = torch.tensor([0.0, 1.0, 0.5, 0.25, 1e-7])  # the ends and exact order statistics
    expected = torch.stack([torch.quantile(row, q) for row, q in zip(rows, quantiles, strict=True)])
    found = row_quantiles(rows, quantiles)
    # The same order statistics and weights; lerp's vectorised and scalar loops may round an ulp apart.
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(found[0, :4], rows[0].sort().values[[0, 56, 28, 14]])  # order statistics: exact


def own_length_reference(model, window):
    """One window [C, L] transformed alone, dilation by dilation: the straightforward proportions, NaN
    where the kernel reaches beyond the window (an unpadded dilation with no output over it)."""
    features = []
    for d, (dilation, padding) in enumerate(zip(model.dilations, model.paddings, strict=True)):
        if window.shape[1] + 2 * padding - (KERNEL_LENGTH - 1) * dilation <= 0:
            features.append(torch.full((model.biases[d].numel(),), float("nan")))
            continue
        output = torch.nn.functional.conv1d(window[None], model.weights[d], padding=padding, dilation=dilation)[0]
        features.append((output[:, None, :] + model.biases[d][:, :, None] > 0).float().mean(dim=2).flatten())
    return torch.cat(features)


def padded_windows(lengths, channels=3, steps=128, seed=5):
    """Whole-number random walks of these lengths, padded with NaN to `steps`."""
    torch.manual_seed(seed)
    windows = torch.randint(-3, 4, (len(lengths), channels, steps)).cumsum(dim=2).float()
    for window, length in zip(windows, lengths, strict=True):
        window[:, length:] = float("nan")
    return windows


def test_a_padded_window_is_read_over_its_own_steps_as_if_transformed_alone():
    lengths = [128, 100, 64, 20, 9, *range(30, 128, 7)] * 10  # over two chunks of the CPU's transform
    windows = padded_windows(lengths)
    model = build_model("minirocket", 3, 6, width=840).eval()
    model.fit(windows, padded=True)
    assert model.padded and torch.isfinite(model.biases).all()
    assert torch.isfinite(model.feature_mean).all() and torch.isfinite(model.feature_std).all()
    # Whole numbers in and whole weights: the outputs are exact, so the proportions are equal bit for bit.
    expected = torch.stack([own_length_reference(model, window[:, :length])
                            for window, length in zip(windows[:20], lengths, strict=False)])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for one_bias_at_a_time in (True, False):
                found = model.transform(windows, one_bias_at_a_time=one_bias_at_a_time)[:20]
                assert torch.equal(found.isnan(), expected.isnan())
                assert torch.equal(found.nan_to_num(-1.0), expected.nan_to_num(-1.0))
    finally:
        torch.set_num_threads(threads)
    assert expected.isnan().any(), "a window of 9 steps has no outputs at the unpadded dilations"
    standardised = model.features(windows[:20])
    # A feature with no proportion is the mean: 0 once standardised.
    assert torch.equal(standardised == 0, expected.isnan() | (expected == model.feature_mean))
    # Its pool holds the features themselves, which the head takes as they are.
    pooled = model.pool_features(windows[:20])
    assert pooled.dtype == torch.float32 and torch.equal(pooled, standardised)
    assert torch.equal(model(pooled), model(windows[:20]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_padded_windows_take_the_torch_path_and_read_as_on_the_host():
    lengths = [128, 100, 64, 20, 9, *range(30, 128, 7)] * 4
    windows = padded_windows(lengths)
    model = build_model("minirocket", 3, 6, width=840).eval()
    model.fit(windows, padded=True)
    host = model.features(windows)
    gpu = build_model("minirocket", 3, 6, width=840).eval()
    gpu.load_state_dict(model.state_dict())  # the flag travels with the weights
    gpu = gpu.cuda()
    # Whole numbers and whole weights: every output is exact, in whatever order a GPU sums (and in TF32).
    spy = mock.patch("models.minirocket_fused.fused_counts") if triton_installed() else contextlib.nullcontext()
    with spy as kernel:
        found = gpu.features(windows.cuda()).cpu()
    assert gpu.padded and not (kernel and kernel.called)  # the fused kernel does not read padding
    assert torch.equal(found, host)


def test_training_windows_too_short_for_a_dilation_leave_its_features_at_the_mean():
    model = build_model("minirocket", 3, 6, width=840).eval()
    model.fit(padded_windows([20, 9, 15, 12] * 5), padded=True)  # no window reaches the widest dilations
    assert torch.isfinite(model.biases).all() and torch.isfinite(model.feature_std).all()
    features = model.features(padded_windows([128, 64, 12]))
    assert torch.isfinite(features).all()


def test_padded_reading_of_windows_without_padding_is_the_plain_one():
    windows = torch.randn(80, 3, 128).cumsum(dim=2) * 0.1
    plain, padded = (build_model("minirocket", 3, 6, width=840).eval() for _ in range(2))
    plain.fit(windows)
    padded.fit(windows, padded=True)
    assert not plain.padded and padded.padded
    assert torch.equal(padded.biases, plain.biases)
    torch.testing.assert_close(padded.feature_mean, plain.feature_mean)  # nanmean adds as mean does, to rounding
    torch.testing.assert_close(padded.feature_std, plain.feature_std)
    assert torch.equal(padded.transform(windows), plain.transform(windows))


def test_the_padding_flag_travels_with_the_weights_and_older_weights_have_none():
    model = build_model("minirocket", 3, 6, width=840)
    model.fit(padded_windows([128, 50, 90, 70]), padded=True)
    state = model.state_dict()
    assert bool(state["nan_padding"])
    fresh = build_model("minirocket", 3, 6, width=840)
    fresh.load_state_dict(state)
    assert fresh.padded
    older = {name: tensor for name, tensor in state.items() if name != "nan_padding"}
    fresh.load_state_dict(older)  # strict: an older checkpoint's weights still load
    assert not fresh.padded


def test_row_quantiles_of_each_rows_first_values():
    rows, quantiles = torch.randn(6, 40), torch.rand(6, 3)
    lengths = torch.tensor([40, 1, 2, 17, 39, 25])
    expected = torch.stack([torch.quantile(row[:length], q) for row, length, q in zip(rows, lengths, quantiles,
                                                                                       strict=True)])
    torch.testing.assert_close(row_quantiles(rows, quantiles, lengths), expected, rtol=1e-6, atol=1e-7)
