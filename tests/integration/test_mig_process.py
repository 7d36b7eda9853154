"""Dynamic MIG through the real gRPC path: `dradriver run` on a simulated H100 node, killed at every step of a
prepare and restarted; start-up reconciliation leaves no orphan instance or CDI spec behind."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from support.apiserver import FakeApiServer
from support.fault_walk import LOST, killed_during

from dradriver.cli.main import main
from dradriver.driver.prepare.transaction import CRASH_ENV
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from integration.test_run_process import NODE, TIMEOUT, DriverProcess, allocated_claim

PROFILE = "hgx-h100-80gb"
GPU = "gpu-0000-1b-00-0"
PARTITION = f"{GPU}-mig-3g40gb-4"
# What the kubelet sees of a call whose plugin process died under it: the connection lost, not an answer.


def start(root: Path, api: FakeApiServer) -> DriverProcess:
    process = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--mig-mode",
        "dynamic",
        "--rescan-interval",
        "0",
        profile=PROFILE,
    )
    return process


def hardware(root: Path) -> list[tuple[int, int, int]]:
    """(profile id, start, compute instances) of the GPU instances on the first GPU, from the shared state."""
    node = SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json")
    return sorted(
        (gi.profile.id, gi.placement.start, len(gi.compute_instances)) for gi in node.gpus[0].gpu_instances.values()
    )


def cdi_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "cdi").glob("*.json")) if (root / "cdi").exists() else []


def test_a_partition_is_carved_over_grpc_and_destroyed_at_unprepare(root: Path, api: FakeApiServer) -> None:
    driver = start(root, api)
    try:
        driver.wait_ready()
        claim = allocated_claim(api, "one", [PARTITION])
        with KubeletClient(root / "registry").register() as plugin:
            result = plugin.prepare([claim])[claim.uid]
            assert result.error == "", driver.log
            assert result.devices[0]["cdi_device_ids"] == [f"k8s.gpu.dradriver.dev/claim={claim.uid}-{PARTITION}"]
            assert hardware(root) == [(9, 4, 1)]
            assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert hardware(root) == [] and cdi_files(root) == []
    finally:
        driver.stop()


@pytest.mark.parametrize(
    "point",
    # After PrepareStarted and after each hardware step; the in-process tests cover failures between them.
    ["prepare-started", "after:mig-mode", "after:gpu-instance", "after:compute-instance"],
)
def test_killed_at_any_step_then_restarted_leaves_nothing_behind(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    monkeypatch.setenv(CRASH_ENV, point)
    doomed = start(root, api)
    doomed.wait_ready()
    claim = allocated_claim(api, "crash", [PARTITION])
    # The process dies mid-call.
    killed_during(
        doomed.proc, root / "registry", lambda plugin: plugin.prepare([claim], timeout=TIMEOUT), timeout=TIMEOUT
    )
    monkeypatch.delenv(CRASH_ENV)

    driver = start(root, api)
    try:
        driver.wait_ready()
        assert hardware(root) == [], driver.log
        assert cdi_files(root) == []
        assert "reconcile: rolling back a prepare that did not complete" in driver.log
        with KubeletClient(root / "registry").register() as plugin:
            result = plugin.prepare([claim])[claim.uid]
        assert result.error == "", driver.log
        assert result.devices[0]["cdi_device_ids"] == [f"k8s.gpu.dradriver.dev/claim={claim.uid}-{PARTITION}"]
        assert hardware(root) == [(9, 4, 1)]
    finally:
        driver.stop()


def test_a_placement_taken_with_dradriver_sim_gives_a_clear_error_and_nothing_leaks(
    root: Path, api: FakeApiServer
) -> None:
    driver = start(root, api)
    try:
        driver.wait_ready()
        sim = ["sim", "--sim-profile", PROFILE, "--node-name", NODE, "--sim-state", str(root / "sim.json")]
        assert main([*sim, "mig-mode", "0000:1b:00.0", "enable"]) == 0
        assert main([*sim, "mig-create", "0000:1b:00.0", "1g.10gb", "--start", "5"]) == 0
        claim = allocated_claim(api, "late", [PARTITION])
        with KubeletClient(root / "registry").register() as plugin:
            error = plugin.prepare([claim])[claim.uid].error
        assert f"device {PARTITION}, step gpu-instance" in error and "Insufficient Resources" in error
        assert hardware(root) == [(19, 5, 1)]  # the admin's instance, and only it
        assert cdi_files(root) == []
    finally:
        driver.stop()


def test_a_claim_deleted_while_the_driver_was_down_is_unprepared_at_start_up(root: Path, api: FakeApiServer) -> None:
    driver = start(root, api)
    driver.wait_ready()
    gone = allocated_claim(api, "gone", [PARTITION])
    kept = allocated_claim(api, "kept", [f"{GPU}-mig-1g10gb-0"])
    with KubeletClient(root / "registry").register() as plugin:
        assert {uid: r.error for uid, r in plugin.prepare([gone, kept]).items()} == {gone.uid: "", kept.uid: ""}
    driver.stop(signal.SIGKILL)
    api.delete("resourceclaims", "gone", namespace="default")

    again = start(root, api)
    try:
        again.wait_ready()
        assert "reconcile: unpreparing a claim the API server no longer has" in again.log
        assert hardware(root) == [(19, 0, 1)]
        assert cdi_files(root) == [f"k8s.gpu.dradriver.dev-claim_{kept.uid}.json"]
    finally:
        again.stop()


def test_killed_in_the_middle_of_an_unprepare_the_next_start_finishes_it(
    root: Path, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLed after the unprepare removed the CDI spec and the compute instance, with the GPU instance still
    there and the claim still recorded PrepareCompleted: the next start destroys the rest and drops the record, so
    the kubelet's re-sent unprepare succeeds and a re-sent prepare carves afresh."""
    monkeypatch.setenv(CRASH_ENV, "undone:compute-instance=kill")
    doomed = start(root, api)
    doomed.wait_ready()
    claim = allocated_claim(api, "half", [PARTITION])
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid].error == "", doomed.log
        with pytest.raises(grpc.RpcError, match=LOST):
            plugin.unprepare([claim], timeout=TIMEOUT)  # the process dies mid-call
    assert doomed.proc.wait(TIMEOUT) == -signal.SIGKILL
    assert hardware(root) == [(9, 4, 0)] and cdi_files(root) == []  # half undone
    monkeypatch.delenv(CRASH_ENV)

    driver = start(root, api)
    try:
        driver.wait_ready()
        assert "reconcile: finishing an unprepare that did not complete" in driver.log, driver.log
        assert hardware(root) == []
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.unprepare([claim]) == {claim.uid: ""}
            result = plugin.prepare([claim])[claim.uid]
            assert result.error == "", driver.log
            assert hardware(root) == [(9, 4, 1)] and len(cdi_files(root)) == 1
            assert plugin.unprepare([claim]) == {claim.uid: ""}
    finally:
        driver.stop()
