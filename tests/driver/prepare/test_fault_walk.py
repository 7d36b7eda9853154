"""The fault walk: every named point of prepare and unprepare x {kill, fail}, on a simulated node.

The points are not listed here: a clean prepare and unprepare are run first with an observer that records every
point they pass, so steps added later (compute mode, MPS, …) are walked without touching this file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.mps_daemons import daemon_dirs, kill_daemons, live_daemons, may_mount, shm_mounts

from dradriver import faults
from dradriver.driver.prepare.checkpoint import ClaimState
from dradriver.gpu.models import ComputeMode
from dradriver.plugin.handler import DeviceConfig
from dradriver.sim import mps_standin
from tests.driver.prepare.config_table import gpu, mig
from tests.driver.prepare.test_state_mig import H100, Node, claim, ref

WHOLE = "gpu-0000-43-00-0"  # the second GPU of hgx-h100-80gb, prepared whole and time-sliced
MPS_GPU = "gpu-0000-52-00-0"  # the third, prepared whole with MPS
# GPU 0 starts out of MIG mode, so the walk passes the MIG mode switch as well as the carving steps. The second GPU
# gets a compute mode and a time-slice; the first partition and the third GPU get MPS: one daemon (the simulated
# node's stand-in, a real process) over both, with compute modes on a MIG device carved by this prepare (its UUID
# unknown when the steps are declared) and on a whole GPU. So every sharing step is walked too.
CLAIM = replace(
    claim("walk", f"{H100}-mig-1g10gb-0", f"{H100}-mig-2g20gb-2", WHOLE, MPS_GPU),
    config=(
        DeviceConfig(
            "FromClaim",
            ("r2",),
            gpu(computeMode="Default", sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        ),
        DeviceConfig(
            "FromClaim", ("r3",), gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}})
        ),
        DeviceConfig("FromClaim", ("r0",), mig(sharing={"strategy": "MPS"})),
    ),
)


def walk_node(path: Path) -> Node:
    node = Node(path, "hgx-h100-80gb", mps=True)
    node.sim.set_compute_mode(2, ComputeMode.PROHIBITED)  # so restoring it is seen (MPS runs ExclusiveProcess)
    return node


# GPU 0's instances (profile, start, compute instances) while the claim is prepared.
PREPARED_INSTANCES = [(14, 2, 1), (19, 0, 1)]


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after the point runs, and the driver's memory is thrown away."""


def walk_points(tmp_path: Path) -> tuple[list[str], list[str], list[str]]:
    """The points a clean prepare and a clean unprepare pass, and the CDI ids the prepare returns."""
    node = walk_node(tmp_path / "probe")
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
    """No MIG instance, CDI spec, MPS daemon (process or directories) or record exists without a claim that owns
    it; an owned daemon is one and serving."""
    owners = {r.uid for r in node.driver.checkpoint.records()}
    assert {(p, s) for p, s, _ in node.instances()} <= owned_instances(node)
    assert {f.removeprefix("k8s.gpu.dradriver.dev-claim_").removesuffix(".json") for f in node.cdi_files()} <= owners
    assert owners <= {CLAIM.uid}
    assert node.mps_root is not None
    assert set(live_daemons(node.mps_root)) <= owners
    assert daemon_dirs(node.mps_root) <= owners
    assert shm_mounts(node.mps_root) <= owners  # a claim's shm tmpfs goes with it


def assert_gpus_as_found(node: Node, where: str) -> None:
    """No daemon or daemon directory, and compute modes and time-slices as the walk found them."""
    assert node.mps_root is not None
    assert live_daemons(node.mps_root) == {} and daemon_dirs(node.mps_root) == set(), where
    assert shm_mounts(node.mps_root) == set(), where
    assert [(g.compute_mode, g.timeslice) for g in node.sim.gpus[1:3]] == [
        (ComputeMode.DEFAULT, 0),
        (ComputeMode.PROHIBITED, 0),
    ], where


@pytest.mark.parametrize("phase", ["prepare", "unprepare"])  # two tests, so two workers share the walk
def test_every_point_of_prepare_and_unprepare_survives_a_kill_and_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str
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
        "before:mps-daemon",
        "after:mps-daemon",
    ):
        assert point in preparing
    assert {"after:cdi-spec", "prepare-completing", "undone:gpu-instance", "undone:cdi-spec"} <= {
        *preparing,
        *unpreparing,
    }
    assert {"undone:mps-daemon", "undone:compute-mode", "undone:time-slice"} <= set(unpreparing)

    def crash() -> None:
        raise Crash

    monkeypatch.setattr(faults, "die", crash)
    points = preparing if phase == "prepare" else unpreparing
    walked = 0
    kept: set[bool] = set()  # whether start-up kept the claim, for the kills in the middle of the unprepare
    for point in points:
        for mode in ("kill", "fail"):
            node = walk_node(tmp_path / f"{phase}-{point.replace(':', '-')}-{mode}")
            try:
                untouched = run_one(node, monkeypatch, phase, point, mode=mode, expected_ids=expected_ids)
                if mode == "kill" and point.startswith("undone:"):
                    kept.add(untouched)
            finally:
                monkeypatch.delenv(faults.CRASH_ENV, raising=False)
                assert node.mps_root is not None
                kill_daemons(node.mps_root)  # none after a pass; after a failure, none must linger
                assert node.store is not None
                node.store.close()
            walked += 1
    assert walked == 2 * len(points)
    if phase == "unprepare":
        assert kept == {True, False}  # both ways out of a cut-short unprepare were walked


def hardware_as_prepared(node: Node) -> bool:
    """Whether every change of the claim that start-up can read is still there (instances, compute modes, the
    daemon's directories)."""
    assert node.mps_root is not None
    return (
        node.instances() == PREPARED_INSTANCES
        and node.sim.gpus[1].compute_mode == ComputeMode.DEFAULT
        and node.sim.gpus[2].compute_mode == ComputeMode.EXCLUSIVE_PROCESS
        and daemon_dirs(node.mps_root) == {CLAIM.uid}
    )


def assert_daemon_serves(node: Node, where: str) -> None:
    """The prepared claim's MPS daemon answers, with its limits."""
    [daemon] = [a.params for a in node.driver.checkpoint.records()[0].actions if a.step == "mps-daemon"]
    assert node.driver.sharing.mps is not None
    assert node.driver.sharing.mps.query(daemon, "get_default_active_thread_percentage") == "30.0", where
    if may_mount():  # may mount: the daemon's /dev/shm is the claim's tmpfs
        assert node.mps_root is not None and shm_mounts(node.mps_root) == {CLAIM.uid}, where
        assert Path(mps_standin.shm_marker(daemon["pid"], daemon["shmDir"])).exists(), where


def run_one(
    node: Node, monkeypatch: pytest.MonkeyPatch, phase: str, point: str, *, mode: str, expected_ids: list[str]
) -> bool:
    """Walk one fault; True when a kill left the claim's hardware untouched (start-up then keeps the claim)."""
    where = f"{phase} {point}={mode}"
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
        untouched = hardware_as_prepared(node)
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
        # Nothing of the claim is left, and MIG mode, compute modes and time-slices are as the claim found them.
        node.assert_clean(mig_current=False)
        assert_gpus_as_found(node, where)
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
            assert_gpus_as_found(node, where)
        assert node.prepare(CLAIM) == (expected_ids, None), where
        assert {(p, s) for p, s, _ in node.instances()} == {(19, 0), (14, 2)}, where
        assert node.cdi_files() == [f"k8s.gpu.dradriver.dev-claim_{CLAIM.uid}.json"], where
        [record] = node.driver.checkpoint.records()
        assert record.state is ClaimState.PREPARE_COMPLETED and record.rollback_error is None, where
    assert_daemon_serves(node, where)  # the claim is prepared (again)
    # The kubelet's unprepare (re-sent after a fault in it) leaves no instance, spec or record; MIG mode stays on
    # by policy (docs/mig.md), so the next partition needs no switch.
    assert node.driver.unprepare_resource_claims([ref(CLAIM.uid)]) == {CLAIM.uid: None}, where
    node.assert_clean()
    assert_gpus_as_found(node, where)
    return untouched
