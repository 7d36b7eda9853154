"""The rate-limited work queue: dedupe while queued, one worker per key, exponential backoff with a cap."""

from __future__ import annotations

import threading
import time

from dradriver.plugin.cluster.workqueue import WorkQueue

DEADLINE = 10.0


def test_a_key_added_while_queued_is_queued_once() -> None:
    work: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a"):
        work.add(key)
    assert len(work) == 2
    assert [work.get(0), work.get(0), work.get(0)] == ["a", "b", None]


def test_a_key_in_progress_goes_to_no_second_worker_and_comes_back_when_done() -> None:
    work: WorkQueue[str] = WorkQueue()
    work.add("a")
    assert work.get(0) == "a"
    work.add("a")  # changed while a worker has it
    assert work.get(0) is None
    work.done("a")
    assert work.get(0) == "a"
    work.done("a")
    assert work.get(0) is None


def test_failures_back_off_exponentially_up_to_the_cap_until_forgotten() -> None:
    now = [0.0]
    work: WorkQueue[str] = WorkQueue(backoff_base=1.0, backoff_cap=5.0, clock=lambda: now[0])
    assert [work.add_rate_limited("a") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert work.get(0) is None  # not due yet
    now[0] = 1.0
    assert work.get(0) == "a"
    work.done("a")
    work.forget("a")
    assert work.add_rate_limited("a") == 1.0


def test_a_waiting_worker_wakes_for_a_delayed_key_and_for_shut_down() -> None:
    work: WorkQueue[str] = WorkQueue()
    work.add_after("a", 0.05)
    started = time.monotonic()
    assert work.get(DEADLINE) == "a"
    assert time.monotonic() - started >= 0.04
    got: list[str | None] = []
    waiter = threading.Thread(target=lambda: got.append(work.get()))
    waiter.start()
    work.shut_down()
    waiter.join(DEADLINE)
    assert got == [None]
