"""Device health from NVML events on a simulated node."""

import threading

from dradriver.driver.health import GpuHealth
from dradriver.gpu.errors import GpuError, GpuIsLost
from dradriver.gpu.fakelib import simulated_gpulib
from dradriver.gpu.inventory import MigMode, discover
from dradriver.gpu.models import GpuEvent
from dradriver.plugin.handler import HealthStatus


def setup(profile: str = "mixed", mode: MigMode = MigMode.STATIC):
    gpulib, node = simulated_gpulib(profile)
    inventory = discover(gpulib)
    return gpulib, node, inventory, GpuHealth(inventory=inventory, mig_mode=mode, pool="node-a", clock=lambda: 1000)


def statuses(health: GpuHealth) -> dict[str, HealthStatus]:
    return {d.device: d.status for d in health.device_health()}


def test_every_offered_device_starts_healthy_and_is_stamped_now():
    gpulib, _, inventory, health = setup()
    reported = health.device_health()
    assert {d.device for d in reported} == {d.name for d in inventory.devices(MigMode.STATIC)}
    assert {(d.status, d.last_updated, d.pool) for d in reported} == {(HealthStatus.HEALTHY, 1000, "node-a")}
    gpulib.close()


def test_a_critical_xid_marks_the_gpu_unhealthy_and_notifies():
    gpulib, _, inventory, health = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))
    assert heard.is_set()
    assert statuses(health)[target.name] is HealthStatus.UNHEALTHY
    assert [d.message for d in health.device_health() if d.device == target.name] == [f"XID 79 on GPU {target.uuid}"]
    assert sum(s is HealthStatus.UNHEALTHY for s in statuses(health).values()) == 1
    gpulib.close()


def test_application_xids_are_ignored():
    gpulib, _, inventory, health = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    health.handle(GpuEvent(gpu_uuid=inventory.gpus[1].uuid, xid=31))
    assert not heard.is_set()
    assert set(statuses(health).values()) == {HealthStatus.HEALTHY}
    gpulib.close()


def test_an_xid_on_one_gpu_instance_spares_its_sibling_mig_devices():
    gpulib, _, inventory, health = setup()
    mig = next(d for d in inventory.mig_devices if d.profile.name == "2g.10gb")
    assert mig.existing is not None
    health.handle(GpuEvent(gpu_uuid=mig.parent.uuid, xid=48, gpu_instance_id=mig.existing.gpu_instance_id))
    unhealthy = {name for name, s in statuses(health).items() if s is HealthStatus.UNHEALTHY}
    assert unhealthy == {mig.name}
    gpulib.close()


def test_events_from_the_simulator_reach_the_board_through_the_event_thread():
    gpulib, node, inventory, health = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    health.start(gpulib, poll_seconds=0.05)
    try:
        node.lose_gpu(4)
        assert heard.wait(10)
    finally:
        health.stop()
    lost = next(g for g in inventory.gpus if g.info.index == 4)
    assert statuses(health)[lost.name] is HealthStatus.UNHEALTHY
    gpulib.close()


def test_a_new_inventory_adds_and_drops_devices_and_keeps_known_health():
    gpulib, node, inventory, health = setup()
    sick = inventory.gpus[2]
    health.handle(GpuEvent(gpu_uuid=sick.uuid, xid=79))
    heard = threading.Event()
    health.subscribe(heard.set)
    node.set_mig_mode(1, True)
    node.reset_gpu(1)
    node.create_gpu_instance(1, 19, 0)
    fresh = discover(gpulib)
    health.update_inventory(fresh, MigMode.STATIC)
    assert heard.is_set()
    now = statuses(health)
    assert "gpu-0000-0f-00-0" not in now  # in MIG mode now: offered through its MIG devices
    assert now[sick.name] is HealthStatus.UNHEALTHY
    gpulib.close()


class _FailingEvents:
    """A GPU layer whose event wait fails with ``error``: all the health thread calls."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def wait_for_event(self, timeout_s: float) -> GpuEvent | None:
        raise self.error


def test_a_gpu_lost_without_saying_which_marks_every_device_unhealthy():
    gpulib, _, _, health = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    health.start(_FailingEvents(GpuIsLost("a GPU fell off the bus (which one is unknown)")))  # type: ignore[arg-type]
    try:
        assert heard.wait(10)
    finally:
        health.stop()
    assert set(statuses(health).values()) == {HealthStatus.UNHEALTHY}
    gpulib.close()


def test_devices_are_unknown_once_events_can_no_longer_be_watched():
    gpulib, node, inventory, health = setup()
    sick = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=sick.uuid, xid=79))
    heard = threading.Event()
    health.subscribe(heard.set)
    health.start(_FailingEvents(GpuError("nvmlEventSetWait_v2: Unknown Error")))  # type: ignore[arg-type]
    try:
        assert heard.wait(10)
    finally:
        health.stop()
    now = statuses(health)
    assert now.pop(sick.name) is HealthStatus.UNHEALTHY
    assert set(now.values()) == {HealthStatus.UNKNOWN}
    assert all("not watched" in d.message for d in health.device_health() if d.device != sick.name)
    node.set_mig_mode(2, True)
    node.reset_gpu(2)
    gi = node.create_gpu_instance(2, 19, 0)
    node.create_compute_instance(2, gi.id, 0)
    fresh = discover(gpulib)
    health.update_inventory(fresh, MigMode.STATIC)  # a device seen only now is not watched either
    new = next(d for d in fresh.mig_devices if d.parent.name == inventory.gpus[2].name)
    assert statuses(health)[new.name] is HealthStatus.UNKNOWN
    gpulib.close()
