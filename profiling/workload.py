"""What the profiler times: the run the trainer builds from the same flags, and its TrainStep.

By default that is the step `python main.py` takes, recipe (augmentation, weight average, label
smoothing) and loss tally included; --bare-step times the step without them.
"""
import itertools
import tempfile
import time
from dataclasses import dataclass

from profiling.run_time import epoch_steps
from training.assembly import head_fit_of
from training.distributed.fsdp import sharded_units
from training.errors import UsageError
from training.loop.step import NO_TIMER
from training.loop.tally import EpochTally
from training.run_inputs import read_run_inputs
from training.trainer import Trainer

RECIPE_OFF = {"augment": "none", "ema_decay": 0.0, "label_smoothing": 0.0}


@dataclass
class Workload:
    strategy: object
    model: object  # bare: parameter count and gradient bytes
    step: object  # the run's training.loop.step.TrainStep
    precision: object
    batches: object  # endless iterator over this rank's shard, full batches only
    tally: object  # the run's EpochTally, or None for the bare step
    batch_size: int  # per GPU / process
    train_windows: int  # the whole training split, for the epoch-time estimate
    data_source: str
    scratch: object = None  # the run's scratch --save-dir, removed with the workload
    steps_taken: int = 0
    trainer: object = None  # the run itself: its evaluation passes and checkpoint are timed too
    inputs_s: float = 0.0  # reading the run's inputs, as main.py's time line counts them
    set_up_s: float = 0.0  # the strategy's start and Trainer.build (model, fit, pool), set by profiling.measure
    pool: dict = None  # the feature pool's build figures (training.pool.build.pool_figures), or None
    # Where main.py with the profiler's flags would solve the head by ridge (auto, a small split): the
    # profile is then of --head-fit adamw's steps, which that run never takes.
    ridge_in_main: bool = False

    @property
    def grad_accum_steps(self):
        return self.step.grad_accum_steps

    @property
    def global_samples_per_step(self):
        return self.batch_size * self.grad_accum_steps * self.strategy.world_size

    @property
    def num_parameters(self):
        return sum(p.numel() for p in self.model.parameters())

    @property
    def gradient_bytes(self):
        """What DDP all-reduces each step: one gradient per trainable parameter, in its dtype."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    @property
    def unit_bytes(self):
        """Parameter bytes of each unit FSDP would shard and gather on its own (training/distributed/fsdp.py)."""
        return [sum(p.numel() * p.element_size() for p in unit) for unit in sharded_units(self.model)]

    @property
    def steps_per_epoch(self):
        """Optimizer steps of one epoch of the full training split, with the sampler's padding."""
        return epoch_steps(self.train_windows, self.strategy.world_size, self.batch_size, self.grad_accum_steps)


def build_workload(args, strategy, data=None):
    """The trainer's run for the profiler's flags, in a scratch --save-dir that nothing resumes from;
    `data`: the run's data, when the caller has loaded it already."""
    if args.run.optim.head_fit == "ridge":
        raise UsageError("--head-fit ridge solves the head in closed form and takes no optimizer step to profile; "
                         "profile --head-fit adamw")
    scratch = tempfile.TemporaryDirectory(prefix="har-profile-")
    # The profiler times optimizer steps, so a small split that auto would solve by ridge is profiled
    # as the epochs would train it.
    config = args.run.replace(save_dir=scratch.name, resume=None, head_fit="adamw",
                              **(RECIPE_OFF if args.bare_step else {}))
    started = time.perf_counter()
    inputs = read_run_inputs(config, hold_lock=False, data=data)
    read = time.perf_counter()
    ridge_in_main = head_fit_of(args.run, len(inputs.data.train), strategy) == "ridge"
    trainer = Trainer.build(config, strategy, quiet=True, inputs=inputs)
    loader = trainer.loaders["train"]
    tally = None if args.bare_step else EpochTally(strategy.device)
    return Workload(strategy, trainer.model, trainer.step, trainer.precision,
                    _endless(loader, loader.sampler, trainer.loader_batch), tally, config.optim.batch_size,
                    len(trainer.data.train), trainer.data.source, scratch, trainer=trainer, inputs_s=read - started,
                    pool=trainer.pool_figures, ridge_in_main=ridge_in_main)


def _endless(loader, sampler, batch_size):
    """Full batches across epoch boundaries, reshuffled each epoch like training; the restart cost
    lands in the data wait of the step that crosses it, as it would in training. An epoch's
    shorter last batch is left out: samples/s counts every step as a full batch, and a new shape
    would be autotuned (cuDNN) inside the timed steps."""
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        full = 0
        for batch in loader:
            if len(batch[1]) == batch_size:
                full += 1
                yield batch
        if not full:
            raise UsageError(f"--batch-size {batch_size} is more than one process's share of the training split "
                             f"({len(sampler)} windows): lower it, or profile with more data")


def optimizer_step(work, sync_gradients, timer=NO_TIMER):
    """One optimizer step of the run's TrainStep. sync_gradients=False runs every micro-batch under
    DDP's no_sync(), i.e. the same step without the gradient all-reduce."""
    step, accum = work.step, work.step.grad_accum_steps
    work.steps_taken += 1
    for micro in range(accum):
        signals, labels = next(work.batches)
        step.accumulate(signals, labels, accum, sync=sync_gradients and micro == accum - 1, tally=work.tally,
                        step_number=work.steps_taken, timer=timer)
    step.update(timer)
