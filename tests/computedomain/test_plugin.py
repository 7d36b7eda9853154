"""The ComputeDomain node side assembled: what its start clears away, and the GPU drivers it serves."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import pytest
from support.fake_rest import FakeRest
from support.short_dirs import short_dir

from dradriver.computedomain import api
from dradriver.computedomain.fabric import IMEX_DNS_NAMES_MIN_DRIVER
from dradriver.computedomain.node import NodeFacts
from dradriver.computedomain.plugin import ComputeDomainPlugin, ComputeDomainPluginOptions, read_facts
from dradriver.gpu.backend import open_gpu_backend, simulated_proc_root
from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef
from dradriver.validation.slices import SliceShape

NODE = "tray-a"
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"
POD_UID = "0b6f3c1e-5a4d-4f7e-9c2b-1d2e3f4a5b6c"
OLD_DRIVER = "570.148.08"  # the last R570 release before IMEX took DNS names


@pytest.fixture
def root() -> Iterator[Path]:
    with short_dir("cd-") as path:
        yield path


@pytest.fixture
def started(root: Path) -> Iterator[Callable[..., tuple[ComputeDomainPlugin, MemoryCluster]]]:
    """Start a plugin on ``root`` serving ``facts``; every plugin started is stopped at teardown."""
    plugins: list[ComputeDomainPlugin] = []

    def start(facts: NodeFacts, *, pod_uid: str | None = None) -> tuple[ComputeDomainPlugin, MemoryCluster]:
        options = ComputeDomainPluginOptions(
            namespace="dradriver",
            registry_dir=root / "registry",
            plugin_dir=root / "plugin",
            cdi_dir=root / "cdi",
            node_uid=None,
            shape=SliceShape.V1_35,
            pod_uid=pod_uid,
            refresh_interval=0,
        )
        cluster = MemoryCluster()
        cluster.add_node(NODE)
        plugin = ComputeDomainPlugin(options, read=lambda: facts, cluster=cluster, rest=FakeRest())  # type: ignore[arg-type]
        plugins.append(plugin)
        plugin.start()
        return plugin, cluster

    yield start
    for plugin in plugins:
        plugin.stop()


def dead_pid() -> int:
    """The PID of a process that has exited (and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def tray_profile(tmp_path: Path, driver_version: str) -> str:
    """A GB200 tray's profile file with another GPU driver version."""
    text = resources.files("dradriver.sim").joinpath("data/nodes/gb200-nvl72-tray.yaml").read_text()
    assert 'driverVersion: "580.65.06"' in text
    path = tmp_path / "tray.yaml"
    path.write_text(text.replace('driverVersion: "580.65.06"', f'driverVersion: "{driver_version}"'))
    return str(path)


@pytest.mark.parametrize("pod_uid", [None, POD_UID], ids=["one-instance", "rolling-update"])
def test_start_removes_the_temp_files_a_killed_write_left_and_nothing_else(
    root: Path, started: Callable[..., tuple[ComputeDomainPlugin, MemoryCluster]], pod_uid: str | None
) -> None:
    plugin_dir, cdi_dir = root / "plugin", root / "cdi"
    plugin_dir.mkdir()
    cdi_dir.mkdir()
    spec = f"{api.CDI_VENDOR}-claim_uid-1.json"
    (cdi_dir / spec).write_text("{}")
    leftovers = [
        # PID 1 is alive here: in a container it is a killed earlier run's PID too, so the PID proves nothing.
        plugin_dir / ".checkpoint.json.1.k1ll3d.tmp",
        cdi_dir / f".{spec}.{dead_pid()}.abc123.tmp",
    ]
    foreign = [
        cdi_dir / f".k8s.gpu.dradriver.dev-claim_uid-1.json.{dead_pid()}.abc123.tmp",  # the GPU driver's
        cdi_dir / f".other.example.com-claim_uid-1.json.{dead_pid()}.abc123.tmp",  # another program's
        cdi_dir / ".nvidia.com-gpu_uid-1.tmp",
        plugin_dir / "notes.tmp",
    ]
    for path in leftovers + foreign:
        path.write_text('{"half": ')

    started(NodeFacts(NODE, CLIQUE, 237, None), pod_uid=pod_uid)

    assert [p.name for p in leftovers if p.exists()] == []
    assert [p.name for p in foreign if not p.exists()] == []
    assert (cdi_dir / spec).read_text() == "{}"


def test_a_gpu_driver_older_than_imex_dns_names_serves_no_driver_managed_domain(
    root: Path, tmp_path: Path, started: Callable[..., tuple[ComputeDomainPlugin, MemoryCluster]]
) -> None:
    gpulib, _ = open_gpu_backend("sim", sim_profile=tray_profile(tmp_path, OLD_DRIVER))
    facts = read_facts(gpulib, NODE, simulated_proc_root(tmp_path / "proc"))
    assert facts.problem == (
        f"GPU driver {OLD_DRIVER} is older than {IMEX_DNS_NAMES_MIN_DRIVER}, the first whose IMEX daemon finds its "
        "peers by DNS name, as driver-managed ComputeDomains' daemons do: upgrade the node's GPU driver to "
        f"{IMEX_DNS_NAMES_MIN_DRIVER} or newer, or run the node's own nvidia-imex service and serve domains from it "
        "with --imex-mode hostManaged (the chart's computeDomains.imex.mode), which works on older drivers"
    )

    plugin, cluster = started(facts)
    assert plugin.publisher.wait_synced(10.0)
    slices, _ = cluster.list_resource_slices(driver=api.DRIVER_NAME, node_name=NODE)
    assert [s["spec"].get("devices", []) for s in slices] == [[]]
    claim = AllocatedClaim(
        ref=ClaimRef("team", "job-channel", "uid-1"),
        devices=(AllocatedDevice(request="channel", pool=NODE, device="channel-0"),),
        config=(),
    )
    error = plugin.driver.prepare_resource_claims([claim])["uid-1"].error
    assert error is not None and f"GPU driver {OLD_DRIVER} is older than" in error


@pytest.mark.parametrize("version", [IMEX_DNS_NAMES_MIN_DRIVER, "570.158.1", "575.51.03", "580.65"])
def test_a_gpu_driver_from_imex_dns_names_on_serves_driver_managed_domains(tmp_path: Path, version: str) -> None:
    gpulib, _ = open_gpu_backend("sim", sim_profile=tray_profile(tmp_path, version))
    facts = read_facts(gpulib, NODE, simulated_proc_root(tmp_path / "proc"))
    assert (facts.clique_id, facts.problem) == (CLIQUE, "")


def test_host_managed_imex_serves_on_an_older_gpu_driver(tmp_path: Path) -> None:
    gpulib, _ = open_gpu_backend("sim", sim_profile=tray_profile(tmp_path, OLD_DRIVER))
    facts = read_facts(gpulib, NODE, simulated_proc_root(tmp_path / "proc"), host_managed=True)
    assert (facts.clique_id, facts.problem) == (CLIQUE, "")
