"""ResourceSlices built from simulated nodes: shapes, attributes, limits, and counters that match the hardware."""

import itertools
import re
from collections import Counter

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.nodes import inventory_of

from dradriver.driver.publish.slices import (
    SliceSettings,
    as_resource_slices,
    build_slice_specs,
    shape_for,
)
from dradriver.errors import ConfigError
from dradriver.gpu.inventory import MigMode
from dradriver.sim.node import SimNvmlError, SimulatedNode
from dradriver.sim.profiles import builtin_profile_names, load_node_profile
from dradriver.validation.slices import SliceShape, validate_pool

DOMAIN = "gpu.dradriver.dev"


INVENTORIES = {name: inventory_of(name) for name in builtin_profile_names()}


def quantity(text: str) -> int:
    match = re.fullmatch(r"(\d+)(Gi|Mi)?", text)
    assert match, text
    return int(match[1]) * {"Gi": 2**30, "Mi": 2**20, None: 1}[match[2]]


def slices_for(profile: str, mode: MigMode, shape: SliceShape = SliceShape.V1_35) -> list[dict]:
    specs = build_slice_specs(INVENTORIES[profile], SliceSettings(mig_mode=mode, shape=shape))
    return as_resource_slices(specs, node_name="node-a")


@pytest.mark.parametrize("shape", list(SliceShape))
@pytest.mark.parametrize("mode", list(MigMode))
@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_profile_and_mode_passes_both_validators(profile, mode, shape):
    slices = slices_for(profile, mode, shape)
    for obj in slices:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert validate_pool(slices, shape=shape) == []


def devices_of(slices: list[dict]) -> list[dict]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def test_full_gpu_attributes_are_typed_as_documented():
    gpu = devices_of(slices_for("dgx-a100-80gb", MigMode.NONE))[0]
    assert gpu["name"] == "gpu-0000-07-00-0"
    attrs = gpu["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert attrs["brand"] == {"string": "Nvidia"}
    assert attrs["architecture"] == {"string": "Ampere"}
    assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}
    assert attrs["driverVersion"] == {"version": "580.65.6"}
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["migCapable"] == {"bool": True}
    assert attrs["nvlinkDomain"] == {"string": "nvswitch-0000-07-00-0"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert attrs["uuid"]["string"].startswith("GPU-")
    assert gpu["capacity"] == {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "108"}}


def test_mig_partitions_carry_parent_profile_placement_and_their_own_capacity():
    devices = {d["name"]: d for d in devices_of(slices_for("dgx-a100-80gb", MigMode.DYNAMIC))}
    mig = devices["gpu-0000-07-00-0-mig-3g40gb-4"]
    parent = devices["gpu-0000-07-00-0"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["parentUUID"] == parent["attributes"]["uuid"]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["placementStart"] == {"int": 4}
    assert "uuid" not in mig["attributes"]  # not carved yet
    assert quantity(mig["capacity"]["memory"]["value"]) == 40192 * 2**20
    assert mig["capacity"]["multiprocessors"] == {"value": "42"}


def test_mig_partitions_carry_one_memory_slice_capacity_per_slice_of_their_placement():
    devices = {d["name"]: d for d in devices_of(slices_for("dgx-a100-80gb", MigMode.DYNAMIC))}
    capacity = devices["gpu-0000-07-00-0-mig-3g40gb-4"]["capacity"]
    assert {k: v for k, v in capacity.items() if k.startswith("memorySlice")} == {
        f"memorySlice{i}": {"value": "1"} for i in range(4, 8)
    }
    static = [d for d in devices_of(slices_for("mixed", MigMode.STATIC)) if d["attributes"]["type"]["string"] == "mig"]
    assert len(static) == 3 and all(any(k.startswith("memorySlice") for k in d["capacity"]) for d in static)


def test_the_addressing_mode_is_published_where_nvml_reports_one():
    from dradriver.gpu.inventory import discover
    from dradriver.sim.fakelib import simulated_gpulib_on

    node = SimulatedNode(load_node_profile("dgx-a100-80gb"), node_name="node-a")
    node.gpus[0].addressing_mode = 1  # NVML_DEVICE_ADDRESSING_MODE_HMM
    gpulib = simulated_gpulib_on(node)
    try:
        inventory = discover(gpulib)
    finally:
        gpulib.close()
    devices = devices_of(as_resource_slices(build_slice_specs(inventory), node_name="node-a"))
    modes = {d["name"]: d["attributes"].get("addressingMode") for d in devices if "-mig-" not in d["name"]}
    assert modes["gpu-0000-07-00-0"] == {"string": "HMM"}
    assert [m for name, m in modes.items() if name != "gpu-0000-07-00-0"] == [None] * 7
    partitions = [d for d in devices if d["name"].startswith("gpu-0000-07-00-0-mig-")]
    assert partitions and all(d["attributes"]["addressingMode"] == {"string": "HMM"} for d in partitions)


def test_static_mig_devices_publish_their_uuid():
    devices = devices_of(slices_for("mixed", MigMode.STATIC))
    migs = [d for d in devices if d["attributes"]["type"] == {"string": "mig"}]
    assert len(migs) == 3
    assert all(d["attributes"]["uuid"]["string"].startswith("MIG-") for d in migs)
    assert all("consumesCounters" not in d for d in devices)


def test_dynamic_layout_for_1_35_puts_counter_sets_in_their_own_slice():
    slices = slices_for("dgx-a100-80gb", MigMode.DYNAMIC)
    assert "devices" not in slices[0]["spec"]
    assert len(slices[0]["spec"]["sharedCounters"]) == 8
    device_slices = slices[1:]
    assert len(device_slices) == 8
    assert all("sharedCounters" not in s["spec"] for s in device_slices)
    assert all(len(s["spec"]["devices"]) == 26 for s in device_slices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {9}


def test_dynamic_layout_for_1_34_keeps_each_gpus_counters_inline_within_32_counters():
    slices = slices_for("dgx-a100-80gb", MigMode.DYNAMIC, SliceShape.V1_34)
    assert len(slices) == 8
    for s in slices:
        assert len(s["spec"]["sharedCounters"]) == 1
        assert sum(len(cs["counters"]) for cs in s["spec"]["sharedCounters"]) <= 32


def test_non_mig_gpus_do_not_consume_counters_in_dynamic_mode():
    devices = devices_of(slices_for("mixed", MigMode.DYNAMIC))
    l4s = [d for d in devices if d["attributes"]["productName"] == {"string": "NVIDIA L4"}]
    assert len(l4s) == 2
    assert all("consumesCounters" not in d for d in l4s)


def test_kubernetes_version_picks_the_shape_and_rejects_nonsense():
    assert shape_for("1.34") is SliceShape.V1_34
    assert shape_for("v1.36.2") is SliceShape.V1_35
    assert shape_for("1.32") is SliceShape.V1_34  # served as v1beta1 (v1beta2 on 1.33): counters inline
    assert shape_for("1.33") is SliceShape.V1_34
    with pytest.raises(ConfigError, match=r"1\.32 or newer"):
        shape_for("1.31")
    with pytest.raises(ConfigError, match="not a version"):
        shape_for("latest")


# --- counters versus the hardware --------------------------------------------------------------------------

A100_SLICES = slices_for("dgx-a100-80gb", MigMode.DYNAMIC)
COUNTER_SETS = {
    cs["name"]: {k: quantity(v["value"]) for k, v in cs["counters"].items()}
    for s in A100_SLICES
    for cs in s["spec"].get("sharedCounters", [])
}
FIRST_GPU = [d for d in devices_of(A100_SLICES) if d["name"].startswith("gpu-0000-07-00-0")]
PARTITIONS = [d for d in FIRST_GPU if d["attributes"]["type"] == {"string": "mig"}]
PROFILE_IDS = {"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0}


def counters_admit(devices: list[dict]) -> bool:
    used: Counter[tuple[str, str]] = Counter()
    for device in devices:
        for consumption in device["consumesCounters"]:
            for name, value in consumption["counters"].items():
                used[consumption["counterSet"], name] += quantity(value["value"])
    return all(amount <= COUNTER_SETS[cs][name] for (cs, name), amount in used.items())


def hardware_accepts(devices: list[dict]) -> bool:
    node = SimulatedNode(load_node_profile("dgx-a100-80gb"))
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    try:
        for device in devices:
            attrs = device["attributes"]
            node.create_gpu_instance(0, PROFILE_IDS[attrs["profile"]["string"]], attrs["placementStart"]["int"])
    except SimNvmlError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=8, unique_by=lambda d: d["name"]))
def test_counters_admit_exactly_the_partition_sets_the_hardware_accepts(chosen):
    assert counters_admit(chosen) == hardware_accepts(chosen)


def test_every_overlapping_pair_of_partitions_is_rejected_by_the_counters():
    for a, b in itertools.combinations(PARTITIONS, 2):
        if not hardware_accepts([a, b]):
            assert not counters_admit([a, b]), (a["name"], b["name"])


def test_the_whole_gpu_excludes_every_partition():
    whole = next(d for d in FIRST_GPU if d["attributes"]["type"] == {"string": "gpu"})
    assert counters_admit([whole])
    for partition in PARTITIONS:
        assert not counters_admit([whole, partition]), partition["name"]


def test_taints_go_on_their_devices_and_slices_hold_at_most_64_devices_with_health_on():
    inventory = inventory_of("dgx-a100-40gb")
    bad = {"gpu-0000-0f-00-0": [{"key": f"{DOMAIN}/xid", "value": "79", "effect": "NoSchedule"}]}
    specs = build_slice_specs(inventory, SliceSettings(mig_mode=MigMode.NONE), taints=lambda n: bad.get(n, []))
    devices = {d["name"]: d for s in specs for d in s["devices"]}
    assert devices["gpu-0000-0f-00-0"]["taints"] == bad["gpu-0000-0f-00-0"]
    assert "taints" not in devices["gpu-0000-07-00-0"]
    objects = as_resource_slices(specs, node_name="node-a")
    assert validate_pool(objects) == []
    for obj in objects:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_mig_partitions_carry_their_parents_taints_in_dynamic_mode():
    inventory = inventory_of("dgx-a100-40gb")
    parent = inventory.gpus[0]
    family = {parent.name} | {p.name for p in inventory.partitions(parent)}
    taint = [{"key": f"{DOMAIN}/ecc", "value": "2", "effect": "NoSchedule"}]
    specs = build_slice_specs(inventory, SliceSettings(), taints=lambda n: taint if n in family else [])
    tainted = {d["name"] for s in specs for d in s.get("devices", []) if d.get("taints")}
    assert tainted == family
    assert validate_pool(as_resource_slices(specs, node_name="node-a")) == []


def test_a_device_gets_no_more_taints_than_its_kubernetes_version_allows():
    inventory = inventory_of("dgx-a100-40gb")
    many = [{"key": f"{DOMAIN}/k{i}", "value": "", "effect": "NoSchedule"} for i in range(20)]
    for shape, limit in ((SliceShape.V1_34, 4), (SliceShape.V1_35, 16)):
        specs = build_slice_specs(inventory, SliceSettings(mig_mode=MigMode.NONE, shape=shape), taints=lambda n: many)
        assert {len(d["taints"]) for s in specs for d in s["devices"]} == {limit}
        assert validate_pool(as_resource_slices(specs, node_name="node-a"), shape=shape) == []


def test_informational_taints_are_left_out_for_kubernetes_1_34():
    inventory = inventory_of("dgx-a100-40gb")
    both = [
        {"key": f"{DOMAIN}/xid", "value": "79", "effect": "NoSchedule"},
        {"key": f"{DOMAIN}/xid", "value": "31", "effect": "None"},
    ]
    for shape, effects in ((SliceShape.V1_34, ["NoSchedule"]), (SliceShape.V1_35, ["NoSchedule", "None"])):
        specs = build_slice_specs(inventory, SliceSettings(mig_mode=MigMode.NONE, shape=shape), taints=lambda n: both)
        assert [t["effect"] for t in specs[0]["devices"][0]["taints"]] == effects


@pytest.mark.parametrize("mode", list(MigMode))
@pytest.mark.parametrize("shape", list(SliceShape))
def test_consumable_gpus_pass_the_validator_and_dynamic_mig_gpus_stay_exclusive(mode, shape):
    from dradriver.driver.publish.slices import SliceSettings, as_resource_slices, build_slice_specs

    settings = SliceSettings(mig_mode=mode, shape=shape, gpu_sharing="consumable")
    specs = build_slice_specs(INVENTORIES["mixed"], settings)
    assert validate_pool(as_resource_slices(specs, node_name="node-a"), shape=shape) == []
    devices = [d for s in specs for d in s.get("devices", [])]
    gpus = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    shared = [d for d in gpus if d.get("allowMultipleAllocations")]
    assert shared, "no GPU is shareable"
    for device in shared:
        assert "consumesCounters" not in device
        memory, shares = device["capacity"]["memory"], device["capacity"]["shares"]
        assert memory["requestPolicy"]["default"] == memory["value"]  # asking for nothing takes the whole GPU
        assert shares == {
            "value": "100",
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
        }
    assert all("allowMultipleAllocations" not in d for d in devices if d["attributes"]["type"]["string"] == "mig")
    if mode is MigMode.DYNAMIC:
        assert all("allowMultipleAllocations" not in d for d in gpus if "consumesCounters" in d)


@pytest.mark.parametrize("mode", ["memory", "unlimited", "4"])
def test_consumable_shares_make_gpus_and_static_mig_devices_shareable_in_every_mode(mode):
    specs = build_slice_specs(INVENTORIES["mixed"], SliceSettings(mig_mode=MigMode.STATIC, consumable_shares=mode))
    slices = as_resource_slices(specs, node_name="node-a")
    for obj in slices:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert validate_pool(slices) == []
    devices = devices_of(slices)
    assert {d["attributes"]["type"]["string"] for d in devices} == {"gpu", "mig"}
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        memory = device["capacity"]["memory"]
        policy = memory["requestPolicy"]
        assert policy["default"] == (memory["value"] if mode == "memory" else "0")
        assert policy["validRange"] == {
            "min": "1Mi" if mode == "memory" else "0",
            "max": memory["value"],
            "step": "1Mi",
        }
        # every other capacity is consumed only when asked for, so a second claim still fits
        assert all(
            c["requestPolicy"]["default"] == "0" for n, c in device["capacity"].items() if n not in ("memory", "shares")
        )
        if mode == "4":
            assert device["capacity"]["shares"] == {
                "value": "4",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
            }
        else:
            assert "shares" not in device["capacity"]


def test_a_consumable_shares_value_that_is_no_mode_is_refused():
    from dradriver.driver.publish.slices import check_consumable_shares

    for good in ("memory", "unlimited", "1", "16"):
        check_consumable_shares(good)
    for bad in ("0", "-1", "lots", ""):
        with pytest.raises(ConfigError, match="give memory"):
            check_consumable_shares(bad)


NUMA_LIST_SELECTOR = 'device.attributes["resource.kubernetes.io"].numaNode.exists(n, n == 1)'


@pytest.mark.parametrize("mode", [MigMode.STATIC, MigMode.DYNAMIC])
def test_list_attributes_publish_the_numa_node_as_a_list_within_64_devices_a_slice(mode):
    from dradriver.allocator.allocator import allocate

    settings = SliceSettings(mig_mode=mode, list_attributes=True)
    slices = as_resource_slices(build_slice_specs(INVENTORIES["dgx-a100-80gb"], settings), node_name="node-a")
    for version in ("1.36.0", "1.37.0"):
        for obj in slices:
            kubernetes_validate.validate(obj, version, strict=True)
    assert validate_pool(slices) == []
    devices = devices_of(slices)
    assert devices and all(d["attributes"]["resource.kubernetes.io/numaNode"]["ints"] for d in devices)
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in slices)
    # A selector written for the list form (NVIDIA's with DRAListTypeAttributes) selects through our CEL.
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "numa", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "any",
                            "selectors": [{"cel": {"expression": NUMA_LIST_SELECTOR}}],
                        },
                    }
                ]
            }
        },
    }
    any_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "any"}, "spec": {}}
    [result] = allocate(claim, slices=slices, classes=[any_class], node="node-a")["devices"]["results"]
    [device] = [d for d in devices if d["name"] == result["device"]]
    assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"ints": [1]}


def test_list_attributes_need_kubernetes_1_36():
    from dradriver.driver.publish.slices import release_problem

    settings = SliceSettings(mig_mode=MigMode.STATIC, list_attributes=True)
    assert "DRAListTypeAttributes" in str(release_problem("1.35", settings))
    assert release_problem("1.36", settings) is None
