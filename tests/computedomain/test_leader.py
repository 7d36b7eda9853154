"""Leader election on a Lease: one leader, a takeover once the Lease lapses, an immediate one after a release."""

from __future__ import annotations

import datetime

from support.fake_rest import FakeRest

from dradriver.computedomain.leader import LeaderElector


def _elector(rest: FakeRest, identity: str) -> LeaderElector:
    return LeaderElector(rest, namespace="dradriver", name="lease", identity=identity, duration=15)  # type: ignore[arg-type]


def _age(rest: FakeRest, seconds: float) -> None:
    lease = rest.objects[_elector(rest, "x").path]
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    lease["spec"]["renewTime"] = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_one_replica_leads_and_renews() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    assert a.try_acquire() and not b.try_acquire()
    assert a.try_acquire() and a.leading.is_set() and not b.leading.is_set()


def test_a_standby_takes_over_a_lapsed_lease() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    a.try_acquire()
    _age(rest, 16)
    assert b.try_acquire()
    lease = rest.get(b.path)["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)
    assert not a.try_acquire()


def test_a_released_lease_is_taken_at_once() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    a.try_acquire()
    a.release()
    assert not a.leading.is_set()
    assert b.try_acquire()


def test_two_candidates_racing_for_a_lapsed_lease_cannot_both_win() -> None:
    rest = FakeRest()
    a, b = _elector(rest, "a"), _elector(rest, "b")
    a.try_acquire()
    _age(rest, 16)
    rest.conflicts = 1  # someone else wrote the Lease between b's read and b's update
    assert not b.try_acquire()
