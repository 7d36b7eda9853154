"""The simulated node's NVML rules, checked directly on ``SimulatedNode``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.errors import ConfigError
from dradriver.gpu.models import NO_CLUSTER_UUID, ComputeMode, FabricState, NvlinkPeerType
from dradriver.sim.node import (
    GPU_IS_LOST,
    IN_USE,
    INSUFFICIENT_RESOURCES,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    SimFabric,
    SimNvmlError,
    SimulatedNode,
    full_compute_instance_profile,
)
from dradriver.sim.profiles import builtin_profile_names, load_node_profile

MakeNode = Callable[..., SimulatedNode]

# Real GPU-instance profile ids (nvidia-smi mig -lgip) on A100/H100.
P_1G, P_1G_ME, P_1G_2SLICE, P_2G, P_3G, P_4G, P_7G = 19, 20, 15, 14, 9, 5, 0


def code_of(call: object) -> int:
    assert callable(call)
    with pytest.raises(SimNvmlError) as caught:
        call()
    return caught.value.code


def mig_node(make_node: MakeNode, profile: str = "dgx-a100-80gb", **options: object) -> SimulatedNode:
    """A node whose first GPU has MIG enabled (with the reset Ampere needs)."""
    node = make_node(profile, **options)
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    return node


# --- placement ------------------------------------------------------------------------------------------------


def test_gpu_instance_lands_at_the_requested_valid_placement(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_3G, 4)
    assert (gi.placement.start, gi.placement.size) == (4, 4)
    assert gi.profile.name == "3g.40gb"


@pytest.mark.parametrize(("profile_id", "start"), [(P_3G, 2), (P_2G, 6), (P_7G, 1), (P_1G, 7), (P_4G, 4)])
def test_a_start_the_profile_does_not_offer_is_an_invalid_argument(
    make_node: MakeNode, profile_id: int, start: int
) -> None:
    node = mig_node(make_node)
    assert code_of(lambda: node.create_gpu_instance(0, profile_id, start)) == INVALID_ARGUMENT


def test_an_unknown_profile_id_is_an_invalid_argument(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    assert code_of(lambda: node.create_gpu_instance(0, 7, 0)) == INVALID_ARGUMENT


def test_an_occupied_placement_is_insufficient_resources_not_already_exists(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    node.create_gpu_instance(0, P_3G, 0)
    assert code_of(lambda: node.create_gpu_instance(0, P_1G, 2)) == INSUFFICIENT_RESOURCES
    assert code_of(lambda: node.create_gpu_instance(0, P_2G, 2)) == INSUFFICIENT_RESOURCES
    assert node.create_gpu_instance(0, P_1G, 4).placement.start == 4


def test_a_profile_cannot_exceed_its_instance_limit(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    node.create_gpu_instance(0, P_1G_ME, 6)
    # Slice 0 is free and compute slices remain: only the "+me" limit of one instance stops it.
    assert code_of(lambda: node.create_gpu_instance(0, P_1G_ME, 0)) == INSUFFICIENT_RESOURCES
    assert node.create_gpu_instance(0, P_1G, 0).placement.start == 0


def test_seven_one_slice_instances_fill_the_gpu(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    for start in range(7):
        node.create_gpu_instance(0, P_1G, start)
    assert code_of(lambda: node.create_gpu_instance(0, P_1G)) == INSUFFICIENT_RESOURCES


def test_scattered_one_slice_instances_leave_no_room_for_three_slices(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    for start in (0, 2, 4, 6):
        node.create_gpu_instance(0, P_1G, start)
    # Three compute slices remain free, but every 3g placement overlaps a 1g instance.
    assert code_of(lambda: node.create_gpu_instance(0, P_3G)) == INSUFFICIENT_RESOURCES
    assert code_of(lambda: node.create_gpu_instance(0, P_3G, 4)) == INSUFFICIENT_RESOURCES
    assert node.create_gpu_instance(0, P_1G).placement.start == 1


def test_seven_slices_need_an_empty_gpu(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_1G, 6)
    assert code_of(lambda: node.create_gpu_instance(0, P_7G, 0)) == INSUFFICIENT_RESOURCES
    node.destroy_gpu_instance(0, gi.id)
    assert node.create_gpu_instance(0, P_7G, 0).placement.size == 8


def test_without_a_start_the_first_free_placement_is_taken(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    node.create_gpu_instance(0, P_2G, 0)
    assert node.create_gpu_instance(0, P_2G).placement.start == 2


# --- ids, destroy, recreate -----------------------------------------------------------------------------------


def test_gpu_instance_ids_come_from_the_lowest_free_id_not_the_placement(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    ids = [node.create_gpu_instance(0, P_1G, start).id for start in (6, 0, 3)]
    assert ids == [1, 2, 3]
    node.destroy_gpu_instance(0, 2)
    assert node.create_gpu_instance(0, P_1G, 5).id == 2


def test_a_recreated_mig_device_gets_a_new_uuid(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_3G, 0)
    first = node.create_compute_instance(0, gi.id, full_compute_instance_profile(3))
    node.destroy_compute_instance(0, gi.id, first.id)
    node.destroy_gpu_instance(0, gi.id)
    gi = node.create_gpu_instance(0, P_3G, 0)
    second = node.create_compute_instance(0, gi.id, full_compute_instance_profile(3))
    assert first.uuid.startswith("MIG-") and second.uuid.startswith("MIG-")
    assert first.uuid != second.uuid


def test_a_gpu_instance_with_compute_instances_is_in_use(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_2G, 0)
    ci = node.create_compute_instance(0, gi.id, full_compute_instance_profile(2))
    assert code_of(lambda: node.destroy_gpu_instance(0, gi.id)) == IN_USE
    node.destroy_compute_instance(0, gi.id, ci.id)
    node.destroy_gpu_instance(0, gi.id)
    assert code_of(lambda: node.gpu_instance(0, gi.id)) == NOT_FOUND


def test_compute_instances_cannot_exceed_their_gpu_instance(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_3G, 0)
    assert code_of(lambda: node.create_compute_instance(0, gi.id, full_compute_instance_profile(4))) == NOT_SUPPORTED
    node.create_compute_instance(0, gi.id, full_compute_instance_profile(2))
    assert (
        code_of(lambda: node.create_compute_instance(0, gi.id, full_compute_instance_profile(2)))
        == INSUFFICIENT_RESOURCES
    )
    assert node.create_compute_instance(0, gi.id, full_compute_instance_profile(1)).slices == 1


# --- MIG mode -------------------------------------------------------------------------------------------------


def test_ampere_mig_mode_stays_pending_until_the_gpu_is_reset(make_node: MakeNode) -> None:
    node = make_node("dgx-a100-40gb")
    node.set_mig_mode(0, True)
    gpu = node.gpu(0)
    assert (gpu.mig_current, gpu.mig_pending) == (False, True)
    assert code_of(lambda: node.create_gpu_instance(0, P_1G, 0)) == NOT_SUPPORTED
    node.reset_gpu(0)
    assert (gpu.mig_current, gpu.mig_pending) == (True, True)


def test_hopper_mig_mode_changes_immediately(make_node: MakeNode) -> None:
    node = make_node("hgx-h100-80gb")
    node.set_mig_mode(3, True)
    assert node.gpu(3).mig_current
    node.set_mig_mode(3, False)
    assert not node.gpu(3).mig_current


def test_mig_cannot_be_disabled_while_gpu_instances_exist(make_node: MakeNode) -> None:
    node = make_node("hgx-h100-80gb")
    node.set_mig_mode(0, True)
    node.create_gpu_instance(0, P_1G, 0)
    assert code_of(lambda: node.set_mig_mode(0, False)) == IN_USE


def test_mig_mode_on_a_gpu_without_mig_is_not_supported(make_node: MakeNode) -> None:
    node = make_node("mixed")
    l4 = next(g.index for g in node.gpus if g.product_name == "NVIDIA L4")
    assert code_of(lambda: node.set_mig_mode(l4, True)) == NOT_SUPPORTED


# --- compute mode and privilege -------------------------------------------------------------------------------


def test_exclusive_thread_compute_mode_is_not_supported(make_node: MakeNode) -> None:
    node = make_node()
    assert code_of(lambda: node.set_compute_mode(0, ComputeMode.EXCLUSIVE_THREAD)) == NOT_SUPPORTED
    node.set_compute_mode(0, ComputeMode.PROHIBITED)
    assert node.gpu(0).compute_mode == ComputeMode.PROHIBITED


def test_with_mig_enabled_the_compute_mode_is_set_on_mig_devices_only(make_node: MakeNode) -> None:
    node = mig_node(make_node)
    gi = node.create_gpu_instance(0, P_1G, 0)
    ci = node.create_compute_instance(0, gi.id, full_compute_instance_profile(1))
    assert code_of(lambda: node.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS)) == NOT_SUPPORTED
    node.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS, (gi.id, ci.id))
    assert ci.compute_mode == ComputeMode.EXCLUSIVE_PROCESS


def test_an_unprivileged_caller_gets_no_permission(make_node: MakeNode) -> None:
    node = make_node("hgx-h100-80gb", privileged=False)
    assert code_of(lambda: node.set_mig_mode(0, True)) == NO_PERMISSION
    assert code_of(lambda: node.set_compute_mode(0, ComputeMode.PROHIBITED)) == NO_PERMISSION
    privileged = make_node("hgx-h100-80gb")
    privileged.set_mig_mode(0, True)
    privileged.privileged = False
    assert code_of(lambda: privileged.create_gpu_instance(0, P_1G, 0)) == NO_PERMISSION


# --- persistence ----------------------------------------------------------------------------------------------


def test_a_restarted_node_sees_the_same_instances_uuids_and_compute_modes(make_node: MakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    node = make_node("dgx-a100-80gb", state_path=state)
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    gi = node.create_gpu_instance(0, P_3G, 4)
    ci = node.create_compute_instance(0, gi.id, full_compute_instance_profile(3))
    node.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS, (gi.id, ci.id))
    node.set_compute_mode(1, ComputeMode.PROHIBITED)

    again = make_node("dgx-a100-80gb", state_path=state)
    assert [g.uuid for g in again.gpus] == [g.uuid for g in node.gpus]
    [(gi2, ci2)] = again.mig_devices(0)
    assert (gi2.id, gi2.profile.id, gi2.placement.start) == (gi.id, P_3G, 4)
    assert (ci2.uuid, ci2.compute_mode) == (ci.uuid, ComputeMode.EXCLUSIVE_PROCESS)
    assert again.gpu(1).compute_mode == ComputeMode.PROHIBITED
    # New MIG devices after the restart still get fresh UUIDs.
    gi3 = again.create_gpu_instance(0, P_1G, 0)
    assert again.create_compute_instance(0, gi3.id, 0).uuid != ci.uuid


def test_a_profile_with_mig_devices_starts_with_them(make_node: MakeNode) -> None:
    node = make_node("mixed")
    shapes = [(gi.profile.name, gi.placement.start) for gi, _ci in node.mig_devices(0)]
    assert shapes == [("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]


def _state_with(state: Path, change: str) -> None:
    raw = json.loads(state.read_text())
    if change == "version":
        raw["version"] = 99
    elif change == "profile":
        raw["profile"] = "hgx-h200"
    elif change == "kind":
        raw["kind"] = "something-else"
    elif change == "gpus":
        raw["gpus"].popitem()
    state.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("corrupt", "not readable JSON"),
        ("version", "version"),
        ("profile", "profile"),
        ("kind", "kind"),
        ("gpus", "gpus"),
    ],
)
def test_a_bad_state_file_is_a_config_error_and_is_left_alone(
    make_node: MakeNode, tmp_path: Path, change: str, field: str
) -> None:
    state = tmp_path / "state.json"
    make_node("dgx-a100-40gb", state_path=state)
    if change == "corrupt":
        state.write_text('{"kind": "dradriver-simulated-gpu-state", ')
    else:
        _state_with(state, change)
    before = state.read_bytes()
    with pytest.raises(ConfigError) as caught:
        make_node("dgx-a100-40gb", state_path=state)
    assert str(state) in str(caught.value)
    assert f"{state}: {field}" in str(caught.value)
    assert "delete the file" in str(caught.value)
    assert state.read_bytes() == before


# --- events ---------------------------------------------------------------------------------------------------


def test_an_injected_xid_reaches_a_waiter_on_that_gpu(make_node: MakeNode) -> None:
    node = make_node()
    after = node.last_event_sequence()
    node.inject_xid(3, 62, gpu_instance_id=2, compute_instance_id=0)
    event = node.wait_event(after, {3}, timeout_s=1)
    assert event is not None
    assert (event.gpu_index, event.xid, event.gpu_instance_id, event.compute_instance_id) == (3, 62, 2, 0)
    assert node.wait_event(after, {1}, timeout_s=0.01) is None


def test_a_lost_gpu_fails_every_call_and_raises_an_event(make_node: MakeNode) -> None:
    node = make_node()
    after = node.last_event_sequence()
    node.lose_gpu(2)
    event = node.wait_event(after, {0, 1, 2}, timeout_s=1)
    assert event is not None and event.gpu_lost and event.gpu_index == 2
    assert code_of(lambda: node.gpu(2)) == GPU_IS_LOST
    assert node.gpu(1).index == 1


def test_double_bit_ecc_errors_raise_an_event_and_grow_both_counters(make_node: MakeNode) -> None:
    node = make_node()
    after = node.last_event_sequence()
    node.inject_ecc(1, 5)
    event = node.wait_event(after, {1}, timeout_s=1)
    assert event is not None and event.ecc_double_bit and event.xid is None
    assert (node.ecc_errors(1, volatile=True), node.ecc_errors(1, volatile=False)) == (5, 5)
    with pytest.raises(ValueError, match="at least 1"):
        node.inject_ecc(1, 0)


def test_a_reset_zeroes_volatile_ecc_brings_a_lost_gpu_back_and_drops_its_unread_events(make_node: MakeNode) -> None:
    node = make_node()
    node.inject_ecc(1, 2)
    node.reset_gpu(1)
    assert (node.ecc_errors(1, volatile=True), node.ecc_errors(1, volatile=False)) == (0, 2)
    after = node.last_event_sequence()
    node.lose_gpu(2)
    node.inject_xid(3, 62)
    node.reset_gpu(2)
    assert node.gpu(2).index == 2
    event = node.wait_event(after, {2, 3}, timeout_s=1)
    assert event is not None and event.gpu_index == 3  # GPU 2's lost event went with the reset


def test_xid_79_takes_the_gpu_off_the_bus_until_a_reset_as_on_hardware(make_node: MakeNode) -> None:
    node = make_node()
    after = node.last_event_sequence()
    node.inject_xid(2, 79)
    event = node.wait_event(after, {2}, timeout_s=1)
    assert event is not None and event.xid == 79
    assert code_of(lambda: node.gpu(2)) == GPU_IS_LOST
    assert node.gpu(1).index == 1
    node.reset_gpu(2)
    assert node.gpu(2).index == 2


@pytest.mark.parametrize("xid", [48, 94, 95])
def test_an_ecc_xid_counts_an_uncorrectable_error_and_asks_for_a_reset(make_node: MakeNode, xid: int) -> None:
    node = make_node()
    node.inject_xid(1, xid)
    assert (node.ecc_errors(1, volatile=True), node.ecc_errors(1, volatile=False)) == (1, 1)
    assert node.recovery_action(1) == 1
    node.reset_gpu(1)
    assert (node.ecc_errors(1, volatile=True), node.recovery_action(1)) == (0, 0)


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_an_application_xid_leaves_the_gpu_as_it_was(make_node: MakeNode, xid: int) -> None:
    node = make_node()
    node.inject_xid(1, xid)
    assert (node.ecc_errors(1, volatile=True), node.recovery_action(1), node.gpu(1).index) == (0, 0, 1)


def test_an_unattributable_loss_raises_the_event_but_every_gpu_still_answers(make_node: MakeNode) -> None:
    node = make_node()
    after = node.last_event_sequence()
    node.lose_gpu(2, attributable=False)
    event = node.wait_event(after, {2}, timeout_s=1)
    assert event is not None and event.gpu_lost
    assert node.gpu(2).index == 2


def test_ecc_counters_and_a_reset_outlive_a_restart(make_node: MakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = make_node(state_path=state)
    first.inject_ecc(0, 3)
    first.lose_gpu(1)
    again = make_node(state_path=state)
    assert again.ecc_errors(0, volatile=True) == 3
    again.reset_gpu(1)
    assert make_node(state_path=state).gpu(1).index == 1


# --- NVLink fabric ---------------------------------------------------------------------------------------------

REGISTERED = SimFabric(FabricState.COMPLETED, 0, NO_CLUSTER_UUID, 0)
CLIQUE_NODE = (
    "name: clique\nnvswitch: true\n"
    "fabric: {clusterUuid: 6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, cliqueId: 7}\n"
    "gpus:\n  - {product: NVIDIA H200, pciBusId: '0000:1b:00.0'}\n"
)


def test_hopper_on_nvswitch_is_registered_without_a_cluster_and_without_nvswitch_has_no_fabric(
    make_node: MakeNode,
) -> None:
    assert {make_node("hgx-h200").fabric(i) for i in range(8)} == {REGISTERED}
    pairs = make_node("h100-nvl-pairs")
    assert pairs.fabric(0) == SimFabric(FabricState.NOT_SUPPORTED, 0, NO_CLUSTER_UUID, 0)
    assert code_of(lambda: make_node("dgx-a100-40gb").fabric(0)) == NOT_SUPPORTED
    mixed = make_node("mixed")
    assert code_of(lambda: mixed.fabric(4)) == NOT_SUPPORTED  # L4, Ada Lovelace


def test_a_clique_profile_reports_its_cluster_only_while_registration_succeeded(
    make_node: MakeNode, profile_file: Callable[[str], str]
) -> None:
    node = make_node(profile_file(CLIQUE_NODE))
    assert node.fabric(0) == SimFabric(FabricState.COMPLETED, 0, "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", 7)
    node.set_fabric_state(0, FabricState.IN_PROGRESS)
    assert node.fabric(0) == SimFabric(FabricState.IN_PROGRESS, 0, NO_CLUSTER_UUID, 0)
    node.set_fabric_state(0, FabricState.COMPLETED, status=999)
    assert node.fabric(0) == SimFabric(FabricState.COMPLETED, 999, NO_CLUSTER_UUID, 0)


def test_an_injected_fabric_state_outlives_a_restart(make_node: MakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    make_node("hgx-h100-80gb", state_path=state).set_fabric_state(2, FabricState.NOT_STARTED)
    again = make_node("hgx-h100-80gb", state_path=state)
    assert again.fabric(2).state == FabricState.NOT_STARTED
    assert again.fabric(1) == REGISTERED


def test_a_state_file_from_before_fabric_info_keeps_the_profiles_fabric(make_node: MakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    make_node("hgx-h100-80gb", state_path=state)
    raw = json.loads(state.read_text())
    for entry in raw["gpus"].values():
        del entry["fabric"]
    state.write_text(json.dumps(raw))
    assert make_node("hgx-h100-80gb", state_path=state).fabric(0) == REGISTERED


def test_fabric_state_cannot_be_injected_where_nvml_has_no_fabric_info(make_node: MakeNode) -> None:
    node = make_node("dgx-a100-80gb")
    with pytest.raises(ValueError, match="only Hopper and newer"):
        node.set_fabric_state(0, FabricState.IN_PROGRESS)
    with pytest.raises(ValueError, match="7 is not a valid FabricState"):
        make_node("hgx-h100-80gb").set_fabric_state(0, 7)


# --- built-in profiles ----------------------------------------------------------------------------------------

EXPECTED_PROFILES = {
    "dgx-a100-40gb": (8, {"NVIDIA A100-SXM4-40GB"}, "switch"),
    "dgx-a100-80gb": (8, {"NVIDIA A100-SXM4-80GB"}, "switch"),
    "hgx-h100-80gb": (8, {"NVIDIA H100 80GB HBM3"}, "switch"),
    "hgx-h200": (8, {"NVIDIA H200"}, "switch"),
    "h100-nvl-pairs": (4, {"NVIDIA H100 NVL"}, "pairs"),
    "mixed": (6, {"NVIDIA A100-SXM4-40GB", "NVIDIA L4"}, "pairs"),
    "gb200-nvl72-tray": (4, {"NVIDIA GB200"}, "switch"),
}


def test_every_built_in_profile_is_covered_here() -> None:
    assert set(builtin_profile_names()) == set(EXPECTED_PROFILES)


@pytest.mark.parametrize("name", sorted(EXPECTED_PROFILES))
def test_built_in_profile_loads_with_its_gpus_and_nvlink_topology(make_node: MakeNode, name: str) -> None:
    count, products, topology = EXPECTED_PROFILES[name]
    node = make_node(name)
    assert len(node.gpus) == count
    assert {g.product_name for g in node.gpus} == products
    assert [g.pci_bus_id for g in node.gpus] == sorted(g.pci_bus_id for g in node.gpus)
    assert len({g.uuid for g in node.gpus}) == count
    for gpu in node.gpus:
        links = gpu.product.nvlinks
        if links == 0:
            assert code_of(lambda gpu=gpu: node.nvlink(gpu.index, 0)) == NOT_SUPPORTED
            continue
        peers = [node.nvlink(gpu.index, link) for link in range(links)]
        assert code_of(lambda gpu=gpu, links=links: node.nvlink(gpu.index, links)) == INVALID_ARGUMENT
        if topology == "switch":
            assert all(p is not None and p[1] == NvlinkPeerType.SWITCH for p in peers)
            assert not {p[0] for p in peers if p} & {g.pci_bus_id for g in node.gpus}
        else:
            assert {p for p in peers} == {(_partner(node, gpu.index), NvlinkPeerType.GPU)}


def _partner(node: SimulatedNode, index: int) -> str:
    bus = node.gpus[index].pci_bus_id
    for a, b in node.profile.nvlink_bridges:
        pair = (node.profile.gpus[a].pci_bus_id, node.profile.gpus[b].pci_bus_id)
        if bus in pair:
            return pair[1] if bus == pair[0] else pair[0]
    raise AssertionError(f"{bus} is not bridged")


def test_gpu_uuids_are_stable_per_node_name_and_differ_between_nodes(make_node: MakeNode) -> None:
    a, again, other = make_node(node_name="a"), make_node(node_name="a"), make_node(node_name="b")
    assert [g.uuid for g in a.gpus] == [g.uuid for g in again.gpus]
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in other.gpus}


# --- bad profile files ----------------------------------------------------------------------------------------

GOOD_GPU = '{product: NVIDIA A100-SXM4-40GB, pciBusId: "0000:07:00.0"}'
H200 = '{product: NVIDIA H200, pciBusId: "0000:1b:00.0"}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\ngpus:\n  - {product: NVIDIA Z100, pciBusId: '0000:07:00.0'}\n", "gpus[0].product: unknown product"),
        (f"name: x\ngpus:\n  - {GOOD_GPU}\n  - {GOOD_GPU}\n", "gpus[1].pciBusId: 0000:07:00.0 is used by two GPUs"),
        (
            "name: x\ngpus:\n  - {product: NVIDIA L4, pciBusId: '0000:07:00.0', migEnabled: true}\n",
            "gpus[0]: NVIDIA L4 does not support MIG",
        ),
        (f"name: x\nnvlinkBridges: [[0, 3]]\ngpus:\n  - {GOOD_GPU}\n", "nvlinkBridges[0]: GPU index 3 does not exist"),
        (
            "name: x\ngpus:\n  - {product: NVIDIA A100-SXM4-40GB, pciBusId: '0000:07:00.0', migEnabled: true,"
            " migDevices: [{profile: 5g.25gb, start: 0}]}\n",
            "gpus[0].migDevices[0].profile: NVIDIA A100-SXM4-40GB has no",
        ),
        ("name: x\ngpus: [\n", "not valid YAML"),
        (f'name: "node-a\\n"\ngpus:\n  - {GOOD_GPU}\n', "name: 'node-a\\n' is not a node name without dots"),
        (f"name: node.a\ngpus:\n  - {GOOD_GPU}\n", "name: 'node.a' is not a node name without dots"),
        ("- just\n- a list\n", "must be a mapping"),
        ("name: x\ngpus:\n  - {product: NVIDIA L4, pciBusId: '7:0.0'}\n", "gpus.0.pciBusId"),
        (f"name: x\ncolour: blue\ngpus:\n  - {GOOD_GPU}\n", "colour: Extra inputs are not permitted"),
        (
            f"name: x\nfabric: {{clusterUuid: {'1' * 8}-1111-1111-1111-{'1' * 12}, cliqueId: 1}}\ngpus:\n  - {H200}\n",
            "fabric: a multi-node NVLink clique needs an NVSwitch fabric; add nvswitch: true",
        ),
        (
            f"name: x\nnvswitch: true\nfabric: {{clusterUuid: {'1' * 8}-1111-1111-1111-{'1' * 12}, cliqueId: 1}}\n"
            f"gpus:\n  - {GOOD_GPU}\n",
            "fabric: gpus[0] is NVIDIA A100-SXM4-40GB (Ampere), which has no fabric info",
        ),
        (
            f"name: x\nnvswitch: true\nfabric: {{clusterUuid: cluster-1, cliqueId: 1}}\ngpus:\n  - {H200}\n",
            "fabric.clusterUuid: 'cluster-1' is not a UUID",
        ),
        (
            f"name: x\nnvswitch: true\nfabric: {{clusterUuid: '{NO_CLUSTER_UUID}', cliqueId: 1}}\ngpus:\n  - {H200}\n",
            "fabric.clusterUuid: the all-zero UUID means 'not in a multi-node clique'; omit fabric instead",
        ),
        (
            f"name: x\nnvswitch: true\nfabric: {{clusterUuid: {'1' * 8}-1111-1111-1111-{'1' * 12}, cliqueId: -1}}\n"
            f"gpus:\n  - {H200}\n",
            "fabric.cliqueId: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_profile_file_is_a_config_error_naming_the_field(
    profile_file: Callable[[str], str], text: str, expected: str
) -> None:
    path = profile_file(text)
    with pytest.raises(ConfigError) as caught:
        load_node_profile(path)
    assert path in str(caught.value)
    assert expected in str(caught.value)


def test_an_unknown_profile_name_lists_the_built_in_ones() -> None:
    with pytest.raises(ConfigError, match="dgx-a100-40gb"):
        load_node_profile("no-such-profile")


def test_mig_devices_that_do_not_fit_are_a_config_error(
    profile_file: Callable[[str], str], make_node: MakeNode
) -> None:
    path = profile_file(
        "name: x\ngpus:\n  - {product: NVIDIA A100-SXM4-40GB, pciBusId: '0000:07:00.0', "
        "migEnabled: true, migDevices: [{profile: 3g.20gb, start: 0}, {profile: 4g.20gb, start: 0}]}\n"
    )
    with pytest.raises(ConfigError, match=r"MIG device 4g.20gb at slice 0 on 0000:07:00.0"):
        make_node(path)


def test_a_second_process_sharing_the_state_file_sees_and_makes_changes_like_shared_hardware(tmp_path):
    from dradriver.sim.node import SimulatedNode, full_compute_instance_profile
    from dradriver.sim.profiles import load_node_profile

    state = tmp_path / "state.json"
    driver_view = SimulatedNode(load_node_profile("mixed"), state_path=state)
    kept = driver_view.mig_devices(0)
    admin = SimulatedNode(load_node_profile("mixed"), state_path=state)  # think: nvidia-smi on the same node
    admin.set_mig_mode(1, True)
    admin.reset_gpu(1)
    gi = admin.create_gpu_instance(1, 19, 0)
    ci = admin.create_compute_instance(1, gi.id, full_compute_instance_profile(1))

    assert driver_view.gpu(1).mig_current
    assert [(g.id, c.uuid) for g, c in driver_view.mig_devices(1)] == [(gi.id, ci.uuid)]
    # Instances that did not change keep their identity, so NVML handles to them stay valid.
    assert [pair[1] for pair in driver_view.mig_devices(0)] == [pair[1] for pair in kept]
    assert all(a[1] is b[1] for a, b in zip(driver_view.mig_devices(0), kept, strict=True))


def test_a_corrupt_shared_state_file_is_ignored_by_a_running_simulator(tmp_path):
    from dradriver.sim.node import SimulatedNode
    from dradriver.sim.profiles import load_node_profile

    state = tmp_path / "state.json"
    node = SimulatedNode(load_node_profile("mixed"), state_path=state)
    before = len(node.mig_devices(0))
    state.write_text("{broken")
    assert len(node.mig_devices(0)) == before


def test_a_profile_with_more_gpus_than_a_node_holds_is_refused(tmp_path: Path) -> None:
    gpus = "".join(f"- {{product: A100-SXM4-80GB, pciBusId: '0000:{i:02x}:00.0'}}\n" for i in range(65))
    profile = tmp_path / "big.yaml"
    profile.write_text("name: big\ngpus:\n" + gpus)
    with pytest.raises(ConfigError, match=r"gpus: .*at most 64"):
        load_node_profile(str(profile))


def test_event_ids_are_never_reused_after_a_reset_removed_the_logged_events(
    make_node: MakeNode, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    driver = make_node(state_path=state)
    after = driver.last_event_sequence()
    make_node(state_path=state).lose_gpu(2)
    assert driver.wait_event(after, {2}, timeout_s=5) is not None
    make_node(state_path=state).reset_gpu(2)  # another process: the log no longer holds the lost event
    make_node(state_path=state).inject_xid(1, 79)
    event = driver.wait_event(after, {1}, timeout_s=5)
    assert event is not None and event.xid == 79


def test_time_slice_follows_nvidia_smi_rules_and_persists(make_node: MakeNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    node = make_node("dgx-a100-80gb", state_path=state)
    node.set_timeslice(1, 3)
    assert make_node("dgx-a100-80gb", state_path=state).gpu(1).timeslice == 3
    with pytest.raises(SimNvmlError, match="time-slice value 4 is not 0 to 3"):
        node.set_timeslice(1, 4)
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    with pytest.raises(SimNvmlError, match="MIG is enabled"):
        node.set_timeslice(0, 1)
    with pytest.raises(SimNvmlError, match="needs root"):
        make_node("dgx-a100-80gb", privileged=False).set_timeslice(1, 1)
