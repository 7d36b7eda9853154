"""SIGTERM and SIGINT stop the long-running commands (run, compute-domain-controller, compute-domain-daemon) even
when they come while the main thread holds the stop event's own lock: the handler never takes it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from dradriver.cli.stop_signals import StopOnSignals

SRC = Path(__file__).resolve().parents[2] / "src"

# The main thread holds the event's lock, as Event.wait does on its way in and out, when SIGTERM arrives; a handler
# that called Event.set itself would wait for ever on it (python/cpython#126434).
SIGNALLED_INSIDE_THE_EVENTS_LOCK = """
import os, signal, threading
from dradriver.cli.stop_signals import StopOnSignals
stop = threading.Event()
with StopOnSignals(stop):
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    print("stopped" if stop.wait(20) else "not stopped")
"""


def test_a_signal_that_comes_while_the_main_thread_holds_the_events_lock_still_stops() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SIGNALLED_INSIDE_THE_EVENTS_LOCK],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(SRC)},
    )
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def test_the_handlers_before_come_back_and_a_signal_after_no_longer_sets_the_event() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    with StopOnSignals(stop, signals=(signal.SIGTERM,)) as signals:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]
        relay = signals._thread
    assert {s: signal.getsignal(s) for s in before} == before
    assert relay is not None and not relay.is_alive()
    assert not stop.is_set()
