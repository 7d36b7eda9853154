"""100 MIG claims in one call and in 100 concurrent calls, on a simulated 16-GPU node: every claim gets its own
partition, carved on the hardware, and every CDI id is distinct."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import AllocatedClaim, AllocatedDevice, ClaimRef
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

COUNT = 100
PARTITIONS = [f"gpu-0000-{0x10 + g:02x}-00-0-mig-1g10gb-{s}" for g in range(16) for s in range(7)]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[GpuDriver, SimulatedNode]]:
    # Correctness, not speed, is tested here: the files go to memory where it can (the benchmark uses the disk).
    files = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path
    profile = tmp_path / "h100x16.yaml"
    gpus = "\n".join(
        f'  - {{product: NVIDIA H100 80GB HBM3, pciBusId: "0000:{0x10 + i:02x}:00.0", numaNode: 0}}' for i in range(16)
    )
    profile.write_text(f"name: h100-x16\ngpus:\n{gpus}\n")
    sim = SimulatedNode(load_node_profile(str(profile)), node_name="node-a")
    gpulib = simulated_gpulib_on(sim)
    store = CheckpointStore.open(files / "state", boot_id="b")
    driver = GpuDriver(
        GpuDriverOptions(driver_name="gpu.dradriver.dev", pool="node-a", mig_mode=MigMode.DYNAMIC),
        inventory=discover(gpulib),
        cdi=CdiWriter(files / "cdi"),
        gpulib=gpulib,
        checkpoint=store,
    )
    yield driver, sim
    store.close()
    shutil.rmtree(files, ignore_errors=True)


def claims() -> list[AllocatedClaim]:
    return [
        AllocatedClaim(
            ref=ClaimRef("default", f"c{i}", f"u{i}"),
            devices=(AllocatedDevice(request="r", pool="node-a", device=PARTITIONS[i], admin_access=False),),
        )
        for i in range(COUNT)
    ]


def assert_disjoint(results: dict[str, list[str]], sim: SimulatedNode) -> None:
    assert len(results) == COUNT
    ids = [i for found in results.values() for i in found]
    assert len(ids) == len(set(ids)) == COUNT
    carved = {(g.uuid, gi.placement.start) for g in sim.gpus for gi in g.gpu_instances.values()}
    assert len(carved) == COUNT


def test_a_hundred_claims_in_one_call(node: tuple[GpuDriver, SimulatedNode]) -> None:
    driver, sim = node
    batch = claims()
    results = driver.prepare_resource_claims(batch)
    assert all(r.error is None for r in results.values())
    assert_disjoint({uid: [i for d in r.devices for i in d.cdi_device_ids] for uid, r in results.items()}, sim)
    assert driver.unprepare_resource_claims([c.ref for c in batch]) == {c.ref.uid: None for c in batch}
    assert sum(len(g.gpu_instances) for g in sim.gpus) == 0


def test_a_hundred_concurrent_calls(node: tuple[GpuDriver, SimulatedNode]) -> None:
    driver, sim = node
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(lambda c: (c.uid, driver.prepare_resource_claims([c])[c.uid]), claims()))
        assert all(r.error is None for _, r in outcomes)
        assert_disjoint({uid: [i for d in r.devices for i in d.cdi_device_ids] for uid, r in outcomes}, sim)
        errors = list(pool.map(lambda c: driver.unprepare_resource_claims([c.ref])[c.uid], claims()))
    assert errors == [None] * COUNT and sum(len(g.gpu_instances) for g in sim.gpus) == 0
