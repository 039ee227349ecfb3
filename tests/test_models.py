"""Every registered model maps [B, C, 128] to [B, 6] for each channel mode and norm."""
import inspect

import pytest
import torch

from conftest import TINY_DATA
from models import MODELS, NORMS, SIZE_KNOBS, build_model, count_parameters, label_smoothing_of
from models.contract import HARModel


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


def test_size_flags_reach_the_model():
    assert count_parameters(build_model("transformer", 9, 6, width=128, depth=2, ffn=256)) > \
        3 * count_parameters(build_model("transformer", 9, 6))
    assert count_parameters(build_model("cnn1d", 9, 6, width=256)) > 3 * count_parameters(build_model("cnn1d", 9, 6))
    studies = build_model("transformer", 9, 6, width=256, depth=4, heads=8, ffn=1024)
    assert len(studies.encoder.layers) == 4 and studies.encoder.layers[0].self_attn.num_heads == 8


def test_a_100m_parameter_transformer_builds_and_trains_a_step_on_cpu():
    torch.manual_seed(0)
    model = build_model("transformer", 9, 6, width=1024, depth=8, heads=16, ffn=4096)
    assert count_parameters(model) >= 100_000_000
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    before = model.head[-1].weight.detach().clone()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 9, 128)), torch.tensor([0, 1]))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(before, model.head[-1].weight)


def dropout_rates(model):
    return {module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)}


def test_without_a_dropout_rate_each_model_takes_its_own_and_a_given_rate_wins():
    from training.config.cli import parse_config

    assert parse_config([]).model.dropout is None  # the flag's default leaves the choice to the model
    assert dropout_rates(build_model("minirocket", 9, 6, width=84)) == {0.0}
    assert dropout_rates(build_model("cnn1d", 9, 6)) == {0.1}
    assert dropout_rates(build_model("minirocket", 9, 6, dropout=0.3, width=84)) == {0.3}
    assert dropout_rates(build_model("cnn1d", 9, 6, dropout=0.0)) == {0.0}


@pytest.mark.parametrize(("argv", "expected"), [([], 0.2), (["--label-smoothing", "0"], 0.0),
                                                ([*TINY_DATA], 0.1), ([*TINY_DATA, "--label-smoothing", "0.05"], 0.05)])
def test_without_a_label_smoothing_each_model_takes_its_own_and_a_given_one_wins(argv, expected, tmp_path):
    """The trainer's step smooths as the model says (minirocket's head 0.2, cnn1d 0.1) unless the
    flag is given, 0 included."""
    from training.config.cli import parse_config
    from training.distributed.strategy import make_strategy
    from training.trainer import Trainer

    config = parse_config(["--dataset", "synthetic", "--synthetic-windows-per-subject", "4", *argv,
                           "--save-dir", str(tmp_path), "--no-resume", "--feature-views", "0"])
    assert config.recipe.label_smoothing == (float(argv[-1]) if "--label-smoothing" in argv else None)
    trainer = Trainer.build(config, make_strategy(config), quiet=True)
    assert trainer.step.label_smoothing == expected


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_model_declares_its_fsdp_units_and_they_cover_every_parameter_once(name):
    from training.distributed.fsdp import sharded_units
    model = build_model(name, 9, 6, **({"depth": 3} if name == "transformer" else {}))
    units = sharded_units(model)
    assert len(units) == (3 + 1 if name == "transformer" else 1)  # one per encoder block, then the root's
    ids = [id(parameter) for unit in units for parameter in unit]
    assert sorted(ids) == sorted(id(parameter) for parameter in model.parameters())


def test_every_model_declares_the_contract_and_takes_only_known_size_flags():
    for name, model in MODELS.items():
        assert issubclass(model, HARModel), name
        assert set(model.SIZES) <= set(SIZE_KNOBS), name
        # build_model's call: the keywords resolve_size returns must bind, named or through **size.
        inspect.signature(model).bind(3, 2, dropout=0.1, norm="batch", **model.resolve_size())


def test_a_model_that_declares_nothing_is_built_as_the_contract_says(monkeypatch):
    class Plain(HARModel):
        def __init__(self, in_channels, num_classes, dropout, norm):
            super().__init__()
            self.dropout, self.head = dropout, torch.nn.Linear(in_channels, num_classes)

    monkeypatch.setitem(MODELS, "plain", Plain)
    model = build_model("plain", 3, 2)  # no window_steps: it does not take them
    assert model.dropout == HARModel.DROPOUT and label_smoothing_of("plain") == HARModel.LABEL_SMOOTHING
    assert model.fsdp_blocks() == [] and not Plain.FITS_TO_DATA and model.fit(torch.zeros(1, 3, 8)) is None
