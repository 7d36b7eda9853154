"""The in-process fault walk: the fault points a clean prepare and unprepare pass, and a kill at one of them.

A kill is a ``Crash`` raised from ``faults.observer``: a ``BaseException``, so no ``except Exception`` in the driver
catches it, and nothing after the point runs, as after SIGKILL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dradriver import faults


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs, and the driver's memory is thrown away."""


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
