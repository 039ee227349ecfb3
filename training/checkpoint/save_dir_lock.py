"""One run at a time per --save-dir: an flock on <save-dir>/.lock, which the OS drops when the
holder dies, so a killed run never leaves the folder locked.

Not the `filelock` package, although torch installs it: the refusal names the holder from a line
the holder writes into the lock file (pid, host, start time, command), and filelock releases up to
3.29 truncate that file on every attempt, a refused one included (tox-dev/filelock#591), while later
ones keep the file after release by design. This lock removes its file on release, safely: a taker
checks that the file it locked is still the one at the path."""
import datetime
import fcntl
import os
import socket
import sys
from pathlib import Path

from training.errors import UsageError

LOCK_NAME = ".lock"


class SaveDirLock:
    """Held from acquire() to release() (or the end of the process)."""

    def __init__(self, save_dir):
        self.path = Path(save_dir) / LOCK_NAME
        self._file = None

    def acquire(self):
        """Take the lock or refuse in one line naming the run that holds it."""
        while self._file is None:
            handle = open(self.path, "a+")  # noqa: SIM115 - the open file is the lock, held until release()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process that has not yet written its name"
                handle.close()
                raise UsageError(f"--save-dir {self.path.parent} is in use by another run ({holder}); wait for "
                                 "it to finish, or start this one with another --save-dir") from None
            except OSError as exc:
                handle.close()
                raise UsageError(f"--save-dir {self.path.parent} cannot be locked ({exc.strerror}); use a "
                                 "folder on a filesystem with file locks") from None
            # A holder that just released unlinks the file: a lock on that old file guards nothing.
            if _same_file(handle, self.path):
                self._file = handle
            else:
                handle.close()
        self._file.seek(0)
        self._file.truncate()
        started = datetime.datetime.now(datetime.timezone.utc)
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started:%Y-%m-%d %H:%M:%S} UTC: "
                         + " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
        self._file.flush()
        return self

    def release(self):
        """Remove the file while still holding it, so nobody locks a name another run then recreates."""
        if self._file is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self._file.close()
            self._file = None

    def __del__(self):
        self.release()


class NoLock:
    """Stands in on ranks other than 0, which write nothing to --save-dir."""

    def release(self):
        pass


def _same_file(handle, path):
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
