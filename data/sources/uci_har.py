"""--dataset uci-har: the UCI HAR Dataset's folder (data/uci_har.py reads it), its own train and test
subjects, its nine channels picked by --mode. The store's converter takes its windows as they are."""
import numpy as np

from data import uci_har
from data.errors import DataError
from data.layout import Layout
from data.sources.base import Source
from data.sources.synthetic import uci_har_layout_data
from data.splits import CHANNEL_MODES
from data.store_jobs import manifest_head, source_rate, window_jobs


class UciHar(Source):
    name = "uci-har"
    about = "the UCI HAR Dataset (train/Inertial Signals and test/ under it, or under its 'UCI HAR Dataset' folder)"
    modes = CHANNEL_MODES

    def claims(self, path):
        return uci_har.find_root(path) is not None

    def identity_files(self, path):
        root = uci_har.find_root(path)
        return [file for split in ("train", "test") for group in uci_har.source_files(root, split)
                for file in (group if isinstance(group, list) else [group])]

    def load(self, options):
        root = self.root(options.data_dir)
        raw = {split: uci_har.load_split(root, split) for split in ("train", "test")}
        return uci_har_layout_data(raw, options, self.name, str(root))

    def root(self, data_dir):
        # A --data-dir that was given must hold the data: training on synthetic windows instead would look
        # like a result on real data.
        root = uci_har.find_root(data_dir)
        if root is None:
            raise DataError(f"--data-dir {data_dir} does not hold {self.about}; use --dataset synthetic to run "
                            "without it")
        return root

    def store_jobs(self, path, options):
        root = self.root(path)
        if options.described:
            raise DataError(f"{path} is a UCI HAR layout, whose channels and classes are known: drop --description")
        splits = {split: uci_har.load_split(root, split) for split in ("train", "test")}
        jobs = [job for split in splits.values() for job in window_jobs(*split)]
        test = sorted(int(s) for s in np.unique(splits["test"][2]))
        rate = source_rate(uci_har.SAMPLE_RATE_HZ, options.sample_rate, f"UCI HAR layout {root}")
        made = Layout.named(uci_har.SIGNAL_NAMES, uci_har.CLASS_NAMES, sample_rate_hz=rate,
                            window_steps=uci_har.WINDOW_STEPS, stride_steps=uci_har.WINDOW_STEPS // 2,
                            preprocessing="uci-har", where=f"UCI HAR layout {root}")
        return jobs, manifest_head(made, test, f"UCI HAR layout {root}", options)


SOURCE = UciHar()
