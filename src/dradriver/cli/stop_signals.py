"""SIGTERM and SIGINT turned into a ``threading.Event`` that the long-running commands stop on.

The handler never touches the event itself: Python runs a signal handler in the main thread between two bytecodes,
possibly while that thread holds the event's own lock inside ``Event.wait``, and ``Event.set`` there would wait for
ever on a lock its own thread holds (python/cpython#126434: the driver then outlives its grace period and is
killed). The handler writes a byte to a pipe instead, and a thread of its own sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SIGNALLED, _CLOSING = b"s", b"x"


class StopOnSignals:
    """While entered, each of ``signals`` sets ``event`` (from the ``stop-signals`` thread); the previous handlers
    come back on exit. Enter it in the main thread, as ``signal.signal`` requires."""

    def __init__(self, event: threading.Event, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.event = event
        self.signals = tuple(signals)
        self._previous: dict[signal.Signals, Any] = {}
        self._read = self._write = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StopOnSignals:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # a full pipe means signalled already: the handler never blocks
        self._thread = threading.Thread(target=self._relay, name="stop-signals", daemon=True)
        self._thread.start()
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        with contextlib.suppress(OSError):
            os.write(self._write, _CLOSING)
        if self._thread is not None:
            self._thread.join(5.0)
        os.close(self._write)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._read)  # else left open: the thread still reads it (the process is ending anyway)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: the pipe is full of earlier signals
            os.write(self._write, _SIGNALLED)

    def _relay(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if _SIGNALLED in data:
                self.event.set()
            if not data or _CLOSING in data:
                return
