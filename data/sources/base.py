"""The contract every kind of data keeps (data/sources/): what a run asks of its data, and the Source that
answers for one kind: its name, the --data-dir it claims, the files that make its identity, its windows
and, where it has any, the store converter's jobs."""
from dataclasses import dataclass

from data.errors import DataError
from data.synthetic import DEFAULT_WINDOWS_PER_SUBJECT

AUTO = "auto"  # --dataset auto: the kind that claims --data-dir


@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """What a run asks of its data (RunConfig.data_options()): the kind and its path, the channels' mode,
    how validation is held out, the generator's settings, and a description of the windows."""
    dataset: str = AUTO
    data_dir: str | None = None
    mode: str = "flatten"
    val_fraction: float = 0.2
    split_seed: int = 0
    synthetic_seed: int = 0
    synthetic_windows_per_subject: int = DEFAULT_WINDOWS_PER_SUBJECT
    val_subjects: tuple | None = None
    val_split: str = "subjects"
    description: object = None  # a data.layout.Layout, or its file's path


class Source:
    """One kind of data. A module of data/sources/ subclasses it for its kind and registers one instance
    (data.sources.register_source); nothing else compares kinds by name."""
    name = None  # --dataset NAME
    about = ""  # what its --data-dir is, in the words of a refusal: "an .npz file of windows"
    takes_path = True  # False: the data is made, not read (it takes no --data-dir)
    takes_description = False  # --description says what its windows are
    no_description = "its layout is known"  # why it takes none, where it takes none
    modes = ("flatten",)  # the --mode values it has channels for

    def claims(self, path):
        """Whether `path` (a --data-dir, or None) is data of this kind: --dataset auto takes the first
        kind that claims it."""
        return False

    def identity_files(self, path):
        """The files whose bytes decide the data at `path` (cross-validation's finished folds compare them)."""
        return []

    def load(self, options):
        """The data (data.splits.HarData) as `options` (DataOptions) ask: splits by subject, not normalised."""
        raise NotImplementedError

    def store_jobs(self, path, options):
        """(jobs, layout) that the store's converter (data/build_store.py) runs for this kind, or None where
        it converts nothing of this kind."""
        return None

    def check(self, options):
        """The refusals every kind makes alike, each in this kind's words, before its data is read."""
        if options.description is not None and not self.takes_description:
            raise DataError(f"--description describes the windows of --dataset npz or recordings; --dataset "
                            f"{self.name} takes none ({self.no_description}): drop it")
        if self.takes_path and not options.data_dir:
            raise DataError(f"--dataset {self.name} needs --data-dir pointing at {self.about}")
        if not self.takes_path and options.data_dir:
            raise DataError(f"--data-dir is not read with --dataset {self.name}; drop one of them")
        if options.mode not in self.modes:
            raise DataError(f"--mode {options.mode} picks UCI HAR channels; the windows of --dataset {self.name} are "
                            "used as they are (--mode flatten)")
