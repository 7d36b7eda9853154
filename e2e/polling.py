"""Polling a cluster through commands that may fail for a moment."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from support.real_node import wait_for

T = TypeVar("T")


def wait_for_commands(what: str, condition: Callable[[], T | None], timeout: float, interval: float = 1) -> T:
    """:func:`wait_for` of a condition that runs commands (kindutil.run: an AssertionError when one exits non-zero):
    a failed command is a "not yet", polled again, since an API server or a kubelet refuses a request for a moment
    (a restarting pod, a leader election); the timeout names the last failure when the last poll failed."""
    last_failure: list[AssertionError] = []

    def attempt() -> T | None:
        try:
            value = condition()
        except AssertionError as failure:
            last_failure[:] = [failure]
            return None
        last_failure.clear()
        return value

    try:
        return wait_for(what, attempt, timeout, interval)  # type: ignore[no-any-return]
    except TimeoutError as timed_out:
        if not last_failure:
            raise
        raise TimeoutError(f"{timed_out}; the last poll failed: {last_failure[0]}") from last_failure[0]
