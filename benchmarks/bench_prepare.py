"""Benchmark: kubelet-facing latency of NodePrepareResources / NodeUnprepareResources on a simulated node.

    PYTHONPATH=src python benchmarks/bench_prepare.py [--claims 200]

Everything real except the API server (in memory) and the hardware (the simulator behind the NVML adapter):
gRPC over unix sockets, claim GET and checks, CDI spec written with fsync, per-claim locks. The kubelet allows
45 s per call; the anchors' practical target is p99 < 2 s for a whole GPU (see shared/spec/anchors.md §4); our
target for carving one MIG partition on the simulated node is p50 < 20 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from dradriver.driver.cdi import CdiWriter  # noqa: E402
from dradriver.driver.checkpoint import CheckpointStore  # noqa: E402
from dradriver.driver.slices import SliceSettings, build_slice_specs  # noqa: E402
from dradriver.driver.state import GpuDriver  # noqa: E402
from dradriver.gpu.fakelib import simulated_gpulib  # noqa: E402
from dradriver.gpu.inventory import MigMode, discover  # noqa: E402
from dradriver.plugin.kubelet_client import Claim, KubeletClient  # noqa: E402
from dradriver.plugin.kubelet_plugin import KubeletPlugin  # noqa: E402
from dradriver.plugin.memory_cluster import MemoryCluster  # noqa: E402

DRIVER = "gpu.dradriver.dev"
NODE = "bench-node"


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return (
        f"p50 {at(0.50):6.2f} ms  p90 {at(0.90):6.2f} ms  p99 {at(0.99):6.2f} ms  "
        f"mean {statistics.fmean(ordered) * 1000:6.2f} ms  (n={len(ordered)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument(
        "--state-dir",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="where the MIG benchmark keeps its checkpoint (default: /dev/shm, so the figure is the driver's and "
        "the simulator's cost; each prepare writes the checkpoint 5 times, each write two fsyncs: on a disk "
        "add 10 x its fsync latency)",
    )
    args = parser.parse_args()

    gpulib, _ = simulated_gpulib("dgx-a100-80gb", node_name=NODE)
    started = time.perf_counter()
    inventory = discover(gpulib)
    discovered = time.perf_counter() - started
    started = time.perf_counter()
    specs = build_slice_specs(inventory, SliceSettings(mig_mode=MigMode.DYNAMIC))
    built = time.perf_counter() - started
    gpulib.close()
    print(f"discovery of 8 GPUs (NVML adapter on the simulator): {discovered * 1000:.1f} ms")
    print(f"slices for dynamic MIG ({sum(len(s.get('devices', ())) for s in specs)} devices): {built * 1000:.1f} ms")

    cluster = MemoryCluster(validate=False)
    devices = [g.name for g in inventory.gpus]
    claims = []
    for i in range(args.claims):
        stored = cluster.add_resource_claim(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{i}", "namespace": "bench"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": devices[i % len(devices)]}
                            ]
                        }
                    }
                },
            }
        )
        claims.append(Claim("bench", stored["metadata"]["name"], stored["metadata"]["uid"]))

    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    try:
        driver = GpuDriver(
            driver_name=DRIVER, pool=NODE, inventory=inventory, mig_mode=MigMode.STATIC, cdi=CdiWriter(root / "cdi")
        )
        plugin = KubeletPlugin(
            driver_name=DRIVER,
            node_name=NODE,
            handler=driver,
            claim_source=cluster,
            registry_dir=root / "registry",
            plugin_dir=root / "plugin",
        )
        with plugin, KubeletClient(root / "registry").register() as kubelet:

            def timed(call: str, claim: Claim) -> float:
                began = time.perf_counter()
                result = getattr(kubelet, call)([claim])[claim.uid]
                elapsed = time.perf_counter() - began
                assert not (result.error if call == "prepare" else result), result
                return elapsed

            kubelet.prepare(claims[:5])  # warm up channels and caches
            kubelet.unprepare(claims[:5])
            # A GPU is prepared for one claim at a time, so each claim is unprepared before the next one comes.
            prepare_times, unprepare_times = [], []
            for claim in claims:
                prepare_times.append(timed("prepare", claim))
                unprepare_times.append(timed("unprepare", claim))
            print(f"prepare, one claim per call:      {percentiles(prepare_times)}")
            print(f"unprepare, one claim per call:    {percentiles(unprepare_times)}")

            def one_gpu(gpu: int) -> list[float]:
                # Like pods starting one after another on each GPU, all GPUs at once.
                mine = [c for i, c in enumerate(claims) if i % len(devices) == gpu]
                samples = []
                for claim in mine:
                    samples.append(timed("prepare", claim))
                    timed("unprepare", claim)
                return samples

            with ThreadPoolExecutor(len(devices)) as pool:
                began = time.perf_counter()
                samples = [t for per_gpu in pool.map(one_gpu, range(len(devices))) for t in per_gpu]
                wall = time.perf_counter() - began
            print(
                f"prepare, {len(devices)} GPUs busy at once:    {percentiles(samples)}; "
                f"{len(claims) / wall:.0f} prepare+unprepare cycles/s"
            )
            batch = claims[: len(devices)]
            began = time.perf_counter()
            result = kubelet.prepare(batch)
            ok = sum(1 for r in result.values() if not r.error)
            print(
                f"prepare, one batch of {len(batch)} claims (one per GPU): "
                f"{(time.perf_counter() - began) * 1000:.1f} ms ({ok} ok)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bench_partitions(args.claims, args.state_dir)
    return 0


def bench_partitions(count: int, state_parent: str | None) -> None:
    """Dynamic MIG: each prepare carves one 1g partition (GPU instance + compute instance, MIG UUID read back,
    checkpoint written before and after each step), each unprepare destroys it."""
    gpulib, _ = simulated_gpulib("hgx-h100-80gb", node_name=NODE)
    inventory = discover(gpulib)
    partitions = [f"{g.name}-mig-1g10gb-{start}" for g in inventory.gpus for start in range(7)]
    cluster = MemoryCluster(validate=False)
    claims = []
    for i in range(count):
        stored = cluster.add_resource_claim(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"mig-{i}", "namespace": "bench"},
                "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig"}}]}},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"request": "mig", "driver": DRIVER, "pool": NODE, "device": partitions[i % 56]}
                            ]
                        }
                    }
                },
            }
        )
        claims.append(Claim("bench", stored["metadata"]["name"], stored["metadata"]["uid"]))
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    state = Path(tempfile.mkdtemp(prefix="dra-bench-state-", dir=state_parent))
    store = CheckpointStore.open(state, boot_id="bench")
    try:
        driver = GpuDriver(
            driver_name=DRIVER,
            pool=NODE,
            inventory=inventory,
            mig_mode=MigMode.DYNAMIC,
            cdi=CdiWriter(root / "cdi"),
            gpulib=gpulib,
            checkpoint=store,
        )
        plugin = KubeletPlugin(
            driver_name=DRIVER,
            node_name=NODE,
            handler=driver,
            claim_source=cluster,
            registry_dir=root / "registry",
            plugin_dir=root / "plugin",
        )
        with plugin, KubeletClient(root / "registry").register() as kubelet:
            kubelet.prepare(claims[:8])  # warm up; also switches the GPUs into MIG mode once
            kubelet.unprepare(claims[:8])
            prepare_times, unprepare_times = [], []
            for claim in claims:
                began = time.perf_counter()
                result = kubelet.prepare([claim])[claim.uid]
                prepare_times.append(time.perf_counter() - began)
                assert not result.error, result.error
                began = time.perf_counter()
                assert not kubelet.unprepare([claim])[claim.uid]
                unprepare_times.append(time.perf_counter() - began)
            print(f"checkpoint in {state}")
            print(f"prepare, one MIG partition carved (dynamic, checkpointed): {percentiles(prepare_times)}")
            print(f"unprepare, one MIG partition destroyed:                   {percentiles(unprepare_times)}")
    finally:
        store.close()
        gpulib.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
