"""Day-2 operations of a running `dradriver run` on a simulated node: which pod holds which device (metrics,
/allocations, `dradriver top`) and claims deleted behind the kubelet's back, cleaned within one re-check period."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer, allocated_claim

from dradriver.cli.main import main
from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

from .test_run_process import NODE, TIMEOUT, DriverProcess, _get, _status_port, eventually, our_slices

PROFILE = "dgx-a100-40gb"


def instances(root: Path, gpu: int) -> int:
    """GPU instances on GPU ``gpu`` of the simulated node, read from its state file as nvidia-smi would."""
    return len(
        SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json").gpus[gpu].gpu_instances
    )


def published(api: FakeApiServer) -> list[str]:
    return [d["name"] for s in our_slices(api) for d in s["spec"].get("devices", [])]


def test_pods_per_gpu_in_metrics_allocations_and_top_and_a_deleted_claim_is_cleaned_within_a_recheck(
    root: Path, api: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--mig-mode",
        "dynamic",
        "--rescan-interval",
        "0",
        "--claim-recheck-interval",
        "1",
        "--usage-interval",
        "1",
        profile=PROFILE,
    )
    try:
        driver.wait_ready()
        mig = "gpu-0000-0f-00-0-mig-1g5gb-0"
        assert eventually(lambda: mig in published(api)), driver.log
        claim = allocated_claim(api, "trainer", [mig], pods={"trainer-0": "pod-uid-0"})
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == ""
        assert instances(root, 1) == 1
        port = _status_port(driver)

        [series] = [
            line
            for line in _get(port, "/metrics")[1].splitlines()
            if line.startswith("dradriver_device_allocation_info{")
        ]
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
        assert labels["pod"] == "trainer-0" and labels["namespace"] == "default" and labels["claim"] == "trainer"
        assert labels["uuid"].startswith("MIG-") and labels["gpu_uuid"].startswith("GPU-")
        assert (labels["mig_profile"], labels["sharing"], labels["device"]) == ("1g.5gb", "exclusive", mig)

        status, body = _get(port, "/allocations")
        assert status == 200
        [held] = json.loads(body)["allocations"]
        assert (held["pod"], held["podUID"], held["uuid"]) == ("trainer-0", "pod-uid-0", labels["uuid"])

        # A CUDA process starts in the pod's MIG device: the next usage sample shows its memory.
        hardware = SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json")
        hardware.start_process(labels["uuid"], 4242, 2 << 30, 0)

        def mig_usage() -> dict:
            usage = json.loads(_get(port, "/allocations")[1])["usage"]
            return next((u for u in usage if u["uuid"] == labels["uuid"]), {})

        assert eventually(lambda: mig_usage().get("processes") == 1), driver.log
        assert mig_usage()["utilizationPercent"] is None  # NVML does not report it for MIG devices
        assert mig_usage()["memoryUsedBytes"] >= 2 << 30
        metrics = _get(port, "/metrics")[1]
        assert f'dradriver_device_memory_used_bytes{{device="{mig}"' in metrics
        assert "dradriver_device_temperature_celsius{" in metrics

        def top() -> str:
            capsys.readouterr()
            assert main(["top", "--address", f"127.0.0.1:{port}", "--once"]) == 0
            return str(capsys.readouterr().out)

        # top shows "not published" instead of "free" while a publish pass has failed (a slow request on a loaded
        # machine): the next pass heals it, so look again until it has.
        tables = [top()]
        assert eventually(lambda: "not published" not in tables[-1] or bool(tables.append(top()))), tables[-1]
        table = tables[-1]
        row = next(line for line in table.splitlines() if "default/trainer-0" in line)
        assert "1g.5gb" in row and "trainer" in row and "2049MiB / " in row
        assert sum("└ free" in line for line in table.splitlines()) == 7  # the other seven GPUs
        assert main(["top", "--address", f"127.0.0.1:{port}", "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["allocations"][0]["pod"] == "trainer-0"

        # The claim is deleted while the kubelet is away: nobody calls unprepare.
        api.delete("resourceclaims", "trainer", "default")
        assert eventually(lambda: instances(root, 1) == 0, timeout=TIMEOUT), driver.log
        assert eventually(lambda: json.loads(_get(port, "/allocations")[1])["allocations"] == []), driver.log
        assert not list((root / "cdi").glob(f"*{claim.uid}*"))
        assert "dradriver_device_allocation_info{" not in _get(port, "/metrics")[1]
        assert "unpreparing a claim the API server no longer has" in driver.log
    finally:
        driver.stop(signal.SIGKILL)


def test_top_says_how_to_reach_a_driver_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--address", "127.0.0.1:1", "--once"]) == 2
    error = capsys.readouterr().err
    assert "cannot read http://127.0.0.1:1/allocations" in error and "--metrics-address" in error


@pytest.mark.parametrize("address", ["nohost", "host:port", "host:70000"])
def test_top_refuses_an_address_that_is_not_host_and_port(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--address", address, "--once"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--address {address!r} is not HOST:PORT" in line


def _sim(root: Path, profile: str, *args: str) -> None:
    command = ["sim", "--sim-profile", profile, "--node-name", NODE, "--sim-state", str(root / "sim.json"), *args]
    assert main(command) == 0


def test_top_lists_every_mig_device_with_its_holder_and_the_lost_and_unhealthy_gpus(
    root: Path, api: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mixed profile: GPU 0 is split into three MIG devices (one held, two free); an XID makes GPU 1
    unhealthy and GPU 2 falls off the bus. top shows each, from an --address given as a URL."""
    driver = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--mig-mode",
        "static",
        "--rescan-interval",
        "0",
        profile="mixed",
    )
    try:
        driver.wait_ready()
        held = "gpu-0000-07-00-0-mig-1g5gb-6"
        assert eventually(lambda: held in published(api)), driver.log
        claim = allocated_claim(api, "inference", [held], pods={"inference-0": "pod-uid-1"})
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid].error == ""
        _sim(root, "mixed", "xid", "0000:0f:00.0", "62")
        _sim(root, "mixed", "lose", "0000:47:00.0")
        port = _status_port(driver)

        def document() -> dict:
            return json.loads(_get(port, "/allocations")[1])

        assert eventually(lambda: [g["name"] for g in document()["lostGpus"]] == ["gpu-0000-47-00-0"]), driver.log
        assert eventually(
            lambda: {g["name"]: g for g in document()["gpus"]}["gpu-0000-0f-00-0"]["health"]["status"] == "UNHEALTHY"
        ), driver.log
        gpus = {g["name"]: g for g in document()["gpus"]}
        assert gpus["gpu-0000-07-00-0"]["migEnabled"] is True
        assert [d["profile"] for d in gpus["gpu-0000-07-00-0"]["migDevices"]] == ["3g.20gb", "2g.10gb", "1g.5gb"]
        assert gpus["gpu-0000-0f-00-0"]["health"]["taints"][0]["value"] == "62"

        capsys.readouterr()
        assert main(["top", "--address", f"http://127.0.0.1:{port}/", "--once"]) == 0
        lines = capsys.readouterr().out.splitlines()
        [holder] = [line for line in lines if "default/inference-0" in line]
        assert "└ mig-1g5gb-6" in holder and "1g.5gb" in holder and "inference" in holder
        free = [line for line in lines if "└ mig-" in line and " free " in f"{line} "]
        assert len(free) == 2 and "3g.20gb" in free[0] and "2g.10gb" in free[1]
        [gpu0] = [line for line in lines if line.startswith("gpu-0000-07-00-0")]
        assert " MIG " in gpu0 and " ok " in f"{gpu0} "
        [gpu1] = [line for line in lines if line.startswith("gpu-0000-0f-00-0")]
        assert "XID 62" in gpu1
        [lost] = [line for line in lines if line.startswith("gpu-0000-47-00-0")]
        assert lost.split()[1] == "lost"
        assert "node node-a: 1 allocated, 1 lost, 1 unhealthy" in lines
        assert any(line.startswith("lost: gpu-0000-47-00-0: ") for line in lines)
        assert any(line.startswith("unhealthy: gpu-0000-0f-00-0: ") and "XID 62" in line for line in lines)

        # The JSON output is the document: today's fields, and the new ones.
        assert main(["top", "--address", f"127.0.0.1:{port}", "-o", "json"]) == 0
        answered = json.loads(capsys.readouterr().out)
        assert {"node", "gpus", "allocations", "usage", "lostGpus", "migMode"} <= set(answered)
        assert (answered["ready"], answered["slicesPublished"], answered["publishError"]) == (True, True, None)
        assert {"name", "uuid", "productName", "index"} <= set(answered["gpus"][0])
    finally:
        driver.stop(signal.SIGKILL)
