"""The typed run configuration: one field per flag, grouped as --help groups them, plain data both ways."""
from dataclasses import fields

import pytest

from training.config.cli import build_parser, parse_config
from training.config.settings import RunConfig

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
