"""Device usage from NVML: what the simulated NVML answers (as real NVML does), pods found by their processes'
cgroups, the series a scrape shows, and the scrape budget on an 8-GPU node split into 56 MIG devices."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dradriver.driver.observe.allocations import Allocation
from dradriver.driver.observe.usage import Device, UsageCollector, UsageSampler, pod_uid_of_pid
from dradriver.gpu.errors import NotSupported
from dradriver.gpu.inventory import discover
from dradriver.sim.fakelib import simulated_gpulib, simulated_gpulib_on
from dradriver.sim.node import SimulatedNode, full_compute_instance_profile
from dradriver.sim.profiles import load_node_profile

POD_A = "0b5e7f4a-1c2d-4e3f-8a9b-0c1d2e3f4a5b"
POD_B = "9f8e7d6c-5b4a-4321-8fed-cba987654321"
GIB = 1 << 30


def allocation(device: str, uuid: str, gpu_uuid: str, pod: str, pod_uid: str) -> Allocation:
    return Allocation(
        namespace="ml",
        pod=pod,
        pod_uid=pod_uid,
        claim="shared",
        claim_uid="c1",
        requests=("gpu",),
        device=device,
        uuid=uuid,
        gpu=device,
        gpu_uuid=gpu_uuid,
        mig_profile="",
        gpu_instance_id=None,
        sharing="mps",
    )


def test_a_mig_device_has_memory_and_processes_but_no_utilization_temperature_or_power() -> None:
    lib, node = simulated_gpulib("mixed")
    split, whole = lib.gpus()[0], lib.gpus()[1]
    mig = lib.mig_devices(split.uuid)[0]
    node.start_process(mig.uuid, 700, 2 * GIB, 30)
    node.start_process(whole.uuid, 800, 3 * GIB, 60)
    on_mig = lib.usage(mig.uuid)
    assert (on_mig.utilization_percent, on_mig.temperature_celsius, on_mig.power_watts) == (None, None, None)
    assert on_mig.memory_used_bytes is not None and on_mig.memory_used_bytes >= 2 * GIB
    assert [(p.pid, p.used_memory_bytes) for p in on_mig.processes] == [(700, 2 * GIB)]
    # The GPU in MIG mode lists its MIG devices' processes with their instance ids, but no utilisation.
    on_split = lib.usage(split.uuid)
    assert on_split.utilization_percent is None and on_split.temperature_celsius is not None
    assert [(p.pid, p.gpu_instance_id) for p in on_split.processes] == [(700, mig.gpu_instance_id)]
    on_whole = lib.usage(whole.uuid)
    assert on_whole.utilization_percent == 60 and on_whole.ecc_uncorrected_volatile == 0
    assert on_whole.power_watts is not None and on_whole.power_watts > lib.usage(lib.gpus()[2].uuid).power_watts  # type: ignore[operator]
    assert [(p.pid, p.gpu_instance_id) for p in on_whole.processes] == [(800, None)]
    node.end_process(800)
    assert lib.usage(whole.uuid).processes == ()


def test_the_nvml_calls_answer_not_supported_on_a_mig_handle_as_on_hardware() -> None:
    lib, _ = simulated_gpulib("mixed")
    mig = lib.mig_devices(lib.gpus()[0].uuid)[0]
    handle = lib._handle(mig.uuid)
    for call, args in (
        ("nvmlDeviceGetUtilizationRates", ()),
        ("nvmlDeviceGetTemperature", (0,)),
        ("nvmlDeviceGetPowerUsage", ()),
    ):
        with pytest.raises(NotSupported):
            lib._call(call, handle, *args, device=mig.uuid)


def test_processes_outlive_a_restart_through_the_state_file_and_end_with_a_reset(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    first = SimulatedNode(load_node_profile("mixed"), state_path=state)
    first.start_process(first.gpus[1].uuid, 42, GIB, 10)
    again = SimulatedNode(load_node_profile("mixed"), state_path=state)
    assert [p.pid for p in again.processes_on(1)] == [42]
    again.reset_gpu(1)
    assert again.processes_on(1) == []


def test_a_pid_is_mapped_to_its_pod_by_the_kubelets_cgroup_names(tmp_path: Path) -> None:
    for pid, line in (
        (
            10,
            f"0::/kubepods.slice/kubepods-burstable-pod{POD_A.replace('-', '_')}.slice/cri-containerd-1.scope\n",
        ),
        (11, f"12:memory:/kubepods/besteffort/pod{POD_B}/0123abcd\n"),
        (12, "0::/system.slice/nvidia-persistenced.service\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(line)
    assert pod_uid_of_pid(10, tmp_path) == POD_A
    assert pod_uid_of_pid(11, tmp_path) == POD_B
    assert pod_uid_of_pid(12, tmp_path) is None
    assert pod_uid_of_pid(13, tmp_path) is None  # gone, or in another PID namespace


def test_two_pods_sharing_a_gpu_get_their_own_memory_series() -> None:
    lib, node = simulated_gpulib("mixed")
    gpu = lib.gpus()[1]
    name = "gpu-0000-0f-00-0"
    node.start_process(gpu.uuid, 100, 3 * GIB, 40)
    node.start_process(gpu.uuid, 101, 1 * GIB, 10)
    node.start_process(gpu.uuid, 200, 5 * GIB, 20)
    node.start_process(gpu.uuid, 300, 7 * GIB, 0)  # a process of no pod holding this device
    held = [allocation(name, gpu.uuid, gpu.uuid, "a", POD_A), allocation(name, gpu.uuid, gpu.uuid, "b", POD_B)]
    pods = {100: POD_A, 101: POD_A, 200: POD_B}
    sampler = UsageSampler(lib, lambda: [Device(name, gpu.uuid, gpu.uuid)], lambda: held, pod_of_pid=pods.get)
    sample = sampler.sample()
    assert [(p.allocation.pod, p.used_bytes, p.processes) for p in sample.pods] == [
        ("a", 4 * GIB, 2),
        ("b", 5 * GIB, 1),
    ]
    registry = CollectorRegistry()
    registry.register(UsageCollector(sampler))
    assert (
        registry.get_sample_value(
            "dradriver_device_utilization_ratio", {"device": name, "uuid": gpu.uuid, "gpu_uuid": gpu.uuid}
        )
        == 0.7
    )
    by_pod = {"claim": "shared", "device": name, "namespace": "ml", "uuid": gpu.uuid}
    assert registry.get_sample_value("dradriver_pod_device_memory_used_bytes", {**by_pod, "pod": "b"}) == 5 * GIB
    assert (
        registry.get_sample_value(
            "dradriver_device_processes", {"device": name, "uuid": gpu.uuid, "gpu_uuid": gpu.uuid}
        )
        == 4
    )
    assert sample.to_json()[0]["pods"] == [
        {"namespace": "ml", "pod": "a", "memoryUsedBytes": 4 * GIB},
        {"namespace": "ml", "pod": "b", "memoryUsedBytes": 5 * GIB},
    ]


def node_of_56_mig_devices() -> tuple[SimulatedNode, list[Device]]:
    """hgx-h100-80gb (8 H100s), each split into seven 1g.10gb devices."""
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    for gpu in node.gpus:
        node.set_mig_mode(gpu.index, True)
        for start in range(7):
            instance = node.create_gpu_instance(gpu.index, 19, start)
            node.create_compute_instance(gpu.index, instance.id, full_compute_instance_profile(1))
            node.start_process(instance.compute_instances[0].uuid, 1000 + gpu.index * 10 + start, GIB, 10)
    inventory = discover(simulated_gpulib_on(node))
    devices = [Device(g.name, g.uuid, g.uuid) for g in inventory.gpus]
    devices += [Device(m.name, str(m.uuid), m.parent.uuid) for m in inventory.mig_devices]
    return node, devices


def test_a_scrape_of_an_8_gpu_node_with_56_mig_devices_stays_under_50_ms() -> None:
    node, devices = node_of_56_mig_devices()
    assert len(devices) == 64
    lib = simulated_gpulib_on(node)
    sampler = UsageSampler(lib, lambda: devices, list)
    sample = sampler.sample()
    assert len(sample.devices) == 64
    registry = CollectorRegistry()
    registry.register(UsageCollector(sampler))
    began = time.perf_counter()
    text = generate_latest(registry)
    took = time.perf_counter() - began
    assert text.count(b"dradriver_device_memory_used_bytes{") == 64
    assert took < 0.050, f"scrape took {took * 1000:.1f} ms"
