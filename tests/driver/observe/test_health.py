"""Device health from NVML events on a simulated node: conditions, taints, refusals and recovery."""

import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dradriver.driver.observe.health import GpuHealth, HealthPolicy, TaintEffect, parse_xids, read_conditions
from dradriver.errors import ConfigError
from dradriver.gpu.errors import GpuError, GpuIsLost
from dradriver.gpu.inventory import MigMode, MigPartition, discover
from dradriver.gpu.models import GpuEvent
from dradriver.nvidia_install.pci_binding import HostPci
from dradriver.plugin.handler import DeviceToleration, HealthStatus
from dradriver.sim.fakelib import simulated_gpulib, simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile


class Clock:
    """Wall time that a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def setup(profile: str = "mixed", mode: MigMode = MigMode.STATIC, **policy):
    gpulib, node = simulated_gpulib(profile)
    inventory = discover(gpulib)
    clock = Clock()
    health = GpuHealth(inventory=inventory, mig_mode=mode, pool="node-a", policy=HealthPolicy(**policy), clock=clock)
    return gpulib, node, inventory, health, clock


def statuses(health: GpuHealth) -> dict[str, HealthStatus]:
    return {d.device: d.status for d in health.device_health()}


def unhealthy(health: GpuHealth) -> set[str]:
    return {name for name, s in statuses(health).items() if s is HealthStatus.UNHEALTHY}


def test_every_offered_device_starts_healthy_untainted_and_is_stamped_now():
    gpulib, _, inventory, health, clock = setup()
    reported = health.device_health()
    assert {d.device for d in reported} == {d.name for d in inventory.devices(MigMode.STATIC)}
    assert {(d.status, d.last_updated, d.pool) for d in reported} == {(HealthStatus.HEALTHY, int(clock.now), "node-a")}
    assert all(health.taints(d.device) == [] and health.problem(d.device) is None for d in reported)
    gpulib.close()


def test_a_critical_xid_marks_the_gpu_unhealthy_taints_it_and_notifies():
    gpulib, _, inventory, health, _ = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))
    assert heard.is_set()
    assert unhealthy(health) == {target.name}
    assert [d.message for d in health.device_health() if d.device == target.name] == [f"XID 79 on GPU {target.uuid}"]
    assert health.taints(target.name) == [
        {"key": "gpu.dradriver.dev/xid", "value": "79", "effect": "NoSchedule", "timeAdded": "2027-01-15T08:00:00Z"}
    ]
    assert health.problem(target.name) == f"XID 79 on GPU {target.uuid} (since 2027-01-15T08:00:00Z)"
    gpulib.close()


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (DeviceToleration(key="gpu.dradriver.dev/xid", operator="Exists"), True),
        (DeviceToleration(key="gpu.dradriver.dev/xid", value="79", effect="NoSchedule"), True),
        (DeviceToleration(operator="Exists"), True),  # an empty key with Exists tolerates every taint
        (DeviceToleration(key="gpu.dradriver.dev/xid", value="48"), False),
        (DeviceToleration(key="gpu.dradriver.dev/xid", operator="Exists", effect="NoExecute"), False),
        (DeviceToleration(key="gpu.dradriver.dev/ecc", operator="Exists"), False),
    ],
)
def test_a_claim_whose_allocation_tolerates_the_taint_is_not_refused(toleration, tolerated):
    gpulib, _, inventory, health, _ = setup()
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))
    assert (health.problem(target.name, (toleration,)) is None) is tolerated
    assert health.problem(target.name) is not None
    gpulib.close()


def test_application_xids_add_only_an_informational_taint():
    gpulib, _, inventory, health, _ = setup()
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=31))
    assert set(statuses(health).values()) == {HealthStatus.HEALTHY}
    assert [(t["key"], t["value"], t["effect"]) for t in health.taints(target.name)] == [
        ("gpu.dradriver.dev/xid", "31", "None")
    ]
    assert health.problem(target.name) is None
    gpulib.close()


def test_a_fatal_xid_is_never_ignored_and_the_effect_is_configurable():
    gpulib, _, inventory, health, _ = setup(
        ignored_xids=frozenset({31, 48}), taint_effect=TaintEffect.NO_EXECUTE, taint_domain="gpu.example.com"
    )
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=48))
    assert unhealthy(health) == {target.name}
    assert [(t["key"], t["effect"]) for t in health.taints(target.name)] == [("gpu.example.com/xid", "NoExecute")]
    gpulib.close()


def test_an_xid_on_one_gpu_instance_spares_its_sibling_mig_devices():
    gpulib, _, inventory, health, _ = setup()
    mig = next(d for d in inventory.mig_devices if d.profile.name == "2g.10gb")
    assert mig.existing is not None
    health.handle(GpuEvent(gpu_uuid=mig.parent.uuid, xid=48, gpu_instance_id=mig.existing.gpu_instance_id))
    assert unhealthy(health) == {mig.name}
    gpulib.close()


def test_mig_partitions_inherit_their_parents_health():
    gpulib, _, inventory, health, _ = setup("dgx-a100-40gb", MigMode.DYNAMIC)
    gpu = inventory.gpus[0]
    health.handle(GpuEvent(gpu_uuid=gpu.uuid, ecc_double_bit=True))
    family = {gpu.name} | {p.name for p in inventory.partitions(gpu)}
    assert unhealthy(health) == family
    partition = next(d for d in inventory.devices(MigMode.DYNAMIC) if isinstance(d, MigPartition))
    assert [t["key"] for t in health.taints(partition.name)] == ["gpu.dradriver.dev/ecc"]
    gpulib.close()


def test_double_bit_ecc_errors_are_counted_and_a_reset_clears_them():
    gpulib, node, inventory, health, _ = setup(recovery_period=0)
    target = inventory.gpus[1]
    node.inject_ecc(1, 3)
    health.handle(GpuEvent(gpu_uuid=target.uuid, ecc_double_bit=True))
    health.note_after_event(gpulib, target.uuid)
    assert [(t["key"], t["value"]) for t in health.taints(target.name)] == [("gpu.dradriver.dev/ecc", "3")]
    health.check_recovery(gpulib)  # no reset yet, and no quiet period configured
    assert unhealthy(health) == {target.name}
    node.reset_gpu(1)
    health.check_recovery(gpulib)
    assert unhealthy(health) == set()
    assert health.taints(target.name) == []
    gpulib.close()


def test_a_condition_without_a_reset_clears_after_the_quiet_period():
    gpulib, _, inventory, health, clock = setup(recovery_period=60)
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))
    clock.now += 50
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))  # a new event restarts the quiet period
    clock.now += 50
    health.check_recovery(gpulib)
    assert unhealthy(health) == {target.name}
    clock.now += 10
    health.check_recovery(gpulib)
    assert unhealthy(health) == set()
    gpulib.close()


def test_a_lost_gpu_stays_listed_unhealthy_and_recovers_with_its_name_when_reset():
    gpulib, node, inventory, health, clock = setup(recovery_period=1)
    target = inventory.gpus[2]
    node.lose_gpu(2)
    fresh = discover(gpulib)
    assert target.name not in {g.name for g in fresh.gpus}
    assert [(g.name, g.uuid) for g in fresh.lost_gpus] == [(target.name, target.uuid)]
    health.update_inventory(fresh, MigMode.STATIC)
    assert unhealthy(health) == {target.name}
    assert [t["key"] for t in health.taints(target.name)] == ["gpu.dradriver.dev/gpu-lost"]
    clock.now += 10
    health.check_recovery(gpulib)  # the quiet period does not bring back a GPU that does not answer
    assert unhealthy(health) == {target.name}
    node.reset_gpu(2)
    health.check_recovery(gpulib)
    assert unhealthy(health) == set()
    back = discover(gpulib)
    assert target.name in {g.name for g in back.gpus} and back.lost_gpus == ()
    gpulib.close()


def test_events_from_the_simulator_reach_the_board_through_the_monitor_thread():
    gpulib, node, inventory, health, _ = setup()
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


def test_the_monitor_thread_sees_a_reset_and_reports_healthy_again():
    gpulib, node, inventory, health, _ = setup(probe_interval=0.05)
    target = inventory.gpus[1]
    healthy_again = threading.Event()
    health.subscribe(lambda: None if unhealthy(health) else healthy_again.set())
    health.start(gpulib, poll_seconds=0.05)
    try:
        node.inject_ecc(1, 2)
        assert _wait_for(lambda: unhealthy(health) == {target.name})
        node.reset_gpu(1)
        assert healthy_again.wait(10)
    finally:
        health.stop()
    gpulib.close()


def _wait_for(condition, timeout: float = 10.0) -> bool:
    """Whether ``condition`` holds within ``timeout`` (polled: the monitor thread changes it)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.02)
    return True


def test_a_new_inventory_adds_and_drops_devices_and_keeps_known_health():
    gpulib, node, inventory, health, _ = setup()
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


def test_an_unchanged_inventory_notifies_nobody():
    gpulib, _, inventory, health, _ = setup()
    heard = threading.Event()
    health.subscribe(heard.set)
    health.update_inventory(inventory, MigMode.STATIC)
    assert not heard.is_set()
    gpulib.close()


class _FailingEvents:
    """A GPU layer whose event wait fails with ``error``; probes answer from the real simulated GPU layer."""

    def __init__(self, error: Exception, gpulib) -> None:
        self.error = error
        self.gpulib = gpulib

    def wait_for_event(self, timeout_s: float) -> GpuEvent | None:
        raise self.error

    def rewatch_events(self) -> None:
        raise GpuError("nvmlEventSetCreate: Unknown Error")

    def probe(self, gpu_uuid: str):
        return self.gpulib.probe(gpu_uuid)


def test_a_gpu_lost_without_saying_which_taints_every_device_until_the_quiet_period_ends():
    gpulib, _, inventory, health, clock = setup(recovery_period=30)
    heard = threading.Event()
    health.subscribe(heard.set)
    health.start(_FailingEvents(GpuIsLost("a GPU fell off the bus (which one is unknown)"), gpulib))  # type: ignore[arg-type]
    try:
        assert heard.wait(10)
    finally:
        health.stop()
    assert set(statuses(health).values()) == {HealthStatus.UNHEALTHY}
    name = inventory.gpus[1].name
    assert [(t["key"], t["value"]) for t in health.taints(name)] == [("gpu.dradriver.dev/gpu-lost", "unattributed")]
    health.check_recovery(gpulib)
    assert set(statuses(health).values()) == {HealthStatus.UNHEALTHY}
    clock.now += 30
    health.check_recovery(gpulib)
    assert set(statuses(health).values()) == {HealthStatus.HEALTHY}
    gpulib.close()


def test_devices_are_unknown_and_tainted_unmonitored_once_events_can_no_longer_be_watched():
    gpulib, node, inventory, health, _ = setup()
    sick = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=sick.uuid, xid=79))
    heard = threading.Event()
    health.subscribe(heard.set)
    health.start(_FailingEvents(GpuError("nvmlEventSetWait_v2: Unknown Error"), gpulib))  # type: ignore[arg-type]
    try:
        assert heard.wait(10)
    finally:
        health.stop()
    now = statuses(health)
    assert now.pop(sick.name) is HealthStatus.UNHEALTHY
    assert set(now.values()) == {HealthStatus.UNKNOWN}
    assert all("not watched" in d.message for d in health.device_health() if d.device != sick.name)
    other = inventory.gpus[2].name
    assert [(t["key"], t["effect"]) for t in health.taints(other)] == [("gpu.dradriver.dev/unmonitored", "None")]
    assert health.problem(other) is None  # not known to be broken: still given to claims
    node.set_mig_mode(2, True)
    node.reset_gpu(2)
    gi = node.create_gpu_instance(2, 19, 0)
    node.create_compute_instance(2, gi.id, 0)
    fresh = discover(gpulib)
    health.update_inventory(fresh, MigMode.STATIC)  # a device seen only now is not watched either
    new = next(d for d in fresh.mig_devices if d.parent.name == inventory.gpus[2].name)
    assert statuses(health)[new.name] is HealthStatus.UNKNOWN
    gpulib.close()


def test_conditions_survive_a_restart_through_the_state_file(tmp_path: Path):
    gpulib, _ = simulated_gpulib("mixed")
    inventory = discover(gpulib)
    path = tmp_path / "health.json"
    first = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=path)
    first.handle(GpuEvent(gpu_uuid=inventory.gpus[1].uuid, xid=79))
    assert [(c.cause.value, c.value) for c in read_conditions(path)] == [("xid", "79")]
    again = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=path)
    assert unhealthy(again) == {inventory.gpus[1].name}
    path.write_text("{not json")
    assert unhealthy(GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=path)) == set()
    gpulib.close()


def test_events_are_counted_per_xid_in_the_metrics():
    gpulib, _, inventory, health, _ = setup()
    before = REGISTRY.get_sample_value("dradriver_gpu_events_total", {"kind": "xid", "xid": "94"}) or 0
    health.handle(GpuEvent(gpu_uuid=inventory.gpus[1].uuid, xid=94))
    health.handle(GpuEvent(gpu_uuid=inventory.gpus[2].uuid, xid=94))
    assert REGISTRY.get_sample_value("dradriver_gpu_events_total", {"kind": "xid", "xid": "94"}) == before + 2
    assert REGISTRY.get_sample_value("dradriver_device_health", {"device": inventory.gpus[1].name}) == 2
    gpulib.close()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"taint_effect": TaintEffect.NONE}, "keep no pod away"),
        ({"recovery_period": -1}, "--health-recovery-period"),
        ({"recovery_period": float("nan")}, "--health-recovery-period"),
    ],
)
def test_a_bad_policy_is_refused_with_the_flag_named(policy, message):
    with pytest.raises(ConfigError, match=message):
        HealthPolicy(**policy)


def test_xid_lists_parse_and_bad_ones_name_the_flag():
    assert parse_xids("13, 31,,43", "--x") == {13, 31, 43}
    with pytest.raises(ConfigError, match="--health-ignore-xids '13,abc': 'abc' is not an XID"):
        parse_xids("13,abc", "--health-ignore-xids")
    with pytest.raises(ConfigError, match=r"outside 1\.\.999"):
        parse_xids("0", "--health-fatal-xids")


def test_a_gpu_lost_before_it_was_ever_read_nudges_a_rescan_once_it_answers(tmp_path: Path):
    state = tmp_path / "sim.json"
    admin = SimulatedNode(load_node_profile("dgx-a100-40gb"), state_path=state)
    admin.lose_gpu(3)
    gpulib, _ = simulated_gpulib("dgx-a100-40gb", state_path=state)
    inventory = discover(gpulib)
    health = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a")
    heard = threading.Event()
    health.subscribe(heard.set)
    assert not health.retry_unreadable(gpulib)
    admin.reset_gpu(3)
    assert health.retry_unreadable(gpulib)
    assert heard.is_set()
    assert len(discover(gpulib).gpus) == 8
    gpulib.close()


def test_a_reset_clears_an_xid_that_left_no_ecc_trace_once_nvml_asked_for_the_reset():
    """NVML's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) says "reset the GPU" after such an XID and
    "none" once it was reset: that is the reset signal, not the quiet period."""
    gpulib, node, inventory, health, _ = setup(recovery_period=0)
    target = inventory.gpus[1]
    node.inject_xid(1, 119)
    assert gpulib.probe(target.uuid).recovery_action == 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=119))
    health.check_recovery(gpulib)
    assert unhealthy(health) == {target.name}
    node.reset_gpu(1)
    assert gpulib.probe(target.uuid).recovery_action == 0
    health.check_recovery(gpulib)
    assert unhealthy(health) == set() and health.taints(target.name) == []
    gpulib.close()


def test_a_reset_right_after_the_xid_is_seen_through_the_reading_taken_at_the_event():
    gpulib, node, inventory, health, _ = setup(recovery_period=0)
    target = inventory.gpus[1]
    node.inject_xid(1, 74)
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=74))
    health.note_after_event(gpulib, target.uuid)
    node.reset_gpu(1)  # before the first probe
    health.check_recovery(gpulib)
    assert unhealthy(health) == set()
    gpulib.close()


def test_an_xid_that_needs_no_reset_is_not_cleared_by_a_clean_recovery_action():
    gpulib, _node, inventory, health, _ = setup(recovery_period=0)
    target = inventory.gpus[1]
    health.handle(GpuEvent(gpu_uuid=target.uuid, xid=79))  # NVML was never asked: the action reads "none"
    health.check_recovery(gpulib)
    assert unhealthy(health) == {target.name}
    gpulib.close()


def test_a_pending_reset_survives_a_restart_so_a_reset_while_the_driver_was_down_clears(tmp_path: Path):
    gpulib, node = simulated_gpulib("mixed")
    inventory = discover(gpulib)
    state = tmp_path / "health.json"
    first = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=state)
    target = inventory.gpus[1]
    node.inject_xid(1, 119)
    first.handle(GpuEvent(gpu_uuid=target.uuid, xid=119))
    first.note_after_event(gpulib, target.uuid)
    node.reset_gpu(1)
    policy = HealthPolicy(recovery_period=0)
    second = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=state, policy=policy)
    assert unhealthy(second) == {target.name}
    second.check_recovery(gpulib)
    assert unhealthy(second) == set()
    gpulib.close()


class _EventsComeBack:
    """Events that fail once, and whose registration fails once more before it works again."""

    def __init__(self, gpulib) -> None:
        self.gpulib = gpulib
        self.broken = True
        self.refusals = 1
        self.rewatched = threading.Event()

    def wait_for_event(self, timeout_s: float) -> GpuEvent | None:
        if self.broken:
            raise GpuError("nvmlEventSetWait_v2: Unknown Error")
        return self.gpulib.wait_for_event(timeout_s)

    def rewatch_events(self) -> None:
        if self.refusals:
            self.refusals -= 1
            raise GpuError("nvmlEventSetCreate: Unknown Error")
        self.gpulib.rewatch_events()
        self.broken = False
        self.rewatched.set()

    def probe(self, gpu_uuid: str):
        return self.gpulib.probe(gpu_uuid)

    def unreadable_gpus(self):
        return self.gpulib.unreadable_gpus()


def test_unmonitored_clears_when_event_registration_works_again():
    gpulib, node, inventory, health, _ = setup()
    events = _EventsComeBack(gpulib)
    health.start(events, poll_seconds=0.05, rewatch_backoff=(0.01, 0.05))  # type: ignore[arg-type]
    try:
        assert events.rewatched.wait(10)
        assert _wait_for(lambda: set(statuses(health).values()) == {HealthStatus.HEALTHY})
        assert health.taints(inventory.gpus[2].name) == []
        node.inject_xid(2, 79)  # events are read again
        assert _wait_for(lambda: unhealthy(health) == {inventory.gpus[2].name})
    finally:
        health.stop()
    gpulib.close()


def test_unmonitored_saved_by_an_earlier_run_clears_once_this_run_reads_events(tmp_path: Path):
    gpulib, _ = simulated_gpulib("mixed")
    inventory = discover(gpulib)
    state = tmp_path / "health.json"
    earlier = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=state)
    earlier.unmonitored(GpuError("nvmlEventSetWait_v2: Unknown Error"))
    restarted = GpuHealth(inventory=inventory, mig_mode=MigMode.STATIC, pool="node-a", state_path=state)
    assert set(statuses(restarted).values()) == {HealthStatus.UNKNOWN}
    restarted.start(gpulib, poll_seconds=0.05)
    try:
        assert _wait_for(lambda: set(statuses(restarted).values()) == {HealthStatus.HEALTHY})
    finally:
        restarted.stop()
    assert not any(c.cause.value == "unmonitored" for c in read_conditions(state))
    gpulib.close()


def test_a_gpu_lost_after_nvml_renumbered_the_gpus_is_not_named_after_the_one_that_sat_at_its_index(tmp_path: Path):
    # NVML started again for a passthrough unbind counts the GPUs afresh: the one on vfio-pci is not counted and the
    # others shift down. A GPU then lost before it is read is known by its new index only.
    node = SimulatedNode(load_node_profile("hgx-h100-80gb"))
    kernel = node.attach_sysfs(tmp_path / "host")
    node.nvml_counts_at_init = True  # as a real NVML
    gpulib = simulated_gpulib_on(node)
    pci = HostPci(tmp_path / "host", kernel)
    health = GpuHealth(inventory=discover(gpulib), mig_mode=MigMode.STATIC, pool="node-a")
    moved = node.gpus[0].pci_bus_id
    with gpulib.released():
        pci.set_driver_override(moved, "vfio-pci")
        pci.unbind(moved, "nvidia")
        pci.bind(moved, "vfio-pci")
        node.lose_gpu(2)  # NVML's index 1 once it starts again; index 1 was GPU 1 before
    inventory = discover(gpulib)
    assert [(g.index, g.uuid) for g in inventory.lost_gpus] == [(1, None)]
    health.update_inventory(inventory, MigMode.STATIC)
    assert [(g.index, g.uuid) for g in health.lost_gpus(inventory)] == [(1, None)]
    assert unhealthy(health) == set()  # GPU 1 answers: it is neither named lost nor tainted
    gpulib.close()
