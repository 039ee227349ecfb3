"""What every model of the registry declares, with the value a model that says nothing gets: the
registry, the trainer, the feature pool and FSDP read these, and never probe a model for them."""
from torch import nn


class HARModel(nn.Module):
    """Windows [B, C, T] in, logits [B, classes] out. A model overrides what differs from here.

    models.build_model calls every constructor alike: (in_channels, num_classes, dropout=, norm=, window_steps=
    where TAKES_WINDOW_STEPS, and the size keywords resolve_size returns)."""
    SIZES = ()  # the size flags it takes (of models.SIZE_KNOBS), passed to resolve_size as keywords
    DROPOUT = 0.1  # when --dropout is not given
    LABEL_SMOOTHING = 0.1  # when --label-smoothing is not given
    TAKES_WINDOW_STEPS = False  # True: built with window_steps, as its layout depends on the window's length
    # True: its features do not learn, so a feature pool (training/pool/) can hold them, computed once through
    # the pool hooks below; forward then also takes a pool's rows [B, F] (pool_features, or from_counts of them).
    FIXED_FEATURES = False
    FEATURE_VIEWS = 0  # when --feature-views is not given: views of the training windows pooled once (FIXED_FEATURES)
    FITS_TO_DATA = False  # True: fit(signals) sets parts from the training windows before training
    # True: its buffers are all set before training (fit) and never change in it, so the weight average
    # takes them once with its copy instead of folding them in at every step.
    FIXED_BUFFERS = False
    # True: it takes windows of unequal lengths, each padded at its end with NaN (fit(..., padded=True)),
    # and reads each over its own steps; other models are refused such data.
    READS_NAN_PADDING = False
    padded = False  # whether its fixed parts were fitted to windows padded with NaN (an instance's, once fitted)
    LINEAR_HEAD = False  # True: head[-1] is one nn.Linear over the FIXED_FEATURES, which ridge regression can solve
    # True: its whole training step was shown on a GPU to record as one CUDA graph and to train as the
    # eager step does (tests/test_cuda.py), so CUDA runs record it unless --no-cuda-graphs.
    STEP_RECORDS = False

    @staticmethod
    def resolve_size(**size):
        """The constructor's size keywords with defaults filled in; ValueError for sizes it cannot build."""
        return size

    def fit(self, signals, padded=False):
        """Set the parts that depend on the data from training windows [N, C, T] (FITS_TO_DATA);
        `padded`: the data's windows end in NaN padding (READS_NAN_PADDING)."""

    # The pool hooks: all that the feature pool, its loaders and the ridge head read of a FIXED_FEATURES model.

    def pool_features(self, windows):
        """Windows [B, C, T] -> what a feature pool holds of each [B, F] (in any type: the pool keeps
        it, and from_counts turns it into the head's input), with no gradient. The pool calls it on
        pieces of up to 1,024 windows that start at multiples of 1,024 (training/pool/shares.py), on
        each rank its own: where a window's row depends on the batch it is computed in, batches that
        divide 1,024 keep the pool the ranks share out the one-process pool, bit for bit."""
        raise NotImplementedError(f"{type(self).__name__} has no fixed features to pool (FIXED_FEATURES)")

    def from_counts(self, stored):
        """A pool's rows [B, F] -> the head's input, the floats the windows themselves give, bit for
        bit; rows already turned (a pool's reader may do it beside the step) come back as they are.
        By default the pool holds the head's input itself."""
        return stored

    def pool_identity_parts(self):
        """What decides pool_features beside the windows (tensors, arrays, or text): a pool on disk
        digests it into its identity, so a model changed builds a pool of its own and an unchanged one
        reuses it. By default the persistent buffers, the fixed parts of a model whose only learnt
        parameters are its head's."""
        learnt = {name for name, _ in self.named_parameters()}
        return [tensor for name, tensor in self.state_dict().items() if name not in learnt]

    def prepare_pool(self, windows, say):
        """Before a feature pool of `windows` windows is built on this model's device (FIXED_FEATURES):
        a model may get ready for that many; `say` takes a line for the run's log."""

    def fsdp_blocks(self):
        """The submodules FSDP shards as units of their own; none: the whole model is the root's unit."""
        return []
