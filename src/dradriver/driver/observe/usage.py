"""How busy each device is, and how much of it each pod holds: NVML read every ``--usage-interval`` on a thread of
its own, so a scrape (and ``dradriver top``) only formats the last sample and never waits on NVML.

Per device: utilisation, memory used and total, temperature, power, uncorrectable ECC errors (what NVML reports for
it: a MIG device has no utilisation, temperature or power of its own). Per pod: the device memory its processes
hold, from NVML's running-process list, each PID mapped to its pod through the PID's cgroup (the kubelet names a
pod's cgroup after its UID), and the UID to the pod holding the device. That matters most for MPS and
time-sliced claims, where several pods share one device. The driver's pod needs the host's PID namespace
(``hostPID``) to see the PIDs NVML reports; without it no process maps and the per-pod figures are absent."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dradriver.driver.observe.allocations import Allocation
from dradriver.gpu.errors import GpuError
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.models import DeviceUsage

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 15.0

# The kubelet's pod cgroup: ".../kubepods/burstable/pod<uid>/..." (cgroupfs) or
# ".../kubepods-burstable-pod<uid with _>.slice/..." (systemd).
_POD_CGROUP = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@dataclass(frozen=True)
class Device:
    """A device to sample: its name in our slices, its UUID and its GPU's."""

    name: str
    uuid: str
    gpu_uuid: str


@dataclass(frozen=True)
class PodMemory:
    """Device memory the processes of one pod hold on one of its allocated devices."""

    allocation: Allocation
    used_bytes: int
    processes: int


@dataclass(frozen=True)
class UsageSample:
    taken_at: float  # Unix time
    duration_seconds: float  # what reading NVML took
    devices: tuple[tuple[Device, DeviceUsage], ...]
    pods: tuple[PodMemory, ...]

    def to_json(self) -> list[dict[str, Any]]:
        """Per device, camelCase, as /allocations serves it to ``dradriver top``."""
        pods: dict[str, list[dict[str, Any]]] = {}
        for p in self.pods:
            entry = {"namespace": p.allocation.namespace, "pod": p.allocation.pod, "memoryUsedBytes": p.used_bytes}
            pods.setdefault(p.allocation.uuid, []).append(entry)
        return [
            {
                "device": device.name,
                "uuid": usage.uuid,
                "gpuUUID": device.gpu_uuid,
                "utilizationPercent": usage.utilization_percent,
                "memoryUsedBytes": usage.memory_used_bytes,
                "memoryTotalBytes": usage.memory_total_bytes,
                "temperatureCelsius": usage.temperature_celsius,
                "powerWatts": usage.power_watts,
                "eccUncorrectedVolatile": usage.ecc_uncorrected_volatile,
                "processes": len(usage.processes),
                "pods": pods.get(usage.uuid, []),
            }
            for device, usage in self.devices
        ]


def pod_uid_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The UID of the pod whose cgroup holds ``pid``, or None (not a pod's process, gone, or not visible)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    found = _POD_CGROUP.search(text)
    return found.group(1).replace("_", "-") if found else None


class UsageSampler:
    """Samples every device of ``devices()`` and maps processes to the pods of ``allocations()``."""

    def __init__(
        self,
        gpulib: GpuLib,
        devices: Callable[[], Sequence[Device]],
        allocations: Callable[[], Sequence[Allocation]],
        *,
        pod_of_pid: Callable[[int], str | None] = pod_uid_of_pid,
    ) -> None:
        """``pod_of_pid`` is a seam for tests (a simulated node's PIDs are nobody's)."""
        self._gpulib = gpulib
        self._devices = devices
        self._unreadable: set[str] = set()
        self._allocations = allocations
        self._pod_of_pid = pod_of_pid
        self._latest: UsageSample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def latest(self) -> UsageSample | None:
        return self._latest

    def sample(self) -> UsageSample:
        """Read NVML once for every device (a device that fails is left out of this sample, and logged)."""
        began, taken_at = time.perf_counter(), time.time()
        read: list[tuple[Device, DeviceUsage]] = []
        for device in self._devices():
            try:
                read.append((device, self._gpulib.usage(device.uuid)))
            except GpuError as err:
                # Once per device at warning level: a device that never answers would vanish from /metrics and
                # `top` without a word; later failures stay at debug (one line per sample would flood the log).
                if device.name not in self._unreadable:
                    self._unreadable.add(device.name)
                    log.warning(
                        "usage not read, the device is left out of the samples device=%s error=%s", device.name, err
                    )
                else:
                    log.debug("usage not read device=%s error=%s", device.name, err)
        sample = UsageSample(
            taken_at=taken_at,
            duration_seconds=time.perf_counter() - began,
            devices=tuple(read),
            pods=tuple(self._pod_memory(read)),
        )
        self._latest = sample
        return sample

    def _pod_memory(self, read: Sequence[tuple[Device, DeviceUsage]]) -> Iterator[PodMemory]:
        held = {(a.uuid, a.pod_uid): a for a in self._allocations() if a.pod_uid}
        if not held:
            return
        pods: dict[int, str | None] = {}  # a PID listed on a GPU and on its MIG device is looked up once
        for _device, usage in read:
            totals: dict[str, tuple[int, int]] = {}
            for process in usage.processes:
                if process.pid not in pods:
                    pods[process.pid] = self._pod_of_pid(process.pid)
                pod = pods[process.pid]
                if pod is None or (usage.uuid, pod) not in held:
                    continue
                used, count = totals.get(pod, (0, 0))
                totals[pod] = (used + (process.used_memory_bytes or 0), count + 1)
            for pod, (used, count) in sorted(totals.items()):
                yield PodMemory(held[(usage.uuid, pod)], used, count)

    def start(self, interval: float) -> None:
        """Sample now and every ``interval`` seconds until ``stop``."""
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="usage", daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # the thread must outlive one failure, or the figures silently freeze
                log.exception("usage sample failed; retrying at the next interval")
            self._stop.wait(interval)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class UsageCollector(Collector):
    """The last sample as Prometheus series (nothing before the first sample)."""

    def __init__(self, sampler: UsageSampler) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[Any]:
        sample = self._sampler.latest
        if sample is None:
            return
        labels = ["device", "uuid", "gpu_uuid"]
        families = {
            "util": GaugeMetricFamily(
                "dradriver_device_utilization_ratio",
                "Fraction of the last sample period the device was busy (NVML; absent for MIG devices and GPUs in "
                "MIG mode, where NVML does not report it)",
                labels=labels,
            ),
            "used": GaugeMetricFamily("dradriver_device_memory_used_bytes", "Device memory in use", labels=labels),
            "total": GaugeMetricFamily("dradriver_device_memory_total_bytes", "Device memory in all", labels=labels),
            "temp": GaugeMetricFamily("dradriver_device_temperature_celsius", "GPU temperature", labels=labels),
            "power": GaugeMetricFamily("dradriver_device_power_watts", "GPU power draw", labels=labels),
            "ecc": GaugeMetricFamily(
                "dradriver_device_ecc_uncorrected_errors",
                "Uncorrectable ECC errors since the GPU was last reset (NVML's volatile counter)",
                labels=labels,
            ),
            "procs": GaugeMetricFamily(
                "dradriver_device_processes", "Compute processes NVML lists on the device", labels=labels
            ),
        }
        for device, usage in sample.devices:
            values = [device.name, usage.uuid, device.gpu_uuid]
            for key, figure in (
                ("util", None if usage.utilization_percent is None else usage.utilization_percent / 100),
                ("used", usage.memory_used_bytes),
                ("total", usage.memory_total_bytes),
                ("temp", usage.temperature_celsius),
                ("power", usage.power_watts),
                ("ecc", usage.ecc_uncorrected_volatile),
                ("procs", len(usage.processes)),
            ):
                if figure is not None:
                    families[key].add_metric(values, figure)
        yield from families.values()
        pods = GaugeMetricFamily(
            "dradriver_pod_device_memory_used_bytes",
            "Device memory the processes of a pod hold on a device allocated to it (NVML's running processes, "
            "mapped to pods by their cgroup)",
            labels=["namespace", "pod", "claim", "device", "uuid"],
        )
        for p in sample.pods:
            a = p.allocation
            pods.add_metric([a.namespace, a.pod, a.claim, a.device, a.uuid], p.used_bytes)
        yield pods
        yield GaugeMetricFamily(
            "dradriver_usage_sample_duration_seconds",
            "Time the last usage sample spent in NVML",
            value=sample.duration_seconds,
        )
        yield GaugeMetricFamily(
            "dradriver_usage_sample_timestamp_seconds", "When the last usage sample was taken", value=sample.taken_at
        )
