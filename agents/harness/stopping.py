"""Stopping a run when it is told to: SIGTERM (what SLURM, Kubernetes, Ray and `timeout` send) or SIGINT (Ctrl-C).

While a run trains, `StopSignals` holds both signals and only notes the first one: the loop finishes the step
(or update) in progress, the run writes a checkpoint, prints how to resume and raises `RunStopped`, which ends
the process with exit code 128 + the signal number, the code the signal itself would have given. A second
signal while that happens is said and ignored, so nothing is left half-written; the checkpoint files are
replaced atomically besides, so even SIGKILL leaves the previous checkpoint whole.
"""

from __future__ import annotations

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOPPED_CODES = tuple(128 + signum for signum in STOP_SIGNALS)
"""Exit codes of a run that a stop signal ended after its checkpoint (143, 130): resumable."""


class RunStopped(SystemExit):
    """A run stopped by a signal after writing its checkpoint; uncaught, it exits with 128 + the signal number."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """Inside it (in the main thread), SIGTERM and SIGINT are noted in `received` instead of ending the process;
    their previous handlers come back on the way out. Elsewhere (another thread) signals keep their handlers."""

    def __init__(self):
        self.received: int | None = None
        """the first stop signal that came, or None"""
        self._previous: dict[int, object] = {}
        self._decided = (-1, False)  # (step, stopping) of the latest decision

    def stopping_at(self, step: int) -> bool:
        """Whether the loop stops at this step: whether a stop signal had come when it was first asked at this step.
        The runs of a seed group, which share these signals, ask in turn at each step; a signal that comes between
        their questions (during a seed's evaluation, say) stops them all at the next step, so that they checkpoint
        at the same one."""
        if self._decided[0] != step:
            self._decided = (step, self.received is not None)
        return self._decided[1]

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._note) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _note(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
            _say(f"{signal_name(signum)}: finishing this step, then writing a checkpoint before stopping\n")
        else:
            _say(f"{signal_name(signum)} while stopping: ignored; the run finishes its step and writes its "
                 f"checkpoint\n")


def _say(text: str) -> None:
    """Write to stderr's file descriptor directly: a signal handler may interrupt a write to sys.stderr (the
    progress bar's), and Python's buffered writer refuses a reentrant write."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass
