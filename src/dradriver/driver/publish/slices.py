"""Build the ResourceSlices (resource.k8s.io/v1) that describe a node's GPUs to the scheduler.

Pure: inventory + settings in, JSON-form slice specs out. Every attribute published here is something a claim can
select on in CEL; every counter is what keeps the scheduler from double-booking a GPU.

Layout (documented in docs/slices.md):
- ``none`` / ``static``: devices only, up to 128 per slice.
- ``dynamic``, Kubernetes >= 1.35 (default): the counter sets in slices of their own (8 per slice), then one
  slice per MIG-capable GPU holding the GPU and all its partitions (26 devices on A100/H100, under the limit of
  64 for devices that consume counters), then the GPUs without MIG, 128 per slice.
- ``dynamic``, Kubernetes 1.34: one slice per MIG-capable GPU carrying its own counter set inline (1.34 allows at
  most 32 counters per slice and a GPU's set has 15), then the GPUs without MIG.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.errors import ConfigError, DeviceError
from dradriver.gpu.inventory import GpuDevice, Inventory, MigMode, MigPartition, semver_of_driver
from dradriver.gpu.models import MigProfile, Placement
from dradriver.gpu.products import COMPUTE_SLICES_PER_GPU, MEMORY_SLICES_PER_GPU
from dradriver.quantity import Quantity
from dradriver.validation.slices import SliceShape

STANDARD_DOMAIN = "resource.kubernetes.io"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_DEVICES_WITH_TAINTS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_TAINTS_PER_DEVICE = {SliceShape.V1_34: 4, SliceShape.V1_35: 16}

# A device name → its taints (JSON form), as ``GpuHealth.taints`` gives them.
TaintSource = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class SliceSettings:
    driver: str = DEFAULT_DRIVER_NAME
    mig_mode: MigMode = MigMode.DYNAMIC
    shape: SliceShape = SliceShape.V1_35
    gpu_sharing: str = "exclusive"  # or "consumable": whole GPUs shared by claims (KEP-5075), see docs/sharing.md
    # NVIDIA's consumable shares (--consumable-shares): "memory", "unlimited" or a number of shares; None: off.
    consumable_shares: str | None = None
    # numaNode as a list of ints (KEP-6072 list attributes, Kubernetes 1.36+ with DRAListTypeAttributes), as NVIDIA's
    # driver publishes it with that gate: a server without the gate would refuse the devices.
    list_attributes: bool = False
    # Extra attributes of whole GPUs by PCI address: Fabric Manager's gpuModuleID and partitionN
    # (--fabric-manager-partitions, driver/prepare/partitions.py).
    gpu_attributes: Mapping[str, Mapping[str, dict[str, Any]]] = field(default_factory=dict)


#: With ``--gpu-sharing consumable``: a GPU's compute share as a capacity, in percent of its multiprocessors.
SHARES = 100
MIB = 2**20


# Counter names (DNS labels) of a GPU's counter set, mapped to the MigProfile field they count.
ENGINE_COUNTERS = {
    "multiprocessors": "multiprocessors",
    "copy-engines": "copy_engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpeg-engines": "jpeg_engines",
    "ofa-engines": "ofa_engines",
}


def build_slice_specs(
    inventory: Inventory, settings: SliceSettings = SliceSettings(), *, taints: TaintSource | None = None
) -> list[dict[str, Any]]:
    """The pool's slices as ``spec`` fragments: each has ``devices`` and/or ``sharedCounters``.

    With ``taints`` (health monitoring on) every device gets its current taints, most severe first and no more
    than a device may carry, and slices hold at most 64 devices whether or not any is tainted now, so a device
    never moves to another slice when its health changes. The caller (the publisher, or ``as_resource_slices``)
    adds driver, pool and node fields.
    """
    # Taints and list attributes each lower the limit of devices per slice to 64.
    limited = taints is not None or settings.list_attributes
    per_slice = MAX_DEVICES_WITH_TAINTS if limited else MAX_DEVICES_PER_SLICE

    def device(d: GpuDevice | MigPartition, *, counters: bool = False) -> dict[str, Any]:
        built = _device(d, inventory, settings.driver, counters=counters, lists=settings.list_attributes)
        if isinstance(d, GpuDevice):
            built["attributes"].update(settings.gpu_attributes.get(d.info.pci_bus_id, {}))
        if settings.gpu_sharing == "consumable" and isinstance(d, GpuDevice) and not counters:
            _make_consumable(built, d)
        elif settings.consumable_shares and not counters:
            make_shared(built, settings.consumable_shares)
        found = taints(d.name) if taints is not None else []
        if settings.shape is SliceShape.V1_34:
            # Effect None (informational) is in the v1 types of 1.36, not in those of 1.33/1.34: a 1.34 server
            # could refuse the whole slice for it, so such taints are left out there.
            found = [t for t in found if t.get("effect") != "None"]
        if found:
            built["taints"] = found[: MAX_TAINTS_PER_DEVICE[settings.shape]]
        return built

    if settings.mig_mode is not MigMode.DYNAMIC:
        devices = [device(d) for d in inventory.devices(settings.mig_mode)]
        return [{"devices": chunk} for chunk in _chunks(devices, per_slice)] or [{"devices": []}]

    partitioned = [gpu for gpu in inventory.gpus if gpu.mig_profiles]
    whole_only = [gpu for gpu in inventory.gpus if not gpu.mig_profiles]
    specs: list[dict[str, Any]] = []
    if settings.shape is SliceShape.V1_35:
        sets = [_counter_set(gpu) for gpu in partitioned]
        specs.extend({"sharedCounters": chunk} for chunk in _chunks(sets, MAX_COUNTER_SETS_PER_SLICE))
    for gpu in partitioned:
        devices = [device(gpu, counters=True)]
        devices.extend(device(p, counters=True) for p in inventory.partitions(gpu))
        if len(devices) > MAX_DEVICES_WITH_COUNTERS:
            raise DeviceError(
                f"{gpu.name} has {len(devices)} devices, more than the {MAX_DEVICES_WITH_COUNTERS} a "
                "slice may hold when devices consume counters; nothing is published for this node: "
                "use --mig-mode static or none"
            )
        spec: dict[str, Any] = {"devices": devices}
        if settings.shape is SliceShape.V1_34:
            spec["sharedCounters"] = [_counter_set(gpu)]
        specs.append(spec)
    plain = [device(gpu) for gpu in whole_only]
    specs.extend({"devices": chunk} for chunk in _chunks(plain, per_slice))
    return specs or [{"devices": []}]


def as_resource_slices(
    specs: list[dict[str, Any]], *, node_name: str, driver: str = DEFAULT_DRIVER_NAME, generation: int = 1
) -> list[dict[str, Any]]:
    """Complete ResourceSlice objects for ``specs`` as one pool named after the node (for printing and tests)."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{driver}-{index}"},
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for index, spec in enumerate(specs)
    ]


def counter_set_name(gpu: GpuDevice) -> str:
    return f"{gpu.name}-counters"


def _counter_set(gpu: GpuDevice) -> dict[str, Any]:
    totals = _counter_totals(gpu)
    return {"name": counter_set_name(gpu), "counters": {name: {"value": _quantity(v)} for name, v in totals.items()}}


def _counter_totals(gpu: GpuDevice) -> dict[str, int]:
    """What a GPU's counter set holds: enough for every valid set of partitions, and exactly what the whole GPU
    consumes, so that the whole GPU and any partition exclude each other.

    Memory slices are the placement rule itself (each slice once); the other counters are the largest sums any
    valid combination of partitions reaches, so they never reject a layout the hardware accepts, yet still stop
    e.g. a second "+me" partition (the media engines exist once).
    """
    best = _largest_sums(gpu.mig_profiles)
    totals = {
        "memory": max(best["memory"], gpu.info.memory_bytes),
        "multiprocessors": max(best["multiprocessors"], gpu.info.multiprocessors),
    }
    totals.update({name: best[name] for name in ENGINE_COUNTERS if name not in totals})
    totals.update({f"memory-slice-{i}": 1 for i in range(MEMORY_SLICES_PER_GPU)})
    return totals


@cache
def _largest_sums(profiles: tuple[MigProfile, ...]) -> dict[str, int]:
    best = dict.fromkeys([*ENGINE_COUNTERS, "memory"], 0)
    for combination in _valid_layouts(profiles):
        sums = {name: sum(getattr(p, attr) for p, _ in combination) for name, attr in ENGINE_COUNTERS.items()}
        sums["memory"] = sum(p.memory_bytes for p, _ in combination)
        best = {name: max(best[name], sums[name]) for name in best}
    return best


def _valid_layouts(profiles: Iterable[MigProfile]) -> Iterator[list[tuple[MigProfile, Placement]]]:
    """Every maximal set of partitions the hardware accepts together (non-overlapping, within instance limits)."""
    options = sorted(((p, pl) for p in profiles for pl in p.placements), key=lambda o: (o[1].start, o[0].id))

    def extend(start: int, chosen: list[tuple[MigProfile, Placement]]) -> Iterator[list[tuple[MigProfile, Placement]]]:
        grew = False
        for i in range(start, len(options)):
            profile, placement = options[i]
            if any(placement.overlaps(other) for _, other in chosen):
                continue
            if sum(1 for p, _ in chosen if p.id == profile.id) >= profile.max_instances:
                continue
            if sum(p.slice_count for p, _ in chosen) + profile.slice_count > COMPUTE_SLICES_PER_GPU:
                continue
            grew = True
            yield from extend(i + 1, [*chosen, (profile, placement)])
        if not grew and chosen:
            yield chosen

    yield from extend(0, [])


def _consumption(gpu: GpuDevice, partition: MigPartition | None) -> list[dict[str, Any]]:
    if partition is None:
        counters = _counter_totals(gpu)
    else:
        profile = partition.profile
        counters = {name: getattr(profile, attr) for name, attr in ENGINE_COUNTERS.items()}
        counters = {name: value for name, value in counters.items() if value}
        counters["memory"] = profile.memory_bytes
        counters.update({f"memory-slice-{i}": 1 for i in partition.placement.slices})
    return [
        {
            "counterSet": counter_set_name(gpu),
            "counters": {name: {"value": _quantity(v)} for name, v in counters.items()},
        }
    ]


def _device(
    device: GpuDevice | MigPartition, inventory: Inventory, driver: str, *, counters: bool = False, lists: bool = False
) -> dict[str, Any]:
    gpu = device if isinstance(device, GpuDevice) else device.parent
    info = gpu.info
    attributes: dict[str, dict[str, Any]] = {}
    if isinstance(device, GpuDevice):
        attributes["type"] = {"string": "gpu"}
        attributes["uuid"] = {"string": info.uuid}
    else:
        attributes["type"] = {"string": "mig"}
        if device.uuid:
            attributes["uuid"] = {"string": device.uuid}
        attributes["parentUUID"] = {"string": info.uuid}
        attributes["profile"] = {"string": device.profile.name}
        attributes["placementStart"] = {"int": device.placement.start}
    attributes.update(
        {
            "productName": {"string": info.product_name},
            "brand": {"string": info.brand},
            "architecture": {"string": info.architecture},
            "cudaComputeCapability": {"version": "{}.{}.0".format(*info.cuda_compute_capability)},
            "driverVersion": {"version": semver_of_driver(inventory.driver_version)},
            "cudaDriverVersion": {"version": inventory.cuda_driver_version},
            "migCapable": {"bool": info.mig_capable},
            "nvlinkDomain": {"string": gpu.nvlink_domain},
            f"{STANDARD_DOMAIN}/pciBusID": {"string": info.pci_bus_id},
        }
    )
    if info.pcie_root:
        attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": info.pcie_root}
    if info.numa_node is not None:
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"ints": [info.numa_node]} if lists else {"int": info.numa_node}
    if info.addressing_mode is not None:
        attributes["addressingMode"] = {"string": info.addressing_mode}

    if isinstance(device, GpuDevice):
        capacity = {"memory": info.memory_bytes, "multiprocessors": info.multiprocessors}
    else:
        profile = device.profile
        capacity = {
            "memory": profile.memory_bytes,
            "multiprocessors": profile.multiprocessors,
            "copyEngines": profile.copy_engines,
            "decoders": profile.decoders,
            "encoders": profile.encoders,
            "jpegEngines": profile.jpeg_engines,
            "ofaEngines": profile.ofa_engines,
        }
        # One per memory slice the partition's placement covers, as NVIDIA's driver publishes them: a selector can
        # ask for a placement (device.capacity["gpu.nvidia.com"].memorySlice0 == 1).
        capacity.update({f"memorySlice{i}": 1 for i in device.placement.slices})
    result: dict[str, Any] = {
        "name": device.name,
        "attributes": attributes,
        "capacity": {name: {"value": _quantity(value)} for name, value in capacity.items()},
    }
    if counters:
        result["consumesCounters"] = _consumption(gpu, None if isinstance(device, GpuDevice) else device)
    return result


def _make_consumable(built: dict[str, Any], gpu: GpuDevice) -> None:
    """A whole GPU that several claims share: each takes ``memory`` (default: all of it, so a claim that asks
    for nothing still gets the GPU to itself) and ``shares`` of its compute (default none), which prepare turns
    into the MPS limits of the claim. Multiprocessors are left out: without a request policy every share would
    consume all of them. GPUs that consume MIG counters (dynamic MIG) stay exclusive."""
    memory = _quantity(gpu.info.memory_bytes)
    built["allowMultipleAllocations"] = True
    built["capacity"] = {
        "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}}},
        "shares": {
            "value": str(SHARES),
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": str(SHARES), "step": "1"}},
        },
    }


def check_consumable_shares(mode: str) -> None:
    """Refuse a ``--consumable-shares`` value that is not memory, unlimited or a positive whole number."""
    if mode in ("memory", "unlimited") or (mode.isdigit() and int(mode) > 0):
        return
    raise ConfigError(
        f"--consumable-shares {mode!r}: give memory (each claim takes memory, by default all of it), unlimited "
        "(claims share without limits) or a number of shares (such as 4)"
    )


def make_shared(built: dict[str, Any], mode: str) -> None:
    """A device (whole GPU or MIG device) that several claims share, NVIDIA's consumable shares: ``memory`` (each
    claim takes memory, by default all of it), ``unlimited`` (each takes none unless it asks: oversubscription, as
    device-plugin time-slicing replicas) or N (``shares`` = N, each claim takes one by default). How the sharing
    claims are kept apart is each claim's config: MPS limits from what it consumed, time-slicing, or nothing.
    Every other capacity gets a policy that consumes nothing by default: without one each claim would consume all
    of it, and a second claim could never fit."""
    capacity = built["capacity"]
    memory = Quantity.parse(capacity["memory"]["value"]).value // MIB * MIB
    top = _quantity(memory)
    built["allowMultipleAllocations"] = True
    for entry in capacity.values():
        entry["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": entry["value"]}}
    memory_policy = {
        "default": top if mode == "memory" else "0",
        "validRange": {"min": "1Mi" if mode == "memory" else "0", "max": top, "step": "1Mi"},
    }
    capacity["memory"] = {"value": top, "requestPolicy": memory_policy}
    if mode.isdigit():
        count = str(int(mode))
        capacity["shares"] = {
            "value": count,
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": count, "step": "1"}},
        }


def _quantity(value: int) -> str:
    """Bytes and counts as Kubernetes quantities, in binary units where exact ("80Gi", "9728Mi", "108")."""
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20)):
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _minor(kubernetes_version: str) -> tuple[int, int]:
    try:
        major, minor = (int(part) for part in kubernetes_version.removeprefix("v").split(".")[:2])
    except ValueError:
        raise ConfigError(f"--kubernetes-version {kubernetes_version!r} is not a version like 1.35") from None
    if major != 1:
        raise ConfigError(
            f"--kubernetes-version {kubernetes_version!r}: Kubernetes releases are 1.N; give one like 1.35"
        )
    return major, minor


def shape_for(kubernetes_version: str) -> SliceShape:
    """The slice shape for a cluster's minor version (1.32 to 1.34 → V1_34: counter sets inline with their
    devices, no informational taints; 1.35 and later → V1_35). 1.32 and 1.33 have no resource.k8s.io/v1: the
    cluster adapter speaks the newest version they serve (v1beta2, v1beta1) in its shape."""
    version = _minor(kubernetes_version)
    if version < (1, 32):
        raise ConfigError(
            f"Kubernetes {kubernetes_version} serves no resource.k8s.io version this driver speaks (v1, v1beta2, "
            "v1beta1); DRA needs 1.32 or newer"
        )
    return SliceShape.V1_34 if version < (1, 35) else SliceShape.V1_35


def release_problem(kubernetes_version: str, settings: SliceSettings) -> str | None:
    """What ``settings`` publish that the release cannot take, or None: shared counters (dynamic MIG) need 1.33
    (alpha, DRAPartitionableDevices), consumable capacity needs 1.34 (DRAConsumableCapacity)."""
    version = _minor(kubernetes_version)
    if settings.mig_mode is MigMode.DYNAMIC and version < (1, 33):
        return (
            f"--mig-mode dynamic needs shared counters in ResourceSlices, which Kubernetes {kubernetes_version} does "
            "not have (1.33 and newer, with the DRAPartitionableDevices feature gate before 1.36); use --mig-mode "
            "static"
        )
    if settings.list_attributes and version < (1, 36):
        return (
            f"--list-attributes needs list-typed attributes, which Kubernetes {kubernetes_version} does not have "
            "(1.36 and newer, feature gate DRAListTypeAttributes); turn it off"
        )
    if (settings.gpu_sharing == "consumable" or settings.consumable_shares) and version < (1, 34):
        return (
            f"consumable shares need devices that allow multiple allocations, which Kubernetes {kubernetes_version} "
            "does not have (1.34 and newer, feature gate DRAConsumableCapacity); turn --consumable-shares and "
            "--gpu-sharing consumable off"
        )
    return None
