"""Rank-0 output: console lines, the tqdm bar, TensorBoard and metrics.jsonl. A no-op elsewhere."""
import json
import sys
from pathlib import Path

from tqdm import tqdm

from training.reporting.memory import format_memory


class RunLogger:
    """Every write of a run goes through here, so `enabled=False` (ranks > 0) silences them all."""

    def __init__(self, save_dir, enabled):
        self.enabled = enabled
        self.save_dir = Path(save_dir)
        self._writer = None
        self.metrics_mode = "a"  # a resumed run goes on with its lines; a fresh one sets "w" (start_fresh)

    def start_fresh(self):
        """The run starts at epoch 0: its first epoch line replaces a metrics.jsonl left by an
        earlier run in the folder (--no-resume), so that summaries never count epochs twice."""
        self.metrics_mode = "w"

    def info(self, message):
        if self.enabled:
            print(message, flush=True)

    def warn(self, message):
        if self.enabled:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def progress(self, total, description):
        # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs, pipes).
        return tqdm(total=total, desc=description, leave=False, dynamic_ncols=True,
                    disable=None if self.enabled else True)

    def log_step(self, global_step, train_loss, lr):
        if self.enabled:
            self._tensorboard().add_scalar("train/loss_running", train_loss, global_step)
            self._tensorboard().add_scalar("train/lr", lr, global_step)

    def log_epoch(self, record, is_best):
        """Append one JSON line, write TensorBoard scalars and print the epoch summary."""
        if not self.enabled:
            return
        with open(self.save_dir / "metrics.jsonl", self.metrics_mode) as handle:
            handle.write(json.dumps(record) + "\n")
        self.metrics_mode = "a"
        writer, epoch = self._tensorboard(), record["epoch"]
        for key in ("train_loss", "val_loss", "val_acc", "val_macro_f1", "lr", "samples_per_s", "epoch_time_s"):
            if record[key] is not None:  # no validation figures under --val-fraction 0
                writer.add_scalar(f"epoch/{key}", record[key], epoch)
        for entry in record["memory"]:
            for key, value in entry.items():
                if key != "device":
                    writer.add_scalar(f"memory/{entry['device']}/{key}", value, epoch)
        writer.flush()
        validation = "no validation" if record["val_loss"] is None else (
            f"val loss {record['val_loss']:.4f} acc {record['val_acc']:.4f} F1 {record['val_macro_f1']:.4f}"
            f"{' *' if is_best else ''}")
        print(f"epoch {epoch}/{record['epochs']} | train loss {record['train_loss']:.4f} | {validation} | "
              f"lr {record['lr']:.2e} | {record['samples_per_s']:,.0f} samples/s | "
              f"{record['epoch_time_s']:.1f} s | {format_memory(record['memory'])}", flush=True)

    def write_json(self, name, payload):
        if self.enabled:
            with open(self.save_dir / name, "w") as handle:
                json.dump(payload, handle, indent=2)

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def _tensorboard(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # slow import, only on rank 0
            self._writer = SummaryWriter(log_dir=str(self.save_dir / "logs"))
        return self._writer
