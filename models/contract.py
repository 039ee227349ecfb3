"""What every model of the registry declares, with the value a model that says nothing gets: the
registry, the trainer, the feature pool and FSDP read these, and never probe a model for them."""
from torch import nn


class HARModel(nn.Module):
    """Windows [B, C, T] in, logits [B, classes] out. A model overrides what differs from here."""
    SIZES = ()  # the size flags it takes (of models.SIZE_KNOBS), passed to resolve_size as keywords
    DROPOUT = 0.1  # when --dropout is not given
    LABEL_SMOOTHING = 0.1  # when --label-smoothing is not given
    TAKES_WINDOW_STEPS = False  # True: built with window_steps, as its layout depends on the window's length
    FIXED_FEATURES = False  # True: forward also takes features(windows), which do not learn, so a pool can hold them
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

    def prepare_pool(self, windows, say):
        """Before a feature pool of `windows` windows is built on this model's device (FIXED_FEATURES):
        a model may get ready for that many; `say` takes a line for the run's log."""

    def fsdp_blocks(self):
        """The submodules FSDP shards as units of their own; none: the whole model is the root's unit."""
        return []
