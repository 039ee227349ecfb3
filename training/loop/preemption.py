"""Stop requests from the outside: SLURM and torchrun send SIGTERM/SIGUSR1 before they kill a job."""
import signal
import threading

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


class StopSignals:
    """While installed, a stop signal only sets `received`; the run finishes its optimizer step,
    saves, and exits with EXIT_PREEMPTED instead of dying mid-write."""

    def __init__(self):
        self.received = None  # the signal's name once one arrived
        self._previous = {}

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # Python only lets the main thread set handlers (e.g. under a test runner)
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def restore(self):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number, frame):
        self.received = signal.Signals(number).name
