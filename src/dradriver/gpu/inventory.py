"""Discovery: turn what the GPU layer reports into the node's device model.

Names are derived from the PCI address, never from the NVML index or minor number: those shift when a GPU drops
off the bus, and a claim must never end up on a different GPU than the one it was allocated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from dradriver.gpu.errors import GpuError, NvmlReleased
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.models import FabricInfo, FabricState, GpuInfo, MigDevice, MigProfile, NvlinkPeerType, Placement

log = logging.getLogger(__name__)


class MigMode(StrEnum):
    """Which MIG devices a node offers."""

    NONE = "none"  # whole GPUs only
    STATIC = "static"  # MIG devices an admin already created
    DYNAMIC = "dynamic"  # every profile x placement, carved at prepare time


@dataclass(frozen=True)
class GpuDevice:
    """A physical GPU as the driver offers it."""

    name: str
    info: GpuInfo
    nvlink_domain: str
    mig_enabled: bool
    mig_profiles: tuple[MigProfile, ...]

    @property
    def uuid(self) -> str:
        return self.info.uuid


@dataclass(frozen=True)
class MigPartition:
    """A MIG device by profile and placement on a parent GPU: one that exists, or one that could be carved."""

    name: str
    parent: GpuDevice
    profile: MigProfile
    placement: Placement
    existing: MigDevice | None = None  # set when the MIG device exists on the GPU now

    @property
    def uuid(self) -> str | None:
        return self.existing.uuid if self.existing else None


@dataclass(frozen=True)
class LostGpu:
    """A GPU discovery had to skip: it fell off the bus, or NVML failed on it. The node serves the others.

    ``name`` and ``uuid`` are None when the GPU was lost before it could be read even once (NVML then knows only
    its index); otherwise ``name`` is the device name it is published under once it answers again."""

    index: int
    name: str | None
    uuid: str | None
    reason: str


@dataclass(frozen=True)
class Inventory:
    """Everything discovered on a node; ``devices(mode)`` picks what to offer."""

    driver_version: str
    cuda_driver_version: str
    gpus: tuple[GpuDevice, ...]
    mig_devices: tuple[MigPartition, ...]  # MIG devices that exist now
    lost_gpus: tuple[LostGpu, ...] = ()  # skipped: neither offered nor in ``gpus``

    def partitions(self, gpu: GpuDevice) -> list[MigPartition]:
        """Every profile x placement of ``gpu``; the existing MIG device where one sits exactly there."""
        existing = {(d.profile.id, d.placement.start): d for d in self.mig_devices if d.parent.name == gpu.name}
        return [
            existing.get((profile.id, placement.start))
            or MigPartition(partition_name(gpu.name, profile, placement), gpu, profile, placement)
            for profile in gpu.mig_profiles
            for placement in profile.placements
        ]

    def devices(self, mode: MigMode) -> list[GpuDevice | MigPartition]:
        """The devices a node offers in ``mode``, each GPU followed by its MIG devices.

        ``dynamic`` offers every GPU whole plus every partition of the MIG-capable ones, for prepare to switch MIG
        mode and carve partitions as the allocation needs (docs/mig.md). ``none`` and ``static`` leave a GPU in
        MIG mode to its MIG devices, as a GPU in MIG mode cannot run work as a whole GPU.
        """
        offered: list[GpuDevice | MigPartition] = []
        for gpu in self.gpus:
            if mode is MigMode.DYNAMIC:
                offered.append(gpu)
                offered.extend(self.partitions(gpu))
            else:
                if not gpu.mig_enabled:
                    offered.append(gpu)
                if mode is MigMode.STATIC:
                    offered.extend(d for d in self.mig_devices if d.parent.name == gpu.name)
        return offered


def gpu_name(pci_bus_id: str) -> str:
    """``0000:07:00.0`` → ``gpu-0000-07-00-0``: a DNS label that stays with the PCI slot."""
    return "gpu-" + re.sub(r"[^0-9a-f]", "-", pci_bus_id.lower())


def partition_name(parent: str, profile: MigProfile, placement: Placement) -> str:
    """``gpu-0000-07-00-0-mig-1g10gbme-3`` for profile 1g.10gb+me at memory slice 3.

    Dots and ``+`` go, ``-`` stays: 1g.24gb+me and 1g.24gb-me are different profiles of one GPU (Blackwell)."""
    return f"{parent}-mig-{re.sub(r'[^0-9a-z-]', '', profile.name.lower())}-{placement.start}"


def cuda_version_string(nvml_version: int) -> str:
    """NVML's 13000 → "13.0.0" (a semver, as the attribute is published)."""
    return f"{nvml_version // 1000}.{nvml_version % 1000 // 10}.0"


def semver_of_driver(version: str) -> str:
    """Driver versions like "580.65.06" as semver: numeric parts lose leading zeros ("580.65.6")."""
    parts = [str(int(p)) for p in version.split(".")]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts[:3])


def discover(gpulib: GpuLib) -> Inventory:
    """Read every GPU, its MIG profiles and existing MIG devices, and group GPUs into NVLink domains.

    A GPU that is lost or fails an NVML call is skipped and listed in ``lost_gpus``: one broken GPU must not take
    the node's other GPUs down with it."""
    system = gpulib.system()
    readable = gpulib.gpus()
    lost = [LostGpu(u.index, None, None, u.error) for u in gpulib.unreadable_gpus()]
    infos: list[GpuInfo] = []
    for info in readable:
        try:
            gpulib.probe(info.uuid)
        except NvmlReleased:
            raise  # NVML is let go for an unbind elsewhere, not the GPU lost: the rescan fails, the last one stands
        except GpuError as err:
            lost.append(_skipped(info, err))
            continue
        infos.append(info)
    domains = _nvlink_domains(gpulib, infos)
    gpus: list[GpuDevice] = []
    mig_devices: list[MigPartition] = []
    for info in infos:
        try:
            gpu, existing = _read_gpu(gpulib, info, domains[info.uuid])
        except NvmlReleased:
            raise
        except GpuError as err:
            lost.append(_skipped(info, err))
            continue
        gpus.append(gpu)
        mig_devices.extend(existing)
    _check_unique_names([g.name for g in gpus] + [d.name for d in mig_devices])
    return Inventory(
        driver_version=system.driver_version,
        cuda_driver_version=cuda_version_string(system.cuda_driver_version),
        gpus=tuple(gpus),
        mig_devices=tuple(mig_devices),
        lost_gpus=tuple(sorted(lost, key=lambda g: g.index)),
    )


def _read_gpu(gpulib: GpuLib, info: GpuInfo, nvlink_domain: str) -> tuple[GpuDevice, list[MigPartition]]:
    mig_enabled = False
    profiles: tuple[MigProfile, ...] = ()
    if info.mig_capable:
        mig_enabled = gpulib.mig_mode(info.uuid).current
        profiles = tuple(gpulib.mig_profiles(info.uuid))
    gpu = GpuDevice(
        name=gpu_name(info.pci_bus_id),
        info=info,
        nvlink_domain=nvlink_domain,
        mig_enabled=mig_enabled,
        mig_profiles=profiles,
    )
    return gpu, _existing_mig_devices(gpulib, gpu) if mig_enabled else []


def _skipped(info: GpuInfo, err: GpuError) -> LostGpu:
    log.error(
        "GPU skipped: not offered until it answers again gpu=%s uuid=%s error=%s", info.pci_bus_id, info.uuid, err
    )
    return LostGpu(info.index, gpu_name(info.pci_bus_id), info.uuid, str(err))


def _existing_mig_devices(gpulib: GpuLib, gpu: GpuDevice) -> list[MigPartition]:
    found: dict[str, MigPartition] = {}
    for mig in gpulib.mig_devices(gpu.uuid):
        name = partition_name(gpu.name, mig.profile, mig.placement)
        if name in found:
            # Several compute instances in one GPU instance: we hand out GPU instances whole, so offer the first.
            log.warning(
                "skipping extra compute instance gpu=%s mig=%s gi=%d ci=%d",
                gpu.name,
                mig.uuid,
                mig.gpu_instance_id,
                mig.compute_instance_id,
            )
            continue
        found[name] = MigPartition(name, gpu, mig.profile, mig.placement, existing=mig)
    return list(found.values())


def _nvlink_domains(gpulib: GpuLib, infos: list[GpuInfo]) -> dict[str, str]:
    """GPU UUID → NVLink domain id.

    GPUs on one NVSwitch fabric form one domain; GPUs linked directly (bridges) form one per connected group;
    a GPU without NVLink peers is a domain of its own. Ids are named after the lowest PCI address in the domain,
    so they are stable and readable ("nvswitch-0000-07-00-0", "bridge-0000-17-00-0", "single-0000-87-00-0").

    A GPU with links to NVSwitches joins the switch domain only when its fabric registration allows traffic: no
    fabric info (before Hopper) or registration COMPLETED with SUCCESS. One still registering, or whose
    registration failed, gets a domain of its own. A registered GPU of a multi-node NVLink clique (non-zero
    cluster UUID) is in the clique's domain, "clique-<clusterUuid>.<cliqueId>", the same on every node of it.
    """
    groups = _BusGroups(info.pci_bus_id for info in infos)
    on_switch: list[str] = []
    cliques: dict[str, str] = {}  # bus id → the domain of its multi-node NVLink clique
    bridged: set[str] = set()
    for info in infos:
        bus = info.pci_bus_id
        peers, switch_links = _nvlink_peers(gpulib, info)
        for peer in peers:
            if peer in groups:
                groups.join(bus, peer)
                bridged.add(bus)
        domain = _switch_domain(gpulib, info) if switch_links else None
        if domain == _NODE_SWITCHES:
            on_switch.append(bus)
        elif domain is not None:
            cliques[bus] = domain
    for bus in on_switch[1:]:
        groups.join(on_switch[0], bus)
    switched = set(on_switch)

    domains: dict[str, str] = {}
    for info in infos:
        bus = info.pci_bus_id
        if bus in cliques:
            domains[info.uuid] = cliques[bus]
            continue
        kind = "nvswitch" if bus in switched else "bridge" if bus in bridged else "single"
        domains[info.uuid] = f"{kind}-{gpu_name(groups.root(bus)).removeprefix('gpu-')}"
    return domains


class _BusGroups:
    """GPUs grouped by PCI bus id as links join them (union-find); a group is known by its lowest address."""

    def __init__(self, buses: Iterable[str]) -> None:
        self._parent = {bus: bus for bus in buses}

    def __contains__(self, bus: str) -> bool:
        return bus in self._parent

    def root(self, bus: str) -> str:
        """The lowest PCI bus id of ``bus``'s group."""
        parent = self._parent
        while parent[bus] != bus:
            parent[bus] = parent[parent[bus]]
            bus = parent[bus]
        return bus

    def join(self, a: str, b: str) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)


def _nvlink_peers(gpulib: GpuLib, info: GpuInfo) -> tuple[list[str], bool]:
    """The PCI bus ids of the GPUs ``info``'s NVLinks reach directly, and whether any link reaches an NVSwitch;
    none of either when NVML cannot tell."""
    try:
        links = gpulib.nvlinks(info.uuid)
    except GpuError as err:
        log.info("NVLink topology unavailable gpu=%s error=%s", info.pci_bus_id, err)
        return [], False
    peers = [link.remote_pci_bus_id for link in links if link.remote_type is NvlinkPeerType.GPU]
    return peers, any(link.remote_type is NvlinkPeerType.SWITCH for link in links)


#: What ``_switch_domain`` returns for a GPU in the node's own NVSwitch domain (named later, after its GPUs).
_NODE_SWITCHES = "nvswitch"


def _switch_domain(gpulib: GpuLib, info: GpuInfo) -> str | None:
    """Where a GPU with links to NVSwitches belongs: ``_NODE_SWITCHES``, the domain of its multi-node NVLink
    clique, or None (a domain of its own) while its fabric registration keeps its NVLinks from carrying traffic."""
    fabric = _fabric_info(gpulib, info)
    if fabric is None:
        return _NODE_SWITCHES
    if not fabric.registered:
        # Its NVLinks reach the switches but carry no traffic until the fabric manager has registered it.
        log.warning(
            "GPU left out of its NVSwitch domain: NVLink fabric registration not complete gpu=%s state=%s status=%d",
            info.pci_bus_id,
            _state_name(fabric.state),
            fabric.status,
        )
        return None
    if fabric.multi_node:
        # At most 7 + 36 + 1 + 10 = 54 characters: within the 64 an attribute string may have.
        return f"clique-{fabric.clique}"
    return _NODE_SWITCHES


def _fabric_info(gpulib: GpuLib, info: GpuInfo) -> FabricInfo | None:
    """The GPU's fabric registration; None when NVML has none for it, or cannot say (then the NVLinks decide)."""
    try:
        return gpulib.fabric_info(info.uuid)
    except GpuError as err:
        log.info("NVLink fabric info unavailable gpu=%s error=%s", info.pci_bus_id, err)
        return None


def _state_name(state: int) -> str:
    return FabricState(state).name if state in FabricState._value2member_map_ else str(state)


def _check_unique_names(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GpuError(
                f"two devices would both be named {name!r}; report this with `dradriver inventory -o json` output"
            )
        seen.add(name)
