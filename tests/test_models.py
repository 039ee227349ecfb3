"""Every registered model maps [B, C, 128] to [B, 6] for each channel mode and norm."""
import pytest
import torch

from models import MODELS, NORMS, build_model, count_parameters


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("in_channels", [9, 3])
@pytest.mark.parametrize("norm", NORMS)
def test_forward_shape(name, in_channels, norm):
    model = build_model(name, in_channels, 6, dropout=0.1, norm=norm).eval()
    with torch.no_grad():
        assert model(torch.randn(5, in_channels, 128)).shape == (5, 6)


def test_default_model_is_about_100k_parameters():
    assert 80_000 <= count_parameters(build_model("cnn1d", 9, 6)) <= 120_000


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_reach_every_parameter(name):
    model = build_model(name, 9, 6, norm="group")
    model(torch.randn(4, 9, 128)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_group_norm_output_does_not_depend_on_the_batch():
    model = build_model("cnn1d", 9, 6, dropout=0.0, norm="group").train()
    batch = torch.randn(8, 9, 128)
    torch.testing.assert_close(model(batch)[:4], model(batch[:4]))


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", 9, 6)
    with pytest.raises(ValueError, match="unknown norm"):
        build_model("cnn1d", 9, 6, norm="instance")
