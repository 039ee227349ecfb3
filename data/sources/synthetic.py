"""--dataset synthetic: windows of the UCI HAR shape made by data/synthetic.py, so every run works offline;
the kind --dataset auto means where no --data-dir is given."""
import numpy as np

from data import synthetic, uci_har
from data.errors import DataError
from data.layout import Layout
from data.provenance import array_identity
from data.sources.base import Source
from data.splits import CHANNEL_MODES, HarData, Split, channel_names, hold_out, select_channels, validation_words


class Synthetic(Source):
    name = "synthetic"
    about = "nothing: the windows are generated"
    takes_path = False
    no_description = "its layout is UCI HAR's"
    modes = CHANNEL_MODES

    def claims(self, path):
        return path is None

    def check(self, options):
        super().check(options)
        if options.synthetic_windows_per_subject < 1:
            raise DataError("--synthetic-windows-per-subject must be at least 1")

    def load(self, options):
        raw = synthetic.generate(options.synthetic_seed, options.synthetic_windows_per_subject)
        where = f"generated, seed {options.synthetic_seed}" + (", no --data-dir given" if options.dataset == "auto"
                                                                else "")
        return uci_har_layout_data(raw, options, self.name, where)


def uci_har_layout_data(raw, options, source, where):
    """HarData of windows in UCI HAR's nine channels ({"train": (signals, labels, subjects), "test": ...}),
    its channels chosen by --mode and validation held out of its training subjects."""
    mode = options.mode
    train_all = Split(select_channels(raw["train"][0], mode), raw["train"][1], raw["train"][2])
    test = Split(select_channels(raw["test"][0], mode), raw["test"][1], raw["test"][2])
    train, val, val_subjects = hold_out(train_all, options)
    description = (f"data: {source} ({where}), mode={mode}: {train.signals.shape[1]} channels x "
                   f"{train.signals.shape[2]} steps; train {len(train)} windows / "
                   f"{len(np.unique(train.subjects))} subjects, val {len(val)} / "
                   f"{validation_words(train_all, val_subjects, options.val_split)}, test {len(test)} / "
                   f"{len(np.unique(test.subjects))} subjects")
    layout = Layout.named(channel_names(mode), uci_har.CLASS_NAMES, sample_rate_hz=uci_har.SAMPLE_RATE_HZ,
                          window_steps=uci_har.WINDOW_STEPS, stride_steps=uci_har.WINDOW_STEPS // 2,
                          preprocessing="uci-har", where=f"the {source} data")
    return HarData(train, val, test, layout, source, description, identity=array_identity(*raw["train"],
                                                                                            *raw["test"]))


SOURCE = Synthetic()
