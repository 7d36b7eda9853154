"""Benchmark: the ResourceClaim status PATCH that prepare writes, against the real kube-apiserver, through the
cluster adapter (``KubeCluster.update_resource_claim_status`` over ``plugin/cluster/transport.py``), sent three
ways on the wire:

- ``nodelay-one-write``: ``TCP_NODELAY`` and headers and body in one write, as Go's client sends a small request;
- ``nodelay-two-writes``: ``TCP_NODELAY``, headers then body (urllib3's way, and so the transport's);
- ``nagle-two-writes``: without ``TCP_NODELAY``, headers then body (``http.client``'s way, the hand-written
  transport's before urllib3).

    python benchmarks/bench_status_patch.py [--patches 200] [--rounds 5] [--json FILE]

Each round runs every way in turn (a fresh adapter, a few patches to warm up, then ``--patches`` timed ones),
starting with another way each round, so load on the machine falls on all alike; each patch changes the claim
(the server writes it to etcd). Needs the control plane ``scripts/build-control-plane`` builds (etcd and
kube-apiserver; ~/.cache/dradriver). Prints the median, p90 and mean per way in milliseconds, and writes them as
JSON (the last run's: benchmarks/status-patch.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from urllib3._version import __version__ as URLLIB3_VERSION  # noqa: E402
from urllib3.connection import HTTPConnection, HTTPSConnection  # noqa: E402
from urllib3.connectionpool import HTTPSConnectionPool  # noqa: E402

from dradriver.plugin.cluster.kube import KubeCluster, load_transport  # noqa: E402
from dradriver.plugin.cluster.port import JsonObject  # noqa: E402

DRIVER = "gpu.dradriver.dev"
WARM_UP = 10
WAYS = ("nodelay-one-write", "nodelay-two-writes", "nagle-two-writes")


class OneWriteConnection(HTTPSConnection):
    """urllib3's connection, holding what ``request`` sends (headers, then the body) for one ``sendall``."""

    held: list[bytes] | None = None

    def request(self, *args: Any, **kwargs: Any) -> None:
        self.held = []
        try:
            super().request(*args, **kwargs)
            data = b"".join(self.held)
        finally:
            self.held = None
        super().send(data)

    def send(self, data: Any) -> None:
        if self.held is not None:
            self.held.append(bytes(data))
        else:
            super().send(data)


@contextlib.contextmanager
def sent_as(way: str) -> Iterator[None]:
    """urllib3's connections set up as ``way`` for the block (class attributes: the transport builds its pools
    from them)."""
    saved = HTTPConnection.default_socket_options, HTTPSConnectionPool.ConnectionCls
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    HTTPConnection.default_socket_options = nodelay if way.startswith("nodelay") else []
    HTTPSConnectionPool.ConnectionCls = OneWriteConnection if way.endswith("one-write") else HTTPSConnection
    try:
        yield
    finally:
        HTTPConnection.default_socket_options, HTTPSConnectionPool.ConnectionCls = saved


def allocated_claim(kube: Any) -> JsonObject:
    """A claim allocated as the scheduler writes it (status.allocation), so status.devices may name its device."""
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    claim: JsonObject = kube.request("POST", claims, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "bench"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}},
    })  # fmt: skip
    claim["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n", "device": "gpu-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "0b7e3a53-6b0e-4c1e-9d47-1f9f6f5d2c11"}],
    }
    result: JsonObject = kube.request("PUT", f"{claims}/bench/status", claim)
    return result


def patch_times(kubeconfig: Path, claim: JsonObject, way: str, count: int, first: int) -> list[float]:
    """Seconds of each of ``count`` status patches sent ``way`` (after a warm-up), numbered from ``first`` so
    each one changes the claim."""
    with sent_as(way):
        cluster = KubeCluster(load_transport(str(kubeconfig)))
    times = []
    try:
        for n in range(first, first + WARM_UP + count):
            device = {"driver": DRIVER, "pool": "n", "device": "gpu-0", "data": {"patch": n}}
            status: JsonObject = {**claim, "status": {**claim["status"], "devices": [device]}}
            status["metadata"] = {k: v for k, v in claim["metadata"].items() if k != "resourceVersion"}
            start = time.perf_counter()
            cluster.update_resource_claim_status(status)
            if n >= first + WARM_UP:
                times.append(time.perf_counter() - start)
    finally:
        cluster.close()
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "patches": len(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from support.control_plane import ControlPlane, binaries_dir, missing_binaries

    binaries = binaries_dir()
    if missing_binaries(binaries):
        print(f"no control plane in {binaries}: run scripts/build-control-plane", file=sys.stderr)
        return 2
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="dra-patch-") as root:
        plane = ControlPlane(binaries, Path(root))
        try:
            plane.start_api_server()
            claim = allocated_claim(plane.kube)
            for round_ in range(args.rounds):
                # Each round starts with another way, so none is always the first after the server's start.
                for i, way in enumerate(WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]):
                    first = (round_ * len(WAYS) + i) * (WARM_UP + args.patches)
                    times[way] += patch_times(plane.kubeconfig, claim, way, args.patches, first)
        finally:
            plane.stop()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "urllib3": URLLIB3_VERSION},
        "load": os.getloadavg()[0],
        "ways": {way: summary(t) for way, t in times.items()},
    }
    for way, figures in results["ways"].items():
        p50, p90, mean = figures["p50_ms"], figures["p90_ms"], figures["mean_ms"]
        print(f"{way:20} p50 {p50:7.2f} ms  p90 {p90:7.2f} ms  mean {mean:7.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
