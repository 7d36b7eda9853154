"""The soak: `dradriver run` on a simulated 8-GPU dynamic-MIG node, prepared and unprepared over and over with
mixed claims (whole GPU, one partition, partitions on two GPUs, MPS on a GPU or a partition, a time-sliced GPU)
and SIGKILLed at random moments, restarted each time as the kubelet would find it. MPS daemons are the simulated
node's stand-in, real processes that outlive a killed driver. Each process is measured on its own (RSS, open
files, threads once warm and at its end): growth across a restart would hide a leak that each process repeats.
With no kills, one process serves every cycle: the unkilled soak, where a slow leak has the longest to show. Used by
the short soak tests and by the benchmark's full soaks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dradriver.driver.prepare.checkpoint import read_records
from dradriver.gpu.models import ComputeMode
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, RegisteredPlugin, discover
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from support.apiserver import FakeApiServer, allocated_claim
from support.mps_daemons import daemon_dirs, kill_daemons, live_daemons, shm_mounts

DRIVER = "gpu.dradriver.dev"
NODE = "node-a"
PROFILE = "hgx-h100-80gb"
BUSES = ("1b", "43", "52", "61", "9d", "c3", "d1", "df")
TIMEOUT = 30.0


API = "gpu.dradriver.dev/v1alpha1"
MPS = {
    "apiVersion": API,
    "kind": "GpuConfig",
    "sharing": {
        "strategy": "MPS",
        "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "8Gi"},
    },
}
MIG_MPS = {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
TIME_SLICING = {
    "apiVersion": API,
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
}


def shapes() -> list[tuple[list[str], dict[str, Any] | None]]:
    """Mixed claims, each with its opaque config: a whole GPU, MPS on a whole GPU or time-slicing one (GPUs 4-7);
    one partition, plain or with MPS, and two partitions on two GPUs (GPUs 0-3)."""
    out: list[tuple[list[str], dict[str, Any] | None]] = []
    for i in range(12):
        out.append(([f"gpu-0000-{BUSES[4 + i % 4]}-00-0"], None))
        out.append(([f"gpu-0000-{BUSES[i % 4]}-00-0-mig-1g10gb-{i % 7}"], MIG_MPS if i % 3 == 0 else None))
        out.append(
            (
                [
                    f"gpu-0000-{BUSES[i % 2]}-00-0-mig-2g20gb-{2 * (i % 3)}",
                    f"gpu-0000-{BUSES[2 + i % 2]}-00-0-mig-3g40gb-4",
                ],
                None,
            )
        )
        out.append(([f"gpu-0000-{BUSES[4 + (i + 1) % 4]}-00-0"], MPS if i % 2 == 0 else TIME_SLICING))
    return out


#: Cycles a process serves before its first mark: its imports, caches and the gRPC pool's threads settle first.
WARM_UP = 20


@dataclass
class Mark:
    cycle: int
    rss_kib: int
    open_files: int
    threads: int


@dataclass
class ProcessMarks:
    """One `dradriver run` process, from its start until it was killed or stopped: its figures once warm (None
    when it was killed within ``WARM_UP`` cycles) and at its end, so that growth is measured inside each process
    (a restart starts afresh, so growth across a kill says nothing)."""

    started: int
    warm: Mark | None = None
    end: Mark | None = None

    def growth(self) -> Mark | None:
        """End minus warm, per figure (``cycle``: the cycles measured); None if the process has no warm mark."""
        if self.warm is None or self.end is None:
            return None
        return Mark(
            cycle=self.end.cycle - self.warm.cycle,
            rss_kib=self.end.rss_kib - self.warm.rss_kib,
            open_files=self.end.open_files - self.warm.open_files,
            threads=self.end.threads - self.warm.threads,
        )


@dataclass
class SoakResult:
    cycles: int = 0
    mps_cycles: int = 0  # cycles of a claim with an MPS daemon
    kills: int = 0
    processes: list[ProcessMarks] = field(default_factory=list)  # each process between kills, in order
    leftovers: dict[str, int] = field(default_factory=dict)  # after the last unprepare: what is still there

    def growths(self) -> list[Mark]:
        """The growth of every process that lived past its warm-up."""
        return [g for g in (p.growth() for p in self.processes) if g is not None]


def process_figures(pid: int) -> tuple[int, int]:
    """(RSS in KiB, threads) of a process, from /proc."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


class Driver:
    """One `dradriver run` process; the simulated hardware, CDI specs and checkpoint outlive it."""

    def __init__(self, root: Path, kubeconfig: Path) -> None:
        self.root = root
        for stale in (root / "registry").glob("*.sock") if (root / "registry").exists() else ():
            stale.unlink()
        command = [sys.executable, "-m", "dradriver", "run", "--node-name", NODE, "--kubeconfig", str(kubeconfig)]
        command += ["--gpu-backend", "sim", "--sim-profile", PROFILE, "--sim-state", str(root / "sim.json")]
        command += ["--mig-mode", "dynamic", "--rescan-interval", "0", "--metrics-address", "127.0.0.1:0"]
        command += ["--registry-dir", str(root / "registry"), "--plugin-dir", str(root / "plugin")]
        command += ["--cdi-dir", str(root / "cdi"), "--state-dir", str(root / "state")]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pause = threading.Event()
        deadline = time.monotonic() + TIMEOUT
        while True:  # only a poll sees a socket file appear, and the file is bound before the server listens
            assert self.proc.poll() is None and time.monotonic() < deadline, "dradriver run did not register"
            # discover() as the kubelet sees sockets: the plugin binds at a dot-name first, then renames.
            if (root / "registry").exists() and discover(root / "registry"):
                try:
                    self.kubelet = KubeletClient(root / "registry").register()
                    return
                except grpc.RpcError:
                    pass
            pause.wait(0.01)

    def kill(self) -> None:
        self.kubelet.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(TIMEOUT)

    def stop(self) -> None:
        self.kubelet.close()
        self.proc.terminate()
        self.proc.wait(TIMEOUT)


def cycle(kubelet: RegisteredPlugin, claim: Claim, mps_root: Path | None) -> None:
    """Prepare and unprepare ``claim``; with ``mps_root``, its MPS daemon must serve while it is prepared."""
    result = kubelet.prepare([claim], timeout=TIMEOUT)[claim.uid]
    assert result.error == "", result.error
    if mps_root is not None:
        assert claim.uid in live_daemons(mps_root), f"claim {claim.uid} has no MPS daemon"
    assert kubelet.unprepare([claim], timeout=TIMEOUT) == {claim.uid: ""}


def run_soak(root: Path, cycles: int, *, kill_every: int, seed: int = 1) -> SoakResult:
    """``cycles`` prepare+unprepare cycles; about every ``kill_every`` cycles (never, with 0) the driver is
    SIGKILLed with a call in flight (or with a claim prepared) and restarted, and the kubelet re-sends what it had
    not finished."""
    rng = random.Random(seed)
    result = SoakResult()
    with FakeApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubeconfig = api.write_kubeconfig(root / "kubeconfig")
        claims, uses_mps = [], set()
        for i, (devices, config) in enumerate(shapes()):
            claims.append(allocated_claim(api, f"soak-{i}", devices, config=config))
            if config is not None and config["sharing"]["strategy"] == "MPS":
                uses_mps.add(claims[-1].uid)
        mps_root = root / "state" / "mps"
        driver = Driver(root, kubeconfig)
        process = ProcessMarks(started=0)
        result.processes.append(process)
        try:
            for n in range(cycles):
                claim = rng.choice(claims)
                if kill_every and n and n % kill_every == 0 and n < cycles - max(30, cycles // 5):
                    process.end = _mark(driver, n)
                    in_flight = driver.kubelet.prepare_future([claim])
                    threading.Event().wait(rng.uniform(0, 0.01))  # a random moment of the prepare
                    driver.kill()
                    in_flight.cancel()
                    result.kills += 1
                    driver = Driver(root, kubeconfig)
                    process = ProcessMarks(started=n)
                    result.processes.append(process)
                # The kubelet re-sends the prepare it saw fail, then unprepares.
                cycle(driver.kubelet, claim, mps_root if claim.uid in uses_mps else None)
                result.mps_cycles += claim.uid in uses_mps
                result.cycles += 1
                if n + 1 == process.started + WARM_UP:
                    process.warm = _mark(driver, n + 1)
            process.end = _mark(driver, cycles)
        finally:
            driver.stop()
            kill_daemons(mps_root)  # after a failure, claims may be left prepared: their daemons must not linger
        node = SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json")
        result.leftovers = {
            "mig_instances": sum(len(g.gpu_instances) for g in node.gpus),
            "cdi_files": len(list((root / "cdi").glob("*.json"))) if (root / "cdi").exists() else 0,
            "temp_files": sum(1 for p in root.rglob("*.tmp")),
            "checkpoint_claims": len(read_records(root / "state" / "checkpoint.json")),
            "mps_daemons": len(live_daemons(mps_root)),
            "mps_dirs": len(daemon_dirs(mps_root)),
            "mps_shm_mounts": len(shm_mounts(mps_root)),
            # Compute modes and time-slices not back at the defaults the node started with.
            "gpu_settings": sum(1 for g in node.gpus if g.compute_mode != ComputeMode.DEFAULT or g.timeslice != 0),
        }
    return result


def _mark(driver: Driver, n: int) -> Mark:
    rss, threads = process_figures(driver.proc.pid)
    return Mark(cycle=n, rss_kib=rss, open_files=len(os.listdir(f"/proc/{driver.proc.pid}/fd")), threads=threads)


def as_json(result: SoakResult) -> dict[str, Any]:
    """The result as the benchmark writes it (``warm``: null for a process killed within its warm-up)."""
    return {
        "cycles": result.cycles,
        "mps_cycles": result.mps_cycles,
        "kills": result.kills,
        "processes": [
            {"started": p.started, "warm": p.warm and vars(p.warm), "end": p.end and vars(p.end)}
            for p in result.processes
        ],
        "leftovers": result.leftovers,
    }
