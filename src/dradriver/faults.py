"""Test-only fault injection at named points of prepare and unprepare (docs/reliability.md lists them).

``DRADRIVER_TEST_CRASH_AT`` holds comma-separated entries ``<point>`` or ``<point>=kill`` (the process SIGKILLs
itself there) and ``<point>=fail`` (an NVML/OS-like error is raised there, so the claim fails and is rolled back).
Points: ``claim-fetched`` (after the claim GET), ``prepare-started`` (the claim is recorded PrepareStarted),
``before:<step>`` and ``after:<step>`` for every transaction step (MIG mode, GPU and compute instance, CDI spec,
and whatever steps later features add), ``prepare-completing`` (before PrepareCompleted is written),
``undone:<step>`` (unprepare or rollback undid the step) and ``sysfs-written`` (right after each sysfs write that moves
a PCI function between drivers). ``<point>#<n>`` names the point's ``n``-th pass in this process only
(``sysfs-written#2=kill``: killed right after the second write). Never set it outside tests.

It lives at the top of the package (like ``errors``), so the plugin layer and the driver both mark their points.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from dradriver.errors import DeviceError

log = logging.getLogger(__name__)

CRASH_ENV = "DRADRIVER_TEST_CRASH_AT"

#: Tests set this to learn every point a prepare passes (the fault walk enumerates them, new steps included).
observer: Callable[[str], None] | None = None

_passes: dict[str, int] = {}  # how often each point was passed while DRADRIVER_TEST_CRASH_AT was set
_passes_lock = threading.Lock()  # points are passed on several threads (an unbind write runs on its own)


class InjectedFault(DeviceError):
    """The error ``<point>=fail`` raises: stands in for an NVML or OS error at that point."""

    def __init__(self, point: str) -> None:
        super().__init__(f"injected failure at {point} (test hook {CRASH_ENV}; an NVML/OS error in production)")
        self.point = point


def fault_point(name: str) -> None:
    """Kill the process or raise :class:`InjectedFault` if ``DRADRIVER_TEST_CRASH_AT`` names ``name`` (or this pass
    of it, ``name#<n>``)."""
    if observer is not None:
        observer(name)
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    with _passes_lock:
        passes = _passes[name] = _passes.get(name, 0) + 1
    for entry in wanted.split(","):
        point, _, mode = entry.strip().partition("=")
        if point not in (name, f"{name}#{passes}"):
            continue
        if mode == "fail":
            log.warning("test hook: failing at point %s", name)
            raise InjectedFault(name)
        log.warning("test hook: killing the process at crash point %s", name)
        die()


def die() -> None:
    """SIGKILL this process; in-process tests replace it with one that raises, to stop where a crash would."""
    os.kill(os.getpid(), signal.SIGKILL)
