"""The typed run configuration: one field per flag holding its default and help, grouped as --help groups them,
plain data both ways, one validate()."""
from dataclasses import fields

import pytest

from training.config.cli import build_parser, parse_config
from training.config.settings import RunConfig
from training.errors import UsageError

# argparse group title -> RunConfig group
GROUPS = {"multi-GPU": "parallel", "hardware": "hardware", "data": "data", "model": "model",
          "generalisation to new people": "recipe", "optimisation": "optim", "checkpoints and logging": "output"}
NOT_SETTINGS = {"config", "debug"}  # where the settings came from, and how errors are shown


def test_every_flag_is_one_field_of_the_group_it_is_listed_under():
    parser = build_parser(multi_gpu=True)
    for group in parser._action_groups:  # argparse keeps no public list of its groups
        if group.title not in GROUPS:
            continue
        dests = {action.dest for action in group._group_actions} - NOT_SETTINGS
        kind = next(f.type for f in fields(RunConfig) if f.name == GROUPS[group.title])
        assert {f.metadata.get("flag", f.name) for f in fields(kind)} == dests, group.title


def test_flags_round_trip_as_plain_data():
    config = parse_config(["--batch-size", "8", "--gpu-ids", "0,1", "--val-subjects", "3,5"], multi_gpu=True)
    flags = config.flags()
    assert flags["batch_size"] == 8 and flags["model"] == config.model.name
    assert all(isinstance(value, (str, int, float, bool, list, type(None))) for value in flags.values())
    assert RunConfig.from_flags(flags) == config


def test_replace_names_flags_and_refuses_others():
    config = parse_config(["--epochs", "3"])
    changed = config.replace(epochs=5, model="cnn1d")
    assert (changed.optim.epochs, changed.model.name, config.optim.epochs) == (5, "cnn1d", 3)
    with pytest.raises(TypeError, match="epoch"):
        config.replace(epoch=5)


def test_the_dataclasses_hold_the_defaults_the_command_line_gives():
    assert parse_config([]) == RunConfig()
    assert parse_config([], multi_gpu=True) == RunConfig()
    assert RunConfig().validate() == RunConfig()  # the defaults are already canonical


def test_flag_types_come_from_the_fields():
    config = parse_config(["--aug-rotate-deg", "7.5", "--dist-timeout", "30", "--warmup-epochs", "0.5",
                           "--width", "840", "--no-figures", "--no-amp"])
    assert (config.recipe.aug_rotate_deg, config.hardware.dist_timeout, config.optim.warmup_epochs) == (7.5, 30.0, 0.5)
    assert config.model.width == 840 and config.output.figures is False and config.optim.amp is False


def test_a_saved_run_missing_newer_settings_takes_their_defaults():
    saved = {key: value for key, value in parse_config(["--epochs", "3"]).flags().items()
             if key not in ("feature_views", "dropout")}
    config = RunConfig.from_flags(saved)
    assert config.optim.epochs == 3
    assert (config.recipe.feature_views, config.model.dropout) == (RunConfig().recipe.feature_views, None)


def test_validate_writes_canonical_text_and_refuses_in_one_line():
    config = RunConfig().replace(augment="shift, rotate", aug_flip_classes="laying, sitting", compile_mode="default")
    checked = config.validate()
    assert (checked.recipe.augment, checked.recipe.aug_flip_classes) == ("rotate,shift", "LAYING,SITTING")
    assert checked.hardware.compile is True and config.hardware.compile is False  # a copy; the original stays
    with pytest.raises(UsageError, match="^--epochs must be at least 1, got 0$"):
        RunConfig().replace(epochs=0).validate()


def test_derived_values_are_properties_of_the_config():
    config = parse_config(["--epochs", "5"])
    assert config.optim.planned_warmup_epochs == 1.0  # a fifth of a 5-epoch run, under the 2-epoch default
    assert str(config.save_dir) == "checkpoints/single"
    assert config.replace(multi_gpu="ddp").save_dir.name == "ddp"
    assert config.data_options(dataset="npz")["dataset"] == "npz" and config.data_options()["split_seed"] == 42


def test_a_config_builds_its_model_one_way():
    import torch
    config = parse_config(["--model", "transformer", "--width", "32", "--depth", "1", "--heads", "2"])
    torch.manual_seed(0)
    model = config.model.build(9, 6)
    assert len(model.encoder.layers) == 1 and model.head[-1].in_features == 32
    assert RunConfig.from_flags(config.flags()).model.build(9, 6).state_dict().keys() == model.state_dict().keys()
