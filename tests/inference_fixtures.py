"""Small checkpoints and recordings for the predict / export tests, made in milliseconds."""
import numpy as np
import torch

from data.splits import channel_names
from data.uci_har import CLASS_NAMES
from models import build_model

RATE_HZ = 50.0


def make_checkpoint(path, model="cnn1d", mode="flatten", window_steps=128, seed=0, **overrides):
    """A checkpoint with the keys training writes that predict.py reads, random but fixed weights,
    and BatchNorm statistics and normalisation away from identity so that mistakes show."""
    torch.manual_seed(seed)
    names = channel_names(mode)
    net = build_model(model, len(names), len(CLASS_NAMES), dropout=0.0)
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
    rng = np.random.default_rng(seed)
    state = {
        "model": net.state_dict(),
        "config": {"model": model, "mode": mode, "norm": "batch", "dropout": 0.0, "seed": 42, "val_fraction": 0.3},
        "normalization": {"mean": torch.from_numpy(rng.normal(0, 0.3, len(names)).astype(np.float32)),
                          "std": torch.from_numpy(rng.uniform(0.2, 0.6, len(names)).astype(np.float32))},
        "class_names": list(CLASS_NAMES), "channel_names": list(names),
        "in_channels": len(names), "num_classes": len(CLASS_NAMES),
        "sample_rate_hz": RATE_HZ, "window_steps": window_steps, "preprocessing": "uci-har",
    }
    state.update(overrides)
    state = {key: value for key, value in state.items() if value is not None}  # None: leave the key out
    torch.save(state, path)
    return path


def synthetic_stream(duration_s, rate_hz=RATE_HZ, seed=0):
    """(time_s [n], acc_g [n, 3], gyro_rad_s [n, 3]): gravity slowly turning, a gait-like
    2 Hz motion switched on and off, and noise; smooth enough to resample."""
    rng = np.random.default_rng(seed)
    time_s = np.arange(int(round(duration_s * rate_hz))) / rate_hz
    tilt = 0.3 * np.sin(2 * np.pi * time_s / 40.0)
    gravity = np.stack([np.cos(tilt), np.sin(tilt), 0.1 * np.ones_like(tilt)], axis=1)
    moving = (np.sin(2 * np.pi * time_s / 20.0) > 0).astype(float)[:, None]
    gait = 0.3 * np.stack([np.sin(2 * np.pi * 2.0 * time_s + phase) for phase in (0, 1, 2)], axis=1)
    acc = gravity + moving * gait + 0.01 * rng.standard_normal((len(time_s), 3))
    gyro = moving * 0.5 * np.stack([np.cos(2 * np.pi * 2.0 * time_s + phase) for phase in (0, 1, 2)], axis=1)
    return time_s, acc, gyro + 0.01 * rng.standard_normal((len(time_s), 3))


def write_csv(path, time_s, acc, gyro, header=None):
    """A recording CSV; time_s or gyro None leaves those columns out; `header` replaces the names."""
    columns = {"time_s": time_s, "acc_x": acc[:, 0], "acc_y": acc[:, 1], "acc_z": acc[:, 2]}
    if gyro is not None:
        columns.update({"gyro_x": gyro[:, 0], "gyro_y": gyro[:, 1], "gyro_z": gyro[:, 2]})
    columns = {name: values for name, values in columns.items() if values is not None}
    rows = np.stack([np.asarray(values, dtype=np.float64) for values in columns.values()], axis=1)
    np.savetxt(path, rows, delimiter=",", header=",".join(header or columns), comments="", fmt="%.9g")
    return path
