"""The fault walk: every named point of prepare and unprepare x {kill, fail}, on a simulated node.

The points are not listed here: a clean prepare and unprepare are run first with an observer that records every
point they pass, so steps added later (compute mode, MPS, …) are walked without touching this file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dradriver import faults
from dradriver.driver.checkpoint import ClaimState
from dradriver.gpu.models import ComputeMode
from dradriver.plugin.handler import DeviceConfig
from tests.driver.config_table import gpu
from tests.driver.test_state_mig import H100, Node, claim, ref

WHOLE = "gpu-0000-43-00-0"  # the second GPU of hgx-h100-80gb, prepared whole
# GPU 0 starts out of MIG mode, so the walk passes the MIG mode switch as well as the carving steps; the whole GPU
# gets a compute mode and a time-slice, so the sharing steps are walked too (MPS daemons are walked by
# tests/driver/test_state_sharing.py, which runs the daemon stand-in).
CLAIM = replace(
    claim("walk", f"{H100}-mig-1g10gb-0", f"{H100}-mig-2g20gb-2", WHOLE),
    config=(
        DeviceConfig(
            "FromClaim",
            ("r2",),
            gpu(computeMode="Default", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        ),
    ),
)


# GPU 0's instances (profile, start, compute instances) while the claim is prepared.
PREPARED_INSTANCES = [(14, 2, 1), (19, 0, 1)]


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs, and the driver's memory is thrown away."""


def walk_points(tmp_path: Path) -> tuple[list[str], list[str], list[str]]:
    """The points a clean prepare and a clean unprepare pass, and the CDI ids the prepare returns."""
    node = Node(tmp_path / "probe", "hgx-h100-80gb")
    seen: list[str] = []
    faults.observer = seen.append
    try:
        ids, error = node.prepare(CLAIM)
        assert error is None
        preparing = list(dict.fromkeys(seen))  # a point passed twice (two partitions) fires at its first pass
        seen.clear()
        assert node.driver.unprepare_resource_claims([CLAIM.ref]) == {CLAIM.uid: None}
        return preparing, list(dict.fromkeys(seen)), ids
    finally:
        faults.observer = None
        assert node.store is not None
        node.store.close()


def owned_instances(node: Node) -> set[tuple[int, int]]:
    """(profile id, start) of every GPU-0 instance some checkpoint record accounts for."""
    return {
        (d.profile_id, d.placement_start)
        for r in node.driver.checkpoint.records()
        for d in r.devices
        if d.profile_id is not None and d.placement_start is not None
    }


def assert_nothing_unowned(node: Node) -> None:
    """No MIG instance, CDI spec or record exists without a claim that owns it."""
    owners = {r.uid for r in node.driver.checkpoint.records()}
    assert {(p, s) for p, s, _ in node.instances()} <= owned_instances(node)
    assert {f.removeprefix("k8s.gpu.dradriver.dev-claim_").removesuffix(".json") for f in node.cdi_files()} <= owners
    assert owners <= {CLAIM.uid}


def test_every_point_of_prepare_and_unprepare_survives_a_kill_and_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparing, unpreparing, expected_ids = walk_points(tmp_path)
    # What the walk must cover today; later steps add to it.
    for point in (
        "prepare-started",
        "after:mig-mode",
        "after:gpu-instance",
        "after:compute-instance",
        "after:compute-mode",
        "after:time-slice",
    ):
        assert point in preparing
    assert {"after:cdi-spec", "prepare-completing", "undone:gpu-instance", "undone:cdi-spec"} <= {
        *preparing,
        *unpreparing,
    }

    def crash() -> None:
        raise Crash

    monkeypatch.setattr(faults, "die", crash)
    walked = 0
    kept: set[bool] = set()  # whether start-up kept the claim, for the kills in the middle of the unprepare
    for phase, points in (("prepare", preparing), ("unprepare", unpreparing)):
        for point in points:
            for mode in ("kill", "fail"):
                node = Node(tmp_path / f"{phase}-{point.replace(':', '-')}-{mode}", "hgx-h100-80gb")
                try:
                    untouched = run_one(node, monkeypatch, phase, point, mode=mode, expected_ids=expected_ids)
                    if mode == "kill" and point.startswith("undone:"):
                        kept.add(untouched)
                finally:
                    monkeypatch.delenv(faults.CRASH_ENV, raising=False)
                    assert node.store is not None
                    node.store.close()
                walked += 1
    assert walked == 2 * (len(preparing) + len(unpreparing))
    assert kept == {True, False}  # both ways out of a cut-short unprepare were walked


def run_one(
    node: Node, monkeypatch: pytest.MonkeyPatch, phase: str, point: str, *, mode: str, expected_ids: list[str]
) -> bool:
    """Walk one fault; True when a kill left the claim's hardware untouched (start-up then keeps the claim)."""
    where = f"{phase} {point}={mode}"
    found_mode = node.sim.gpus[1].compute_mode
    if phase == "unprepare":
        assert node.prepare(CLAIM) == (expected_ids, None)
    monkeypatch.setenv(faults.CRASH_ENV, f"{point}={mode}")
    untouched = False  # killed before the unprepare changed any hardware that start-up can read
    if mode == "kill":
        with pytest.raises(Crash):
            if phase == "prepare":
                node.driver.prepare(CLAIM)
            else:
                node.driver.unprepare(CLAIM.ref)
        monkeypatch.delenv(faults.CRASH_ENV)
        untouched = node.instances() == PREPARED_INSTANCES and node.sim.gpus[1].compute_mode == ComputeMode.DEFAULT
        node.restart().reconcile()
    elif phase == "prepare":
        _ids, error = node.prepare(CLAIM)
        assert error is not None and f"injected failure at {point}" in error, where
        assert "everything done for the claim was undone" in error, where
        monkeypatch.delenv(faults.CRASH_ENV)
    else:
        error = node.driver.unprepare_resource_claims([CLAIM.ref])[CLAIM.uid]
        assert error is not None and f"injected failure at {point}" in error, where
        monkeypatch.delenv(faults.CRASH_ENV)
        [record] = node.driver.checkpoint.records()
        assert record.rollback_error is not None, where
    assert_nothing_unowned(node)
    if phase == "prepare":
        # Nothing of the claim is left, and MIG mode is as the claim found it.
        node.assert_clean(mig_current=False)
        # The kubelet re-sends the prepare: the same devices and CDI ids.
        assert node.prepare(CLAIM) == (expected_ids, None), where
    else:
        # A claim whose unprepare was cut short is never answered from its record: start-up (after a kill) or the
        # next call (after a failure) finishes the undo, and a re-sent prepare prepares it afresh. Killed right after
        # the spec's removal (nothing else undone that start-up can see), the claim is kept and its spec re-written:
        # start-up cannot tell that from a cleaned CDI directory under a running pod.
        if mode == "kill" and point.startswith("undone:") and untouched:
            [record] = node.driver.checkpoint.records()
            assert record.state is ClaimState.PREPARE_COMPLETED, where
            assert node.cdi_files() == [f"k8s.gpu.dradriver.dev-claim_{CLAIM.uid}.json"], where
            assert node.instances() == PREPARED_INSTANCES, where
        elif mode == "kill" and point.startswith("undone:"):
            assert node.driver.checkpoint.records() == [], where
            assert node.cdi_files() == [] and node.instances() == [], where
        assert node.prepare(CLAIM) == (expected_ids, None), where
        assert {(p, s) for p, s, _ in node.instances()} == {(19, 0), (14, 2)}, where
        assert node.cdi_files() == [f"k8s.gpu.dradriver.dev-claim_{CLAIM.uid}.json"], where
        [record] = node.driver.checkpoint.records()
        assert record.state is ClaimState.PREPARE_COMPLETED and record.rollback_error is None, where
    # The kubelet's unprepare (re-sent after a fault in it) leaves no instance, spec or record; MIG mode stays on
    # by policy (docs/mig.md), so the next partition needs no switch.
    assert node.driver.unprepare_resource_claims([ref(CLAIM.uid)]) == {CLAIM.uid: None}, where
    node.assert_clean()
    assert node.sim.gpus[1].compute_mode == found_mode, where
    return untouched
