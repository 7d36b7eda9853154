"""Start-up reconciliation of prepared claims whose node changed behind the driver: their pods may be running, so
nothing of theirs is destroyed unless the claim's own unprepare was cut short (its CDI spec gone, and some
hardware change gone too); a spec that alone is missing is written again."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.mps_daemons import daemon_processes

from dradriver.driver.prepare import mps_shm
from dradriver.driver.prepare.checkpoint import ClaimState
from dradriver.gpu.inventory import MigMode
from dradriver.gpu.models import ComputeMode
from dradriver.plugin.handler import DeviceConfig
from tests.driver.prepare.config_table import gpu
from tests.driver.prepare.test_state_mig import H100, Node, claim, ref
from tests.driver.prepare.test_state_sharing import GPU0, MPS
from tests.driver.prepare.test_state_sharing import Node as SharingNode
from tests.driver.prepare.test_state_sharing import claim as sharing_claim

WHOLE = "gpu-0000-43-00-0"  # the second GPU of hgx-h100-80gb, prepared whole in ExclusiveProcess mode
MIXED = replace(
    claim("m", f"{H100}-mig-1g10gb-0", f"{H100}-mig-2g20gb-2", WHOLE),
    config=(DeviceConfig("FromClaim", ("r2",), gpu(computeMode="ExclusiveProcess")),),
)
OTHER = claim("o", f"{H100}-mig-3g40gb-4")
CARVED = [(9, 4, 1), (14, 2, 1), (19, 0, 1)]  # GPU 0's instances (profile, start, compute instances) for both


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "hgx-h100-80gb")
    yield node
    assert node.store is not None
    node.store.close()


def prepare_both(node: Node) -> dict[str, list[str]]:
    """Prepare MIXED and OTHER; their CDI ids."""
    ids = {}
    for c in (MIXED, OTHER):
        ids[c.uid], error = node.prepare(c)
        assert error is None
    assert node.instances() == CARVED and node.sim.gpus[1].compute_mode == ComputeMode.EXCLUSIVE_PROCESS
    return ids


def specs(cdi_dir: Path) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}


def assert_kept(node: Node, ids: dict[str, list[str]]) -> None:
    """Both claims are still prepared: records, instances, compute mode; a re-sent prepare gives the same ids."""
    assert sorted(r.uid for r in node.driver.checkpoint.records()) == ["m", "o"]
    assert all(r.state is ClaimState.PREPARE_COMPLETED for r in node.driver.checkpoint.records())
    assert node.instances() == CARVED
    for c in (MIXED, OTHER):
        assert node.prepare(c) == (ids[c.uid], None)


def unprepare_both(node: Node) -> None:
    for uid in ("m", "o"):
        assert node.driver.unprepare_resource_claims([ref(uid)]) == {uid: None}
    node.assert_clean()


def drift_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "changed behind the driver" in r.getMessage()
    ]


def test_a_compute_mode_changed_behind_the_driver_keeps_the_claim_and_is_logged(
    h100: Node, caplog: pytest.LogCaptureFixture
) -> None:
    ids = prepare_both(h100)
    h100.sim.set_compute_mode(1, ComputeMode.DEFAULT)  # an admin's nvidia-smi -c 0
    with caplog.at_level(logging.WARNING):
        h100.restart().reconcile(lambda _ref: True)
    [warning] = drift_warnings(caplog)
    assert "UID m" in warning and f"compute mode of {h100.sim.gpus[1].uuid} changed to 0" in warning
    assert_kept(h100, ids)
    assert h100.sim.gpus[1].compute_mode == ComputeMode.DEFAULT  # not put back either: the driver only reports
    unprepare_both(h100)


def test_a_mig_instance_destroyed_behind_the_driver_keeps_the_claim_and_is_logged(
    h100: Node, caplog: pytest.LogCaptureFixture
) -> None:
    prepare_both(h100)
    [gi] = [gi for gi in h100.sim.gpus[0].gpu_instances.values() if gi.placement.start == 4]
    [ci] = gi.compute_instances
    h100.sim.destroy_compute_instance(0, gi.id, ci)  # an admin's nvidia-smi mig -dci on OTHER's partition
    with caplog.at_level(logging.WARNING):
        h100.restart().reconcile(lambda _ref: True)
    [warning] = drift_warnings(caplog)
    assert "UID o" in warning and "compute-instance (profile 9 at start 4)" in warning and "missing" in warning
    assert sorted(r.uid for r in h100.driver.checkpoint.records()) == ["m", "o"]
    assert h100.instances() == [(9, 4, 0), (14, 2, 1), (19, 0, 1)]  # MIXED's untouched, OTHER's GPU instance too
    assert len(h100.cdi_files()) == 2
    unprepare_both(h100)


@pytest.mark.parametrize("api", ["answers", "down"])
def test_an_emptied_cdi_dir_gets_its_specs_re_written_and_nothing_destroyed(
    h100: Node, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    ids = prepare_both(h100)
    before = specs(h100.cdi_dir)
    shutil.rmtree(h100.cdi_dir)  # a cleaned /var/run/cdi (tmpfs) while the pods run
    with caplog.at_level(logging.WARNING):
        h100.restart().reconcile(lambda _ref: True if api == "answers" else None)
    assert specs(h100.cdi_dir) == before
    assert not drift_warnings(caplog) and "re-writing the missing CDI spec" in caplog.text
    assert_kept(h100, ids)
    assert specs(h100.cdi_dir) == before
    unprepare_both(h100)


def test_a_changed_cdi_dir_gets_the_prepared_claims_specs_and_nothing_destroyed(h100: Node, tmp_path: Path) -> None:
    ids = prepare_both(h100)
    old_dir, before = h100.cdi_dir, specs(h100.cdi_dir)
    h100.cdi_dir = tmp_path / "cdi-new"  # the driver restarted with another --cdi-dir
    h100.restart().reconcile(lambda _ref: True)
    assert specs(h100.cdi_dir) == before
    assert_kept(h100, ids)
    unprepare_both(h100)
    # The old directory is not the driver's any more: its specs are left for the admin.
    assert specs(old_dir) == before


def test_a_re_sent_prepare_re_writes_a_spec_that_went_missing(h100: Node) -> None:
    ids = prepare_both(h100)
    before = specs(h100.cdi_dir)
    for path in h100.cdi_dir.glob("*.json"):
        path.unlink()
    assert_kept(h100, ids)  # a re-sent prepare of each claim, before any restart
    assert specs(h100.cdi_dir) == before
    unprepare_both(h100)


def test_a_static_mig_claim_gets_its_missing_spec_re_written(tmp_path: Path) -> None:
    static = Node(tmp_path, "mixed", MigMode.STATIC)  # the admin's MIG devices, never carved nor destroyed here
    try:
        c = claim("s", "gpu-0000-07-00-0-mig-2g10gb-4", "gpu-0000-0f-00-0")
        ids, error = static.prepare(c)
        assert error is None
        instances, before = static.instances(), specs(static.cdi_dir)
        shutil.rmtree(static.cdi_dir)
        static.restart().reconcile(lambda _ref: None)
        assert specs(static.cdi_dir) == before and static.instances() == instances
        assert static.prepare(c) == (ids, None)
    finally:
        assert static.store is not None
        static.store.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SharingNode]:
    node = SharingNode(tmp_path)
    yield node
    for record in node.driver.checkpoint.records():  # never leave a daemon behind
        node.driver.unprepare(ref(record.uid))


def test_an_mps_claim_s_missing_spec_is_re_written_with_its_running_daemon(node: SharingNode) -> None:
    assert node.prepare(sharing_claim("a", GPU0, config=[MPS])) is None
    daemon, spec = dict(node.daemon("a")), node.spec("a")
    (node.cdi_dir / "k8s.gpu.dradriver.dev-claim_a.json").unlink()
    node.restart().reconcile(lambda _ref: True)
    assert node.spec("a") == spec  # the daemon's directories mounted as before
    assert node.daemon("a")["pid"] == daemon["pid"] and node.mps.alive(daemon)
    assert node.mode() is ComputeMode.EXCLUSIVE_PROCESS


def test_an_mps_claim_whose_directories_vanished_is_kept_and_its_daemon_restarted(
    node: SharingNode, caplog: pytest.LogCaptureFixture
) -> None:
    assert node.prepare(sharing_claim("a", GPU0, config=[MPS])) is None
    daemon = dict(node.daemon("a"))
    # Someone cleaned the state directory (its shm tmpfs unmounted first: no rm -rf removes a mount point).
    mps_shm.remove(Path(daemon["shmDir"]))
    shutil.rmtree(Path(daemon["pipeDir"]).parent)
    with caplog.at_level(logging.WARNING):
        node.restart().reconcile(lambda _ref: True)
    assert "MPS daemon directories" in "\n".join(drift_warnings(caplog))
    restarted = node.daemon("a")
    assert restarted["pid"] != daemon["pid"] and node.mps.alive(restarted)
    assert node.spec("a")["devices"][0]["containerEdits"]["mounts"]
    assert daemon_processes(node.mps.root) == [("a", restarted["pid"])]  # the unreachable one was killed
    assert restarted["shmDir"] == daemon["shmDir"] and Path(restarted["shmDir"]).is_dir()  # made again


def test_a_kill_right_after_an_unprepare_removed_the_spec_keeps_the_claim_until_the_unprepare_is_re_sent(
    node: SharingNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing but the spec undone looks like a cleaned CDI directory: the claim is kept with its spec written
    again, and the kubelet's re-sent unprepare then finishes normally."""
    from dradriver import faults

    class Crash(BaseException):
        pass

    def crash() -> None:
        raise Crash

    node.sim.set_compute_mode(0, ComputeMode.PROHIBITED)
    assert node.prepare(sharing_claim("a", GPU0, config=[MPS])) is None
    daemon, spec = dict(node.daemon("a")), node.spec("a")
    monkeypatch.setattr(faults, "die", crash)
    monkeypatch.setenv(faults.CRASH_ENV, "undone:cdi-spec=kill")
    with pytest.raises(Crash):
        node.driver.unprepare(ref("a"))
    monkeypatch.delenv(faults.CRASH_ENV)
    node.restart().reconcile(lambda _ref: True)
    assert node.spec("a") == spec and node.mps.alive(daemon) and node.mode() is ComputeMode.EXCLUSIVE_PROCESS
    node.unprepare("a")  # the kubelet's re-sent unprepare
    assert (
        node.driver.checkpoint.records() == []
        and not node.cdi_dir.joinpath("k8s.gpu.dradriver.dev-claim_a.json").exists()
    )
    assert not node.mps.alive(daemon) and node.mode() is ComputeMode.PROHIBITED
