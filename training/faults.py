"""Failures injected on purpose, so tests can prove that kills, hangs and NaNs are survived.

HAR_FAULT="<what>@<micro-batch>[:rank=<r>]" acts just before this rank trains micro-batch
number <micro-batch>, counted from 0 over the whole run (epoch x batches per epoch + index):
  kill  SIGKILL this process (as the OOM killer or a dead node would)
  hang  stop making progress until SIGTERM/SIGUSR1, then exit (a stuck rank)
  nan   feed that micro-batch as NaN (a diverging loss)
  nanfrom  feed that micro-batch and every later one as NaN (a run that never recovers)
HAR_FAULT="kill@save:<n>" kills the process halfway through writing its n-th checkpoint and
HAR_FAULT="kill@shard:<n>" halfway through writing its n-th shard of a feature pool on disk (both
counted from 1). Faults fire only in a process's first life: not after a torchrun restart.
"""
import os
import signal
import time

_writes_seen = {"save": 0, "shard": 0}


def _spec():
    text = os.environ.get("HAR_FAULT", "")
    if not text or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    what, _, where = text.partition("@")
    where, _, rank = where.partition(":rank=")
    return what, where, int(rank) if rank else None


def wrap_batches(loader, first_global_batch, rank):
    """The loader itself, or a generator over it that injects the configured fault."""
    spec = _spec()
    if spec is None or not spec[1].isdigit() or spec[2] not in (None, rank):
        return loader
    return _faulty(loader, first_global_batch, spec[0], int(spec[1]))


def _faulty(loader, first_global_batch, what, target):
    for number, (signals, labels) in enumerate(loader, start=first_global_batch):
        if what == "nanfrom" and number >= target:
            signals = signals * float("nan")
        if number == target:
            if what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if what == "hang":
                _hang()
            if what == "nan":
                signals = signals * float("nan")
        yield signals, labels


def _hang():
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    while not stopped:
        time.sleep(0.05)
    os._exit(1)


def during_save():
    """Called between writing a checkpoint's temporary file and renaming it into place."""
    _kill_at_write("save")


def during_shard_write():
    """Called between writing a feature pool shard's temporary file and renaming it into place."""
    _kill_at_write("shard")


def _kill_at_write(kind):
    spec = _spec()
    if spec is None or not spec[1].startswith(f"{kind}:"):
        return
    _writes_seen[kind] += 1
    if _writes_seen[kind] == int(spec[1].split(":")[1]):
        os.kill(os.getpid(), signal.SIGKILL)
