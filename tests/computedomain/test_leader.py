"""Leader election on a Lease: one leader, a takeover once the Lease lapses (by the standby's own clock), an
immediate one after a release, and a step-down on any failure."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.fake_rest import FakeRest

from dradriver.computedomain.leader import LeaderElector

LEADING = "dradriver_computedomain_controller_leading"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(rest: FakeRest, identity: str, clock: Clock | None = None, renew: float = 2.0) -> LeaderElector:
    return LeaderElector(
        rest,  # type: ignore[arg-type]
        namespace="dradriver", name="lease", identity=identity, duration=15, renew=renew, clock=clock or Clock(),
    )  # fmt: skip


def _wait(what: str, probe: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_one_replica_leads_and_renews() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    assert a.try_acquire() and not b.try_acquire()
    assert a.try_acquire() and a.leading.is_set() and not b.leading.is_set()


def test_a_standby_takes_over_a_lapsed_lease() -> None:
    rest = FakeRest()
    clock = Clock()
    a, b = _elector(rest, "a"), _elector(rest, "b", clock)
    a.try_acquire()
    assert not b.try_acquire()  # b sees the record now
    clock.now += 16  # and it has not changed since, by b's clock
    assert b.try_acquire()
    lease = rest.get(b.path)["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)
    assert not a.try_acquire()


def test_a_released_lease_is_taken_at_once() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    a.try_acquire()
    assert REGISTRY.get_sample_value(LEADING) == 1  # the metric follows the Lease at once
    a.release()
    assert not a.leading.is_set()
    assert REGISTRY.get_sample_value(LEADING) == 0
    assert b.try_acquire()


def test_two_candidates_racing_for_a_lapsed_lease_cannot_both_win() -> None:
    rest = FakeRest()
    clock = Clock()
    a, b = _elector(rest, "a"), _elector(rest, "b", clock)
    a.try_acquire()
    b.try_acquire()
    clock.now += 16
    rest.conflicts = 1  # someone else wrote the Lease between b's read and b's update
    assert not b.try_acquire()


@pytest.mark.parametrize("skew", [-3600, 3600])
def test_expiry_never_compares_this_hosts_clock_with_the_holders(skew: int) -> None:
    """The holder's clock is an hour off ours: while it keeps renewing, the standby never takes over; once it
    stops, the standby waits the lease's duration from when it saw the last renewal, not from renewTime."""
    rest = FakeRest()
    clock = Clock()
    a, b = _elector(rest, "a"), _elector(rest, "b", clock)

    def renew_from_a_skewed_host() -> None:
        assert a.try_acquire()
        moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=skew)
        rest.objects[a.path]["spec"]["renewTime"] = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    for _ in range(5):
        renew_from_a_skewed_host()
        assert not b.try_acquire()
        clock.now += 10  # less than the duration between two renewals
    renew_from_a_skewed_host()
    assert not b.try_acquire()
    clock.now += 14
    assert not b.try_acquire()
    clock.now += 2
    assert b.try_acquire()


def test_any_failure_steps_down_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    rest = FakeRest()
    a = _elector(rest, "a", renew=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=a.run, args=(stop,))
    thread.start()
    try:
        _wait("a to lead", a.leading.is_set)
        get = rest.get

        def broken(path: str) -> dict[str, Any]:
            raise ValueError("an answer the client could not decode")

        monkeypatch.setattr(rest, "get", broken)
        _wait("a to step down", lambda: not a.leading.is_set())
        assert thread.is_alive()
        monkeypatch.setattr(rest, "get", get)
        _wait("a to lead again", a.leading.is_set)
    finally:
        stop.set()
        thread.join(10)


def test_a_leader_stops_leading_at_its_renew_deadline_with_no_failed_request() -> None:
    """A replica cut off from the API server (its requests hang rather than fail) stops leading 10 s after its
    last renewal, before a standby takes over at 15 s."""
    rest = FakeRest()
    clock = Clock()
    a = _elector(rest, "a", clock)
    assert a.try_acquire()
    clock.now += 9.9
    assert a.leading.is_set()
    clock.now += 0.2
    assert not a.leading.is_set()
    assert a.try_acquire() and a.leading.is_set()  # renewed: leading again


def test_lease_requests_are_bounded_within_the_renew_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    rest = FakeRest()
    a = _elector(rest, "a")
    timeouts: list[Any] = []
    for verb in ("get", "create", "update"):
        real = getattr(rest, verb)

        def spy(*args: Any, real: Any = real, **options: Any) -> Any:
            timeouts.append(options.get("timeout"))
            return real(*args, **options)

        monkeypatch.setattr(rest, verb, spy)
    assert a.try_acquire() and a.try_acquire()  # create, then get and update
    # Each request's read bounded by half the deadline (the default client waits 30 s), its connect shorter.
    assert len(timeouts) == 4 and all(t is not None and t[0] < t[1] <= a.leading.deadline / 2 for t in timeouts), (
        timeouts
    )


def test_a_short_lease_is_renewed_often_enough_that_one_slow_renewal_does_not_end_a_term() -> None:
    short = LeaderElector(FakeRest(), namespace="dradriver", name="lease", identity="a", duration=4)  # type: ignore[arg-type]
    assert short.leading.deadline == pytest.approx(4 * 2 / 3) and short.renew <= short.leading.deadline / 4
    default = LeaderElector(FakeRest(), namespace="dradriver", name="lease", identity="a")  # type: ignore[arg-type]
    assert (default.leading.deadline, default.renew) == (10.0, 2.0)  # client-go's 15/10/2
