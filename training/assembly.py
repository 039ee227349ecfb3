"""The parts Trainer.build (training/trainer.py) assembles a run from: the data normalised, how the head is
fitted and whether DDP's ranks replicate it, the model built, fitted and wrapped, the training batches and the
splits' loaders (over a feature pool where the model's features are fixed), the peak LR and the positioned LR
schedule. The profiler asks two of the same questions (head_fit_of, replicates_the_head), so it measures what a
run trains.
"""
import dataclasses
import time

import numpy as np
import torch

from data.loaders import LoaderRequest, split_loaders
from data.splits import fit_normalization, normalize
from models import MODELS, count_parameters, feature_views_of, resolve_size, training_bytes
from training.checkpoint.format import SavedRun
from training.config.settings import DEFAULT_LR
from training.distributed.strategy import free_bytes
from training.errors import UsageError
from training.loop.recipe import build_augmenter, build_weight_average
from training.loop.ridge_head import RIDGE_LIMIT_WINDOWS, RIDGE_MAX_WINDOWS, NothingToStep
from training.loop.step import (
    Precision,
    build_adamw,
    build_scheduler,
    compile_for_training,
    global_batch_size,
    lr_line,
    scaled_lr,
    scaling_warning,
    steps_per_epoch,
)
from training.loop.step_graph import records_step_graph
from training.pool.build import PoolPlan, build_feature_pool, feature_store_root, wants_feature_pool
from training.reporting.logger import GIB

EVAL_BATCH_MIN = 256


def normalize_data(data, checkpoint, log):
    """The splits, normalised with the training split's statistics (a resumed run keeps its own)."""
    log.info(data.description)
    if checkpoint is not None:  # held against this run by run_inputs.py (checkpoint/judge.py)
        saved = SavedRun.of(checkpoint).normalization
        mean, std = saved["mean"].numpy(), saved["std"].numpy()
    elif data.normalization is not None:
        mean, std = data.normalization  # a store's, gathered when it was built: no pass over the data here
    else:
        mean, std = fit_normalization(data.train.signals, data.padded)
    data = dataclasses.replace(data, **{name: normalize(getattr(data, name), mean, std)
                                        for name in ("train", "val", "test")})
    return data, {"mean": torch.from_numpy(mean), "std": torch.from_numpy(std)}


def resolve_head_fit(head_fit, model_class, pooled, train_windows, strategy):
    """'ridge' or 'adamw': what --head-fit asks for, auto resolved by the training split's size. Ridge
    needs a linear head over a feature pool (`pooled`: --feature-views above 0), in memory or on disk,
    and the whole head on every rank."""
    solvable = model_class.LINEAR_HEAD and pooled and strategy.name != "fsdp"
    if head_fit == "adamw" or (head_fit == "auto" and not solvable):
        return "adamw"
    if head_fit == "ridge":
        if not solvable:
            linear = ", ".join(name for name, model in MODELS.items() if model.LINEAR_HEAD)
            raise UsageError("--head-fit ridge solves a linear head over pooled features, the whole head on "
                             f"every rank ({linear}, with --feature-views above 0, not under FSDP); use --head-fit "
                             "adamw")
        if train_windows > RIDGE_LIMIT_WINDOWS:
            raise UsageError(f"--head-fit ridge solves over every pair of training windows: {train_windows:,} is more "
                             f"than the {RIDGE_LIMIT_WINDOWS:,} it takes; use --head-fit adamw (or auto)")
        return "ridge"
    return "ridge" if train_windows <= RIDGE_MAX_WINDOWS else "adamw"


def head_fit_of(config, train_windows, strategy):
    """How a run of `config` fits its head: 'ridge' or 'adamw', --head-fit resolved for a training split
    of `train_windows` (the profiler asks too: it times steps, which a head solved by ridge never takes)."""
    return resolve_head_fit(config.optim.head_fit, MODELS[config.model.name],
                            feature_views_of(config.model.name, config.recipe.feature_views) > 0, train_windows,
                            strategy)


def head_fit_and_augmenter(config, data, normalization, strategy, log):
    """How the head is fitted ('ridge' or 'adamw', --head-fit resolved for this data) and the batch
    augmenter: none for a head solved by ridge, which sees the windows as they are in one view."""
    head_fit = head_fit_of(config, len(data.train), strategy)
    if head_fit == "ridge":
        return head_fit, None
    augment = build_augmenter(config.recipe, normalization, data.channel_names, data.class_names, log.warn,
                              data.sensor_triples(), data.padded)
    return head_fit, augment if augment is None else augment.to(strategy.device)


# The smallest validation split the recipe is chosen on: fewer windows, or one person, would choose by
# the luck of a few windows (training/loop/recipe_choice.py).
MIN_CHOICE_WINDOWS, MIN_CHOICE_PEOPLE = 100, 2


def why_not_refit(config, strategy, data):
    """None when this run trains its final model on every training person, else why it keeps the
    validated one: a line for the log, or '' where nothing needs saying (asked for, or nobody held out)."""
    if config.optim.final_model == "validated" or len(data.val) == 0:
        return ""
    if not _pool_in_memory(config, data):
        return ("best.pt holds the weights validation chose: only a head trained over a feature pool in memory is "
                "trained again on every training person (--final-model validated keeps them without this line)")
    if strategy.name == "fsdp":
        return "best.pt holds the weights validation chose: under fsdp the head is not trained again on every person"
    return None


def why_not_choose(config, strategy, data, head_fit, augment):
    """None when the validation people choose the recipe (training/loop/recipe_choice.py), else why
    not: a line for the log, or '' where there is nothing to choose between (asked for, no augmented
    views, no pool in memory, a head solved by ridge)."""
    views = min(feature_views_of(config.model.name, config.recipe.feature_views), config.optim.epochs)
    if (config.recipe.recipe_choice == "fixed" or head_fit != "adamw" or augment is None or views < 2
            or not _pool_in_memory(config, data) or strategy.name == "fsdp" or len(data.val) == 0):
        return ""
    people = len(np.unique(data.val.subjects))
    if len(data.val) < MIN_CHOICE_WINDOWS or people < MIN_CHOICE_PEOPLE:
        return (f"recipe: {len(data.val)} validation windows of {people} person(s) are too few to choose on (at least "
                f"{MIN_CHOICE_WINDOWS} of {MIN_CHOICE_PEOPLE} people): the augmentations as set "
                f"({augmentations_of(augment)}) are kept")
    return None


def pool_head_plan(config, strategy, data, head_fit, augment, log, checkpoint=None):
    """(whether the final model trains on every training person, whether the validation people choose
    the recipe), each said in one line where the run cannot do it and the settings did not say so. A
    resumed run begun before either existed does neither (its `checkpoint` says so)."""
    if checkpoint is not None and SavedRun(checkpoint).predates_the_final_model():
        log.info("this run began before --final-model and --recipe-choice: it ends on its validated weights and "
                 "its recipe as set, as it would have then")
        return False, False
    why_not = why_not_refit(config, strategy, data), why_not_choose(config, strategy, data, head_fit, augment)
    for line in why_not:
        if line:
            log.info(line)
    return why_not[0] is None, why_not[1] is None


def first_weights(model):
    """Copies of the model's parameters as they are before its first step (a resumed run's too: its
    checkpoint is restored later), which a head trained again starts from."""
    return [parameter.detach().clone() for parameter in model.parameters()]


def augmentations_of(augment):
    """The augmentations a batch augmenter applies, comma-separated ('none' without one)."""
    return ",".join(augment.config.kinds) if augment is not None else "none"


def _pool_in_memory(config, data):
    """Whether the run's model trains over a feature pool held in memory (not a window store's, on disk)."""
    pooled = wants_feature_pool(MODELS[config.model.name], feature_views_of(config.model.name,
                                                                            config.recipe.feature_views))
    splits = {"train": data.train, "val": data.val, "test": data.test}
    return pooled and feature_store_root(config.save_dir, splits) is None


def replicates_the_head(config, head_fit):
    """Whether DDP's ranks would train replicas of this run's model, each stepping the whole global
    batch (--pool-head replicated): a head trained by steps over a feature pool, which every rank
    holds whole."""
    model_class, views = MODELS[config.model.name], feature_views_of(config.model.name, config.recipe.feature_views)
    return config.parallel.pool_head == "replicated" and head_fit == "adamw" and wants_feature_pool(model_class, views)


def replicates_under_ddp(config, strategy, head_fit, log):
    """replicates_the_head under DDP on 2+ ranks; tells the strategy before it wraps the model."""
    if not (strategy.name == "ddp" and strategy.world_size > 1 and replicates_the_head(config, head_fit)):
        return False
    strategy.replicate_model()
    if config.parallel.grad_compression != "none":
        log.warn(f"--grad-compression {config.parallel.grad_compression} compresses nothing here: the head's "
                 "replicas exchange no gradients (--pool-head ddp all-reduces them)")
    return True


def training_batches(batch_size, strategy, replicated):
    """(the ranks a training batch is dealt over, the samples each process loads per micro-batch).
    DataParallel splits one loader batch over its GPUs; DDP ranks each load their own share of the
    global batch, or all of it when each steps it (a replicated head)."""
    batch_ranks = 1 if replicated else strategy.world_size
    return batch_ranks, batch_size * strategy.data_parallel_size // batch_ranks


def loader_request(config, strategy, loader_batch, replicated=False):
    """What this rank asks of its loaders (data.loaders.LoaderRequest): training batches of `loader_batch`
    samples, evaluation batches of at least EVAL_BATCH_MIN, this rank's share of each epoch's order, or
    all of it when `replicated` (a replicated head), read as --data-path and --num-workers say."""
    return LoaderRequest(train_batch=loader_batch, eval_batch=max(EVAL_BATCH_MIN, loader_batch),
                         device=strategy.device, world_size=strategy.world_size, rank=strategy.rank,
                         seed=config.optim.seed, data_path=config.hardware.data_path,
                         num_workers=config.hardware.num_workers, whole_training_batches=replicated)


def build_loaders(config, data, model, augment, request, strategy, log):
    """The splits' loaders as `request` (loader_request) asks, over a feature pool where the model's
    features are fixed, the augmenter the step applies (None when the pool's views carry the
    augmentation), the pool's build figures (None without a pool), and the splits the loaders read
    (the pool's, or the windows)."""
    optim = config.optim
    splits, train_views, figures = {"train": data.train, "val": data.val, "test": data.test}, 1, None
    views = feature_views_of(config.model.name, config.recipe.feature_views)
    if wants_feature_pool(model, views):
        # Epoch e trains on view e mod V, so a run of fewer epochs than views never reaches the
        # last ones: they are not built.
        views = min(views, optim.epochs)
        figures = {}
        plan = PoolPlan(views=views, augment=augment, seed=optim.seed,
                        store_root=feature_store_root(config.save_dir, splits),
                        viewed_too=("val",) if why_not_refit(config, strategy, data) is None else ())
        splits, train_views = build_feature_pool(model, splits, plan, strategy, log, figures)
        augment = None
    # On a CPU a pool on disk reaches the step as features, turned from counts by the store's reader
    # thread: the step's first operation, done beside it (about an eighth of a step, docs/performance.md).
    # A GPU takes the counts, a quarter of the features' bytes, and turns them itself in microseconds.
    convert = model.from_counts if figures is not None and strategy.device.type == "cpu" else None
    loaders, data_path = split_loaders(splits, dataclasses.replace(request, train_views=train_views, convert=convert))
    log.info(f"data path: {data_path}")
    return loaders, augment, figures, splits


def build_run_model(config, data, strategy, log, checkpoint=None):
    """The bare model (what checkpoints hold), the same wrapped and maybe compiled (what the step
    calls), the run's precision, and the weight average (None when off), copied before the strategy
    lays the model out and then laid out the same way. A model fitted to data takes a resumed run's
    fitted parts from its `checkpoint`."""
    settings, sizes = config.model, config.model.size()
    _, channels, window_steps = data.train.signals.shape
    # Sizes whose model cannot fit are refused before anything that size is allocated.
    need = training_bytes(settings.name, channels, len(data.class_names), window_steps=window_steps, **sizes)
    free = free_bytes(strategy.device)
    if free is not None and need > free:
        given = "".join(f" --{knob} {value}" for knob, value in sizes.items() if value is not None)
        raise UsageError(f"--model {settings.name}{given} needs about {need / GIB:,.1f} GiB to train "
                         f"(weights, gradients and AdamW's state) and {strategy.device} has {free / GIB:,.1f} GiB "
                         "free; use smaller size flags")
    torch.manual_seed(config.optim.seed)  # identical initial weights on every rank
    # Built and fitted on the host, then moved: a fit is a few hundred small operations on 512 windows
    # (0.2 s on the host against 1.2 to 3.9 s on an H200, which tuned a convolution per dilation first).
    model = settings.build(channels, len(data.class_names), window_steps)
    if model.FITS_TO_DATA and checkpoint is not None:
        # A resumed run's own fixed parts, before anything is computed from them (the feature pool):
        # fitted again, they would differ wherever this run's training windows differ from its.
        saved = SavedRun.of(checkpoint).weights
        model.load_state_dict({name: saved[name] for name, _ in model.named_buffers() if name in saved}, strict=False)
        log.info(f"took {settings.name}'s fixed parts from the checkpoint")
    elif model.FITS_TO_DATA:
        # Fixed parts that depend on the data (MiniRocket's biases), set once from the training
        # windows (in memory or a store's), before the weight average copies the model.
        started = time.perf_counter()
        model.fit(data.train.signals, padded=data.padded)
        log.info(f"fitted {settings.name}'s fixed parts to the training windows in "
                 f"{time.perf_counter() - started:.1f} s")
    model = model.to(strategy.device)
    gradient_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    size = ", ".join(f"{knob} {value}" for knob, value in resolve_size(settings.name, **sizes).items())
    ema = build_weight_average(config.recipe, model)
    precision = Precision(strategy.device, config.optim.amp, config.optim.amp_dtype)
    train_model = compile_for_training(strategy.wrap(model, precision), config.hardware)
    if ema is not None:
        strategy.shard_like(ema.module)
        ema.weights = strategy.module_state(ema.module)
    log.info(f"run: {strategy.describe()} | model {config.model.name} ({size}): {count_parameters(model):,} "
             f"parameters, {gradient_mb:.2f} MB of gradients per step | {precision.describe()}"
             f"{' | deterministic algorithms' if config.hardware.deterministic else ''}")
    return model, train_model, precision, ema


def build_optimizer(config, model, strategy, precision, head_fit, peak_lr, log):
    """(the optimizer, whether the step is recorded as a CUDA graph): AdamW at `peak_lr`, capturable
    where the step records; a head solved by ridge takes no step and gets NothingToStep."""
    record_graph = records_step_graph(config.hardware.cuda_graphs, model, strategy, precision,
                                      config.optim.grad_accum_steps, config.hardware.compile, log.warn)
    if head_fit == "ridge":
        return NothingToStep(), record_graph
    return build_adamw(model, peak_lr, config.optim.weight_decay, strategy.device, capturable=record_graph), \
        record_graph


def position_schedule(optimizer, optim, micro_batches_per_epoch, state, global_batch, log):
    """Warmup then cosine, a pure function of the step, positioned from the train state: a resumed run
    that changed the global batch re-lays it in its own steps, said in the log."""
    steps_each_epoch = steps_per_epoch(micro_batches_per_epoch, optim.grad_accum_steps)
    total_steps = steps_each_epoch * optim.epochs
    warmup_steps = round(optim.planned_warmup_epochs * steps_each_epoch)
    log.info(f"lr schedule: warmup {warmup_steps} of {total_steps} steps ({steps_each_epoch} per epoch), then "
             "cosine to 0")
    return build_scheduler(optimizer, warmup_steps, total_steps, state.schedule_step(steps_each_epoch, global_batch))


# A run begun before --lr-reference-batch keeps scaling its LR against its per-GPU batch to its end
# (its checkpoints say so under PER_GPU_RULE_KEY), so no running schedule changes.
PER_GPU_RULE_NOTE = (" (this run began before --lr-reference-batch: its LR keeps scaling against its per-GPU batch, "
                     "as it did then)")


def peak_lr_of(optim, checkpoint, replicas, head_fit, log):
    """(the peak LR, whether it follows the per-GPU rule of a run begun before the reference batch), with
    its arithmetic in the log (and a warning far above the default's); a head solved by ridge has none."""
    reference_batch, per_gpu_rule = _lr_reference_batch(optim, checkpoint)
    split = (optim.batch_size, replicas, optim.grad_accum_steps)
    global_batch = global_batch_size(*split)
    peak_lr = scaled_lr(optim.lr, optim.lr_scaling, global_batch, reference_batch)
    lr_warning = scaling_warning(optim.lr, optim.lr_scaling, global_batch, reference_batch, DEFAULT_LR)
    if lr_warning:
        log.warn(lr_warning)
    if head_fit != "ridge":
        log.info("lr: " + lr_line(optim.lr, optim.lr_scaling, reference_batch, peak_lr, split)
                 + (PER_GPU_RULE_NOTE if per_gpu_rule else ""))
    return peak_lr, per_gpu_rule


def _lr_reference_batch(optim, checkpoint):
    """(the global batch --lr is meant for, whether that is the per-GPU batch of a run begun before the
    reference batch existed)."""
    per_gpu_rule = checkpoint is not None and SavedRun(checkpoint).lr_scales_by_per_gpu_batch()
    return (optim.batch_size if per_gpu_rule else optim.lr_reference_batch), per_gpu_rule
