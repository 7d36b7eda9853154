"""The fault walk: the fault points a clean prepare and unprepare pass, and a kill at one of them, in process or
of a `dradriver run` process over gRPC.

A kill is a ``Crash`` raised from ``faults.observer``: a ``BaseException``, so no ``except Exception`` in the driver
catches it, and nothing after the point runs, as after SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dradriver import faults
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient, RegisteredPlugin

LOST = r"StatusCode\.UNAVAILABLE"  # what a gRPC call gets from a server that died during it


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs, and the driver's memory is thrown away."""


class Changes:
    """Every change the driver makes to the node, in order; the process is killed (:class:`Crash`) right after the
    ``kill_after``-th since :meth:`arm`, once the change is made.

    A change made on another thread (the unbind write runs on one, for its deadline) raises nothing there, where the
    exception would be lost: the process counts as dead from then on, and its next change, on any thread, raises
    :class:`Crash` before it is made (wrappers call :meth:`before` first), as nothing is changed after SIGKILL."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.kill_after: int | None = None
        self.dead = False

    def arm(self, kill_after: int | None) -> None:
        self.made.clear()
        self.kill_after = kill_after
        self.dead = False

    def before(self) -> None:
        """Called before each change: a killed process makes none."""
        if self.dead:
            raise Crash("a change after the kill")

    def record(self, change: str) -> None:
        self.made.append(change)
        if len(self.made) != self.kill_after:
            return
        self.dead = True
        if threading.current_thread() is threading.main_thread():
            raise Crash(change)


def points_of_a_clean_run(
    prepare: Callable[[], object], unprepare: Callable[[], object]
) -> tuple[list[str], list[str]]:
    """The fault points `prepare` then `unprepare` pass, each list in first-passed order without repeats."""
    seen: list[str] = []
    faults.observer = seen.append
    try:
        prepare()
        preparing = list(dict.fromkeys(seen))
        seen.clear()
        unprepare()
        return preparing, list(dict.fromkeys(seen))
    finally:
        faults.observer = None


def crash_at(point: str, call: Callable[..., object], *args: object) -> None:
    """Runs `call(*args)` killed at fault point `point`, and asserts that it got there (the kill came)."""

    def crash(name: str) -> None:
        if name == point:
            raise Crash(name)

    faults.observer = crash
    try:
        with pytest.raises(Crash):
            call(*args)
    finally:
        faults.observer = None


def killed_during(
    proc: subprocess.Popen[str], registry: Path, call: Callable[[RegisteredPlugin], object], *, timeout: float
) -> None:
    """Makes `call` through a kubelet stand-in on `registry` to a driver process `proc` that kills itself during it
    (started with its fault point set), and asserts that the call lost its server and `proc` died of SIGKILL."""
    with KubeletClient(registry).register() as plugin, pytest.raises(grpc.RpcError, match=LOST):
        call(plugin)
    assert proc.wait(timeout) == -signal.SIGKILL
