"""A simulated GPU node: the hardware behind our fake NVML library.

It models what NVML exposes and enforces NVML's rules: MIG placement (a GPU instance only at a valid start, never
overlapping another, ``INSUFFICIENT_RESOURCES`` when the slot is taken or the profile's instance limit reached),
GPU-instance ids handed out by the "driver" rather than derived from placement, compute instances inside GPU
instances, MIG mode changes that stay pending on Ampere until a reset, compute modes, NVLink peers, NVLink fabric
registration (Hopper and newer), XID, double-bit ECC and GPU-lost events with the ECC error counters, and resets
that bring a lost GPU back.

Hardware state outlives a driver process, so state persists in a JSON file when one is given: MIG instances and
compute modes survive a restart, and a crashed driver can leave them behind, as on a real node.

Errors are ``SimNvmlError`` carrying the NVML return code; ``sim.fakelib`` turns them into return codes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.atomic_files import sweep_dead_writers, temp_file_for
from dradriver.errors import ConfigError
from dradriver.gpu.models import NO_CLUSTER_UUID, ComputeMode, FabricState, MigProfile, NvlinkPeerType, Placement
from dradriver.gpu.products import (
    COMPUTE_SLICES_PER_GPU,
    ECC_XIDS,
    FABRIC_ARCHITECTURES,
    LOST_XIDS,
    RESET_XIDS,
    RESETLESS_MIG_ARCHITECTURES,
    ProductSpec,
    load_products,
)
from dradriver.inputs import InputError, path_exists, read_text
from dradriver.sim.profiles import NodeProfile
from dradriver.sim.sysfs import NVIDIA as NVIDIA_KERNEL_DRIVER
from dradriver.sim.sysfs import SimKernel, gpu_functions, write_tree

log = logging.getLogger(__name__)

# How often a waiting event reader looks for events another process wrote to the shared state file.
SHARED_STATE_POLL_SECONDS = 0.25
EVENT_LOG_LENGTH = 64

STATE_KIND = "dradriver-simulated-gpu-state"
STATE_VERSION = 1

# NVML return codes the simulator produces (same values as NVML_ERROR_*).
RECOVERY_ACTION_NONE, RECOVERY_ACTION_GPU_RESET = 0, 1
SUCCESS = 0
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
TIMEOUT = 10
GPU_IS_LOST = 15
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

# NVML_COMPUTE_INSTANCE_PROFILE_* enum → compute slices; the CI profile id equals the enum on real drivers.
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}
# NVSwitch chips per HGX/DGX board, by architecture: DGX A100 has six, HGX H100/H200 four.
NVSWITCHES = {"Ampere": 6, "Hopper": 4}


class SimNvmlError(Exception):
    """An NVML failure of the simulated node, with its NVML return code."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass
class SimComputeInstance:
    id: int
    profile_id: int
    slices: int
    uuid: str
    compute_mode: int = ComputeMode.DEFAULT


@dataclass
class SimGpuInstance:
    id: int
    profile: MigProfile
    placement: Placement
    compute_instances: dict[int, SimComputeInstance] = field(default_factory=dict)


@dataclass(frozen=True)
class SimProcess:
    """A compute process on a GPU or one of its MIG devices: what NVML's running-process list shows, and how busy
    it keeps the GPU (the simulator's utilisation, temperature and power follow from it)."""

    pid: int
    device_uuid: str  # the GPU's or the MIG device's UUID
    memory_bytes: int
    utilization_percent: int = 0
    pod_uid: str = ""  # the pod whose cgroup it runs in (what /proc/PID/cgroup names on a real node)


@dataclass
class SimGpu:
    index: int
    uuid: str
    pci_bus_id: str
    product_name: str
    product: ProductSpec
    numa_node: int | None
    pcie_root: str | None
    mig_current: bool = False
    mig_pending: bool = False
    compute_mode: int = ComputeMode.DEFAULT
    timeslice: int = 0  # nvidia-smi compute-policy --set-timeslice value (0 Default … 3 Long)
    lost: bool = False
    gpu_instances: dict[int, SimGpuInstance] = field(default_factory=dict)
    fabric_state: FabricState | None = None  # None: no fabric info at all (before Hopper)
    addressing_mode: int | None = None  # nvmlDeviceGetAddressingMode's value on coherent platforms; None: unsupported
    # nvmlDeviceGetModuleId's value: on an NVSwitch baseboard 1..n in PCI order, as the Fabric Manager stand-in
    # numbers its GPUs (the profile's moduleId, or a test, sets another: a misreported board); None: NOT_SUPPORTED.
    module_id: int | None = None
    fabric_status: int = SUCCESS  # NVML return code of the registration, meaningful once COMPLETED
    ecc_volatile: int = 0  # uncorrectable ECC errors since the last reset (NVML_VOLATILE_ECC)
    ecc_aggregate: int = 0  # uncorrectable ECC errors over the GPU's life (NVML_AGGREGATE_ECC)
    recovery_action: int = 0  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset (see RESET_XIDS)

    @property
    def minor(self) -> int:
        return self.index

    def mig_profiles(self) -> list[MigProfile]:
        return [spec.to_profile() for spec in self.product.mig_profiles]

    def profile_by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.mig_profiles() if p.id == profile_id), None)


@dataclass(frozen=True)
class SimFabric:
    """A GPU's NVLink fabric registration as ``nvmlDeviceGetGpuFabricInfoV`` reports it."""

    state: FabricState
    status: int
    cluster_uuid: str
    clique_id: int
    health_mask: int = 0


@dataclass(frozen=True)
class SimEvent:
    sequence: int
    gpu_index: int
    xid: int | None
    gpu_lost: bool
    gpu_instance_id: int | None
    compute_instance_id: int | None
    ecc_double_bit: bool = False


def _uuid_from(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class SimulatedNode:
    """The GPUs of one simulated node. Thread-safe; every mutation is persisted before it returns."""

    def __init__(
        self,
        profile: NodeProfile,
        *,
        node_name: str = "sim-node",
        state_path: Path | None = None,
        privileged: bool = True,
    ) -> None:
        self.profile = profile
        self.node_name = node_name
        self.state_path = state_path
        self.privileged = privileged
        self.driver_version = profile.driver_version
        self.cuda_driver_version = profile.cuda_driver_version
        self._lock = threading.RLock()
        self._events_changed = threading.Condition(self._lock)
        self._events: list[SimEvent] = []
        self._mig_serial = 0
        self._stamp: tuple[int, int, int] | None = None
        self._event_id = 0  # the last event id in the shared state file that this process knows
        self._event_log: list[dict[str, Any]] = []
        self._faults: dict[str, list[int]] = {}  # NVML function name -> return codes of its next calls
        self._cleared: dict[int, int] = {}  # GPU index → last event sequence a reset discarded
        self.processes: dict[int, SimProcess] = {}  # PID → compute process (`sim process`, tests)
        # The node's sysfs (VFIO passthrough): a GPU another kernel driver holds is not NVML's to see.
        self.sysfs: SimKernel | None = None
        # Initialised NVML sessions on this node (the fake library counts them): a session attaches every GPU, so
        # while one is open this process holds each GPU the nvidia driver has, and its unbind is refused.
        self.nvml_sessions = 0
        # As a real NVML does: count only the GPUs the nvidia driver has when NVML starts (a GPU on vfio-pci then is
        # not counted, NOT_FOUND, until NVML starts again). Off by default: a GPU on vfio-pci stays counted and
        # answers GPU_IS_LOST (see nvml_sees), which the rest of the simulator's scenarios are written for.
        self.nvml_counts_at_init = False
        products = load_products()
        # NVML enumerates GPUs in PCI bus order.
        ordered = sorted(profile.gpus, key=lambda g: g.pci_bus_id)
        self.gpus = [
            SimGpu(
                index=i,
                uuid="GPU-" + _uuid_from(f"{node_name}/{spec.pci_bus_id}"),
                pci_bus_id=spec.pci_bus_id,
                product_name=spec.product,
                product=products[spec.product],
                numa_node=spec.numa_node,
                pcie_root=spec.pcie_root,
                module_id=spec.module_id if spec.module_id is not None else (i + 1 if profile.nvswitch else None),
            )
            for i, spec in enumerate(ordered)
        ]
        for gpu in self.gpus:
            gpu.fabric_state = self._initial_fabric_state(gpu)
        if state_path is not None and path_exists(state_path):
            sweep_dead_writers(state_path)  # a process killed mid-write (the driver, `sim`) left its temp file
            self._load_state(state_path)
        else:
            self._apply_profile_mig_layout(ordered)
            self._save()

    # --- lookup -------------------------------------------------------------------------------------------

    def gpu(self, index: int) -> SimGpu:
        if not 0 <= index < len(self.gpus):
            raise SimNvmlError(INVALID_ARGUMENT, f"GPU index {index} out of range 0..{len(self.gpus) - 1}")
        with self._lock:
            self._refresh()
        gpu = self.gpus[index]
        if gpu.lost:
            raise SimNvmlError(GPU_IS_LOST, f"GPU {gpu.pci_bus_id} has fallen off the bus")
        if not self.nvml_sees(gpu):
            raise SimNvmlError(GPU_IS_LOST, f"GPU {gpu.pci_bus_id} is not bound to the nvidia driver")
        return gpu

    def nvml_sees(self, gpu: SimGpu) -> bool:
        """Whether NVML answers for ``gpu``: only while the ``nvidia`` kernel driver holds it. A GPU bound to vfio-pci
        stays counted here and answers GPU_IS_LOST (the adapter then retries it at every rescan, as a lost GPU)."""
        return self.sysfs is None or self.sysfs.driver_of(gpu.pci_bus_id) == NVIDIA_KERNEL_DRIVER

    def attach_sysfs(self, root: Path) -> SimKernel:
        """Give the node a sysfs tree under ``root`` (written if absent) whose bindings NVML follows."""
        write_tree(root, gpu_functions((g.pci_bus_id, g.product.pci_device_id) for g in self.gpus))
        self.sysfs = SimKernel(root, self._holders, self._minor_of)
        return self.sysfs

    def _minor_of(self, address: str) -> int | None:
        return next((g.minor for g in self.gpus if g.pci_bus_id == address), None)

    def _holders(self, address: str) -> list[int]:
        gpu = next((g for g in self.gpus if g.pci_bus_id == address), None)
        ours = [os.getpid()] if self.nvml_sessions > 0 else []  # an open NVML session holds every GPU
        return [*(p.pid for p in self.processes_on(gpu.index)), *ours] if gpu is not None else []

    def gpu_instance(self, index: int, gi_id: int) -> SimGpuInstance:
        gpu = self._mig_enabled_gpu(index)
        try:
            return gpu.gpu_instances[gi_id]
        except KeyError:
            raise SimNvmlError(NOT_FOUND, f"no GPU instance {gi_id} on {gpu.pci_bus_id}") from None

    def _mig_enabled_gpu(self, index: int) -> SimGpu:
        gpu = self.gpu(index)
        if not gpu.product.mig_capable:
            raise SimNvmlError(NOT_SUPPORTED, f"{gpu.product_name} does not support MIG")
        if not gpu.mig_current:
            raise SimNvmlError(NOT_SUPPORTED, f"MIG mode is not enabled on {gpu.pci_bus_id}")
        return gpu

    def _require_privilege(self, what: str) -> None:
        if not self.privileged:
            raise SimNvmlError(NO_PERMISSION, f"{what} needs root")

    # --- fault injection ----------------------------------------------------------------------------------

    def inject_fault(self, call: str, code: int = UNKNOWN, *, times: int = 1) -> None:
        """Make the next ``times`` calls of the NVML function ``call`` (its C name, e.g.
        ``nvmlDeviceCreateGpuInstanceWithPlacement``) fail with return ``code`` and change nothing."""
        with self._lock:
            self._faults.setdefault(call, []).extend([code] * times)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_fault(self, call: str) -> int | None:
        """The return code an injected fault gives this call of ``call``, or None to run it normally."""
        with self._lock:
            pending = self._faults.get(call)
            if not pending:
                return None
            code = pending.pop(0)
            if not pending:
                del self._faults[call]
            return code

    # --- MIG mode -----------------------------------------------------------------------------------------

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        """Request a MIG mode; returns NVML's activation status (SUCCESS even when a reset is still needed)."""
        with self._lock:
            gpu = self.gpu(index)
            if not gpu.product.mig_capable:
                raise SimNvmlError(NOT_SUPPORTED, f"{gpu.product_name} does not support MIG")
            self._require_privilege("changing MIG mode")
            if not enabled and gpu.gpu_instances:
                raise SimNvmlError(IN_USE, f"{gpu.pci_bus_id} still has {len(gpu.gpu_instances)} GPU instances")
            gpu.mig_pending = enabled
            # Hopper and newer switch without a reset; Ampere keeps the change pending until the GPU is reset.
            if gpu.product.architecture in RESETLESS_MIG_ARCHITECTURES:
                gpu.mig_current = enabled
            self._save()
            return SUCCESS

    def reset_gpu(self, index: int) -> None:
        """What ``nvidia-smi -r`` does: apply a pending MIG mode, zero the volatile ECC counters and discard the
        GPU's events not yet read. Fails while GPU instances exist, except on a GPU that fell off the bus: that
        one comes back, re-initialised (its MIG instances are gone)."""
        with self._lock:
            if not 0 <= index < len(self.gpus):
                raise SimNvmlError(INVALID_ARGUMENT, f"GPU index {index} out of range 0..{len(self.gpus) - 1}")
            self._refresh()
            gpu = self.gpus[index]
            self._require_privilege("resetting a GPU")
            # A reset ends every process on the GPU (a lost GPU's died with it).
            self.processes = {pid: p for pid, p in self.processes.items() if not self._on_gpu(p, gpu)}
            if gpu.lost:
                gpu.lost = False
                gpu.gpu_instances = {}
            elif gpu.gpu_instances:
                raise SimNvmlError(IN_USE, f"{gpu.pci_bus_id} has GPU instances; destroy them before a reset")
            gpu.mig_current = gpu.mig_pending
            gpu.compute_mode = ComputeMode.DEFAULT
            gpu.ecc_volatile = 0
            gpu.recovery_action = RECOVERY_ACTION_NONE
            self._event_log = [e for e in self._event_log if e.get("gpu") != index]
            self._cleared[index] = len(self._events)
            self._save()

    @staticmethod
    def _on_gpu(process: SimProcess, gpu: SimGpu) -> bool:
        return process.device_uuid == gpu.uuid or any(
            ci.uuid == process.device_uuid for gi in gpu.gpu_instances.values() for ci in gi.compute_instances.values()
        )

    def ecc_errors(self, index: int, *, volatile: bool) -> int:
        """Uncorrectable ECC errors since the last reset (``volatile``) or over the GPU's life."""
        with self._lock:
            gpu = self.gpu(index)
            return gpu.ecc_volatile if volatile else gpu.ecc_aggregate

    # --- GPU and compute instances -----------------------------------------------------------------------

    def create_gpu_instance(self, index: int, profile_id: int, start: int | None = None) -> SimGpuInstance:
        """Create a GPU instance at ``start`` (or, like ``nvmlDeviceCreateGpuInstance``, the first free one)."""
        with self._lock:
            gpu = self._mig_enabled_gpu(index)
            self._require_privilege("creating GPU instances")
            profile = gpu.profile_by_id(profile_id)
            if profile is None:
                raise SimNvmlError(INVALID_ARGUMENT, f"{gpu.product_name} has no GPU instance profile {profile_id}")
            same = [gi for gi in gpu.gpu_instances.values() if gi.profile.id == profile_id]
            if len(same) >= profile.max_instances:
                raise SimNvmlError(
                    INSUFFICIENT_RESOURCES, f"{profile.name} allows at most {profile.max_instances} instances"
                )
            used_compute = sum(gi.profile.slice_count for gi in gpu.gpu_instances.values())
            if used_compute + profile.slice_count > COMPUTE_SLICES_PER_GPU:
                raise SimNvmlError(INSUFFICIENT_RESOURCES, f"not enough compute slices left for {profile.name}")
            if start is None:
                placement = next((p for p in profile.placements if self._placement_free(gpu, p)), None)
                if placement is None:
                    raise SimNvmlError(INSUFFICIENT_RESOURCES, f"no free placement for {profile.name}")
            else:
                placement = next((p for p in profile.placements if p.start == start), None)
                if placement is None:
                    valid = [p.start for p in profile.placements]
                    raise SimNvmlError(
                        INVALID_ARGUMENT, f"{profile.name} cannot start at slice {start}; valid starts: {valid}"
                    )
                # NVML answers an occupied slot with INSUFFICIENT_RESOURCES, not "already exists".
                if not self._placement_free(gpu, placement):
                    raise SimNvmlError(
                        INSUFFICIENT_RESOURCES,
                        f"slices {placement.start}..{placement.start + placement.size - 1} "
                        f"are taken on {gpu.pci_bus_id}",
                    )
            gi = SimGpuInstance(id=self._next_gpu_instance_id(gpu), profile=profile, placement=placement)
            gpu.gpu_instances[gi.id] = gi
            self._save()
            return gi

    @staticmethod
    def _placement_free(gpu: SimGpu, placement: Placement) -> bool:
        return not any(gi.placement.overlaps(placement) for gi in gpu.gpu_instances.values())

    @staticmethod
    def _next_gpu_instance_id(gpu: SimGpu) -> int:
        # The driver hands out the lowest free id, unrelated to where the instance sits.
        taken = set(gpu.gpu_instances)
        return next(i for i in range(1, 64) if i not in taken)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        with self._lock:
            gi = self.gpu_instance(index, gi_id)
            self._require_privilege("destroying GPU instances")
            if gi.compute_instances:
                raise SimNvmlError(IN_USE, f"GPU instance {gi_id} still has compute instances")
            del self.gpus[index].gpu_instances[gi_id]
            self._save()

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_id: int) -> SimComputeInstance:
        with self._lock:
            gi = self.gpu_instance(index, gi_id)
            self._require_privilege("creating compute instances")
            slices = CI_PROFILE_SLICES.get(ci_profile_id)
            if slices is None:
                raise SimNvmlError(INVALID_ARGUMENT, f"no compute instance profile {ci_profile_id}")
            if slices > gi.profile.slice_count:
                raise SimNvmlError(
                    NOT_SUPPORTED,
                    f"a {slices}-slice compute instance does not fit in GPU instance {gi_id} ({gi.profile.name})",
                )
            used = sum(ci.slices for ci in gi.compute_instances.values())
            if used + slices > gi.profile.slice_count:
                raise SimNvmlError(INSUFFICIENT_RESOURCES, f"GPU instance {gi_id} has no compute slices left")
            ci_id = next(i for i in range(8) if i not in gi.compute_instances)
            self._mig_serial += 1
            gpu = self.gpus[index]
            uuid = "MIG-" + _uuid_from(f"{gpu.uuid}/{gi_id}/{ci_id}/{self._mig_serial}")
            ci = SimComputeInstance(id=ci_id, profile_id=ci_profile_id, slices=slices, uuid=uuid)
            gi.compute_instances[ci_id] = ci
            self._save()
            return ci

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        with self._lock:
            gi = self.gpu_instance(index, gi_id)
            self._require_privilege("destroying compute instances")
            if ci_id not in gi.compute_instances:
                raise SimNvmlError(NOT_FOUND, f"no compute instance {ci_id} in GPU instance {gi_id}")
            del gi.compute_instances[ci_id]
            self._save()

    def mig_devices(self, index: int) -> list[tuple[SimGpuInstance, SimComputeInstance]]:
        """(GPU instance, compute instance) pairs in NVML's MIG-device order: by GI id, then CI id."""
        with self._lock:
            gpu = self.gpu(index)
            return [
                (gi, gi.compute_instances[ci_id])
                for gi_id, gi in sorted(gpu.gpu_instances.items())
                for ci_id in sorted(gi.compute_instances)
            ]

    def find_mig_device(self, uuid: str) -> tuple[int, SimGpuInstance, SimComputeInstance]:
        with self._lock:
            for gpu in self.gpus:
                for gi in gpu.gpu_instances.values():
                    for ci in gi.compute_instances.values():
                        if ci.uuid == uuid:
                            return gpu.index, gi, ci
            raise SimNvmlError(NOT_FOUND, f"no MIG device {uuid}")

    # --- compute mode -------------------------------------------------------------------------------------

    def set_compute_mode(self, index: int, mode: int, mig: tuple[int, int] | None = None) -> None:
        """Set the compute mode of a GPU, or of the MIG device (GI id, CI id) when MIG is enabled."""
        with self._lock:
            gpu = self.gpu(index)
            if mode not in {m.value for m in ComputeMode}:
                raise SimNvmlError(INVALID_ARGUMENT, f"compute mode {mode} does not exist")
            if mode == ComputeMode.EXCLUSIVE_THREAD:
                raise SimNvmlError(NOT_SUPPORTED, "EXCLUSIVE_THREAD compute mode is no longer supported")
            self._require_privilege("setting the compute mode")
            if mig is None:
                if gpu.mig_current:
                    raise SimNvmlError(
                        NOT_SUPPORTED, f"MIG is enabled on {gpu.pci_bus_id}: set the compute mode on its MIG devices"
                    )
                gpu.compute_mode = mode
            else:
                gi = self.gpu_instance(index, mig[0])
                try:
                    gi.compute_instances[mig[1]].compute_mode = mode
                except KeyError:
                    raise SimNvmlError(NOT_FOUND, f"no compute instance {mig[1]} in GPU instance {mig[0]}") from None
            self._save()

    def set_timeslice(self, index: int, value: int) -> None:
        """What ``nvidia-smi compute-policy -i <gpu> --set-timeslice <value>`` does (0 Default … 3 Long)."""
        with self._lock:
            gpu = self.gpu(index)
            if value not in range(4):
                raise SimNvmlError(INVALID_ARGUMENT, f"time-slice value {value} is not 0 to 3")
            self._require_privilege("setting the time-slice")
            if gpu.mig_current:
                raise SimNvmlError(NOT_SUPPORTED, f"MIG is enabled on {gpu.pci_bus_id}: time-slice is not settable")
            gpu.timeslice = value
            self._save()

    # --- NVLink -------------------------------------------------------------------------------------------

    def nvlink(self, index: int, link: int) -> tuple[str, NvlinkPeerType] | None:
        """The far end of an active link, None for an inactive one; errors as NVML for missing links."""
        gpu = self.gpu(index)
        links = gpu.product.nvlinks
        if links == 0:
            raise SimNvmlError(NOT_SUPPORTED, f"{gpu.product_name} has no NVLink")
        if not 0 <= link < links:
            raise SimNvmlError(INVALID_ARGUMENT, f"{gpu.product_name} has NVLinks 0..{links - 1}")
        if self.profile.nvswitch:
            switches = NVSWITCHES.get(gpu.product.architecture, 4)
            return f"0000:{0xC4 + link % switches:02x}:00.0", NvlinkPeerType.SWITCH
        for a, b in self.profile.nvlink_bridges:
            bus_a, bus_b = (self._profile_bus_id(a), self._profile_bus_id(b))
            if gpu.pci_bus_id in (bus_a, bus_b):
                peer = bus_b if gpu.pci_bus_id == bus_a else bus_a
                return peer, NvlinkPeerType.GPU
        return None

    # --- NVLink fabric -------------------------------------------------------------------------------------

    def _initial_fabric_state(self, gpu: SimGpu) -> FabricState | None:
        # Hopper and newer report a fabric state: registered once the fabric manager is up on an NVSwitch system,
        # NOT_SUPPORTED without NVSwitches (H100 NVL pairs, PCIe cards). Older GPUs have no fabric info at all.
        if gpu.product.architecture not in FABRIC_ARCHITECTURES or gpu.product.nvlinks == 0:
            return None
        return FabricState.COMPLETED if self.profile.nvswitch else FabricState.NOT_SUPPORTED

    def fabric(self, index: int) -> SimFabric:
        """The GPU's fabric registration; ``NOT_SUPPORTED`` for GPUs before Hopper."""
        with self._lock:
            gpu = self.gpu(index)
            if gpu.fabric_state is None:
                raise SimNvmlError(
                    NOT_SUPPORTED, f"{gpu.product_name} ({gpu.product.architecture}) has no NVLink fabric info"
                )
            # The fabric manager assigns cluster and clique only when the registration succeeds; a single-node
            # NVSwitch system is not multi-node capable and reports the all-zero cluster UUID and clique 0.
            clique = self.profile.fabric
            if clique is None or gpu.fabric_state != FabricState.COMPLETED or gpu.fabric_status != SUCCESS:
                return SimFabric(gpu.fabric_state, gpu.fabric_status, NO_CLUSTER_UUID, 0)
            return SimFabric(gpu.fabric_state, gpu.fabric_status, clique.cluster_uuid, clique.clique_id)

    def set_fabric_state(self, index: int, state: int, status: int = SUCCESS) -> None:
        """Set a GPU's fabric registration state (``FabricState``) and, for COMPLETED, its NVML status, as the
        fabric manager would while it (re)registers the GPU. Persisted: it outlives a driver restart."""
        with self._lock:
            gpu = self.gpu(index)
            if gpu.fabric_state is None:
                raise ValueError(
                    f"GPU {index} ({gpu.product_name}, {gpu.product.architecture}) has no NVLink "
                    "fabric info: only Hopper and newer GPUs with NVLink have one"
                )
            gpu.fabric_state = FabricState(state)
            gpu.fabric_status = status
            self._save()

    def _profile_bus_id(self, profile_index: int) -> str:
        return self.profile.gpus[profile_index].pci_bus_id

    # --- workload -----------------------------------------------------------------------------------------

    def start_process(
        self, device_uuid: str, pid: int, memory_bytes: int, utilization_percent: int = 0, *, pod_uid: str = ""
    ) -> None:
        """A CUDA process starts on a GPU or MIG device (by UUID): it holds ``memory_bytes`` of the device's memory
        and keeps its GPU ``utilization_percent`` busy; ``pod_uid``: the pod it belongs to. Persisted, so a driver
        sharing the state file sees it."""
        if pid < 1 or memory_bytes < 0 or not 0 <= utilization_percent <= 100:
            raise ValueError(f"process {pid}: PID from 1, memory 0 or more and utilisation 0 to 100 percent")
        with self._lock:
            self._refresh()
            index = self.device_index(device_uuid)
            self.gpu(index)  # GPU_IS_LOST: nothing starts on a GPU off the bus
            self.processes[pid] = SimProcess(pid, device_uuid, memory_bytes, utilization_percent, pod_uid)
            self._save()

    def end_process(self, pid: int) -> None:
        """The process exits (a PID not running is already done)."""
        with self._lock:
            self._refresh()
            if self.processes.pop(pid, None) is not None:
                self._save()

    def pod_of_pid(self, pid: int) -> str | None:
        """The pod UID a process runs for, as the driver reads it from /proc/PID/cgroup on a real node."""
        with self._lock:
            self._refresh()
            process = self.processes.get(pid)
            return process.pod_uid or None if process is not None else None

    def device_index(self, device_uuid: str) -> int:
        """The index of the GPU that is, or holds the MIG device, ``device_uuid``; NOT_FOUND for neither."""
        for gpu in self.gpus:
            if gpu.uuid == device_uuid or any(
                ci.uuid == device_uuid for gi in gpu.gpu_instances.values() for ci in gi.compute_instances.values()
            ):
                return gpu.index
        raise SimNvmlError(NOT_FOUND, f"no GPU or MIG device with UUID {device_uuid}")

    def processes_on(self, index: int, mig_uuid: str | None = None) -> list[SimProcess]:
        """The processes on GPU ``index`` (all, its MIG devices' included) or on one of its MIG devices."""
        with self._lock:
            self._refresh()
            gpu = self.gpus[index]
            if mig_uuid is not None:
                return [p for p in self.processes.values() if p.device_uuid == mig_uuid]
            mine = {gpu.uuid} | {ci.uuid for gi in gpu.gpu_instances.values() for ci in gi.compute_instances.values()}
            return sorted((p for p in self.processes.values() if p.device_uuid in mine), key=lambda p: p.pid)

    def utilization(self, index: int) -> int:
        """Percent of time GPU ``index`` was busy: its processes' load, capped at 100."""
        return min(100, sum(p.utilization_percent for p in self.processes_on(index)))

    # --- events -------------------------------------------------------------------------------------------

    def inject_xid(
        self, index: int, xid: int, *, gpu_instance_id: int | None = None, compute_instance_id: int | None = None
    ) -> None:
        """Raise an XID on a GPU (or one of its MIG devices), as the kernel driver would, with its effect on the
        GPU (docs/simulator.md lists them): an XID in ``RESET_XIDS`` makes NVML ask for a GPU reset, one in
        ``ECC_XIDS`` counts an uncorrectable ECC error, and XID 79 (``LOST_XIDS``) takes the GPU off the bus:
        every later call on it answers GPU_IS_LOST until ``reset_gpu``."""
        with self._lock:
            self._refresh()
            gpu = self.gpu(index)
            if xid in RESET_XIDS:
                gpu.recovery_action = RECOVERY_ACTION_GPU_RESET
            if xid in ECC_XIDS:
                gpu.ecc_volatile += 1
                gpu.ecc_aggregate += 1
            if xid in LOST_XIDS:
                gpu.lost = True
            self._raise(
                {"gpu": index, "xid": xid, "gpuInstanceId": gpu_instance_id, "computeInstanceId": compute_instance_id}
            )

    def recovery_action(self, index: int) -> int:
        """NVML's recommended recovery action for the GPU (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``)."""
        with self._lock:
            return self.gpu(index).recovery_action

    def inject_ecc(self, index: int, count: int = 1) -> None:
        """``count`` double-bit (uncorrectable) ECC errors on a GPU: the counters grow by ``count`` and one
        double-bit ECC event is raised."""
        if count < 1:
            raise ValueError(f"ECC error count {count} must be at least 1")
        with self._lock:
            gpu = self.gpu(index)
            gpu.ecc_volatile += count
            gpu.ecc_aggregate += count
            self._raise({"gpu": index, "ecc": True})

    def lose_gpu(self, index: int, *, attributable: bool = True) -> None:
        """The GPU falls off the bus: every later call on it fails with GPU_IS_LOST until ``reset_gpu``.

        Not ``attributable``: NVML's event wait reports a lost GPU, but every GPU still answers, so no call can
        say which one it was (a GPU that dropped off and came straight back)."""
        with self._lock:
            self._refresh()
            if attributable:
                self.gpus[index].lost = True
            self._raise({"gpu": index, "lost": True})

    def _raise(self, event: dict[str, Any]) -> None:
        # Events go through the state file too, so a driver sharing it (another process) hears them.
        self._refresh()
        self._event_id += 1
        self._event_log = [*self._event_log, {**event, "id": self._event_id}][-EVENT_LOG_LENGTH:]
        self._save()
        self._publish(event)

    def _publish(self, event: dict[str, Any]) -> None:
        self._events.append(
            SimEvent(
                len(self._events) + 1,
                int(event["gpu"]),
                event.get("xid"),
                bool(event.get("lost", False)),
                event.get("gpuInstanceId"),
                event.get("computeInstanceId"),
                bool(event.get("ecc", False)),
            )
        )
        self._events_changed.notify_all()

    def last_event_sequence(self) -> int:
        with self._lock:
            return len(self._events)

    def wait_event(self, after: int, gpu_indices: set[int], timeout_s: float) -> SimEvent | None:
        """The first event past sequence ``after`` on one of ``gpu_indices``, waiting up to ``timeout_s``."""

        def pending() -> SimEvent | None:
            return next(
                (
                    e
                    for e in self._events[after:]
                    if e.gpu_index in gpu_indices and e.sequence > self._cleared.get(e.gpu_index, 0)
                ),
                None,
            )

        deadline = time.monotonic() + timeout_s
        with self._events_changed:
            while True:
                self._refresh()  # events raised by another process sharing the state file
                found = pending()
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0:
                    return found
                self._events_changed.wait_for(
                    lambda: pending() is not None, timeout=min(remaining, SHARED_STATE_POLL_SECONDS)
                )

    # --- persistence --------------------------------------------------------------------------------------

    def _apply_profile_mig_layout(self, ordered_specs: list[Any]) -> None:
        for gpu, spec in zip(self.gpus, ordered_specs, strict=True):
            gpu.mig_current = gpu.mig_pending = spec.mig_enabled
            for dev in spec.mig_devices:
                profile_spec = gpu.product.profile_named(dev.profile)
                assert profile_spec is not None  # checked when the profile was validated
                try:
                    gi = self.create_gpu_instance(gpu.index, profile_spec.id, dev.start)
                    ci_profile = full_compute_instance_profile(gi.profile.slice_count)
                    self.create_compute_instance(gpu.index, gi.id, ci_profile)
                except SimNvmlError as err:
                    raise ConfigError(
                        f"node profile {self.profile.name}: MIG device {dev.profile} at slice "
                        f"{dev.start} on {gpu.pci_bus_id}: {err}"
                    ) from err

    def _state(self) -> dict[str, Any]:
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "profile": self.profile.name,
            "node": self.node_name,
            "migSerial": self._mig_serial,
            "events": self._event_log,
            # Kept apart from the log: a reset removes a GPU's events, and ids must never be handed out twice.
            "lastEventId": self._event_id,
            "processes": [
                {
                    "pid": p.pid,
                    "device": p.device_uuid,
                    "memory": p.memory_bytes,
                    "utilization": p.utilization_percent,
                    "podUID": p.pod_uid,
                }
                for p in sorted(self.processes.values(), key=lambda p: p.pid)
            ],
            "gpus": {
                gpu.pci_bus_id: {
                    "migCurrent": gpu.mig_current,
                    "migPending": gpu.mig_pending,
                    "computeMode": int(gpu.compute_mode),
                    "timeslice": gpu.timeslice,
                    "lost": gpu.lost,
                    "eccVolatile": gpu.ecc_volatile,
                    "eccAggregate": gpu.ecc_aggregate,
                    "recoveryAction": gpu.recovery_action,
                    "fabric": (
                        None
                        if gpu.fabric_state is None
                        else {"state": int(gpu.fabric_state), "status": gpu.fabric_status}
                    ),
                    "gpuInstances": [
                        {
                            "id": gi.id,
                            "profileId": gi.profile.id,
                            "start": gi.placement.start,
                            "computeInstances": [
                                {
                                    "id": ci.id,
                                    "profileId": ci.profile_id,
                                    "uuid": ci.uuid,
                                    "computeMode": int(ci.compute_mode),
                                }
                                for ci in gi.compute_instances.values()
                            ],
                        }
                        for gi in gpu.gpu_instances.values()
                    ],
                }
                for gpu in self.gpus
            },
        }

    def _save(self) -> None:
        if self.state_path is None:
            return
        path = self.state_path
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename so a crash never leaves half a state file.
        fd, tmp = temp_file_for(path)
        with os.fdopen(fd, "w") as out:
            json.dump(self._state(), out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        self._stamp = _file_stamp(path)

    def _load_state(self, path: Path) -> None:
        """Take the state written to ``path`` (by another process on this node, or an earlier run); a file that is
        not this node's, or is damaged, changes nothing and raises a ConfigError that says what to fix."""
        raw = self._read_state_file(path)
        # Parse everything before touching the live state, so a bad file changes nothing.
        serial, gpu_states, processes = self._parse_state(path, raw)
        self._mig_serial = max(self._mig_serial, serial)
        self.processes = processes
        self._take_events(raw.get("events"))
        last_id = raw.get("lastEventId", 0)
        self._event_id = max(self._event_id, last_id if isinstance(last_id, int) else 0)
        for gpu in self.gpus:
            _restore_gpu(gpu, gpu_states[gpu.pci_bus_id])
        self._stamp = _file_stamp(path)

    def _read_state_file(self, path: Path) -> dict[str, Any]:
        """The state file's JSON, checked to be a state file of this version, for this profile, node and GPUs."""
        try:
            raw = json.loads(read_text(path))
        except InputError as err:
            raise _bad_state(path, "", str(err).removeprefix(f"{path}: ")) from None
        except (ValueError, RecursionError) as err:
            raise _bad_state(path, "", f"not readable JSON ({err})") from None
        if not isinstance(raw, dict) or raw.get("kind") != STATE_KIND:
            raise _bad_state(path, "kind", f"expected {STATE_KIND!r}")
        if raw.get("version") != STATE_VERSION:
            raise _bad_state(
                path, "version", f"version {raw.get('version')!r} is not supported (this build reads {STATE_VERSION})"
            )
        if raw.get("profile") != self.profile.name:
            raise _bad_state(path, "profile", f"written for profile {raw.get('profile')!r}, not {self.profile.name!r}")
        if raw.get("node", self.node_name) != self.node_name:
            # GPU UUIDs derive from the node name: another node's file would describe other GPUs.
            raise _bad_state(
                path, "node", f"written for node {raw.get('node')!r}, not {self.node_name!r} (check --node-name)"
            )
        gpus = raw.get("gpus")
        if not isinstance(gpus, dict) or set(gpus) != {g.pci_bus_id for g in self.gpus}:
            raise _bad_state(path, "gpus", "does not list exactly this profile's GPUs by PCI address")
        return raw

    def _parse_state(self, path: Path, raw: dict[str, Any]) -> tuple[int, dict[str, _GpuState], dict[int, SimProcess]]:
        """The checked file's MIG serial, each GPU's state by PCI address, and the processes by pid."""
        try:
            serial = int(raw.get("migSerial", 0))
            gpu_states = {gpu.pci_bus_id: _parse_gpu_state(gpu, raw["gpus"][gpu.pci_bus_id]) for gpu in self.gpus}
        except (KeyError, TypeError, ValueError, StopIteration) as err:
            raise _bad_state(path, "gpus", f"malformed entry ({err!r})") from err
        try:
            processes = {
                int(p["pid"]): SimProcess(
                    int(p["pid"]), str(p["device"]), int(p["memory"]), int(p["utilization"]), str(p.get("podUID", ""))
                )
                for p in raw.get("processes", [])
            }
        except (KeyError, TypeError, ValueError) as err:
            raise _bad_state(path, "processes", f"malformed entry ({err!r})") from err
        return serial, gpu_states, processes

    def _take_events(self, logged: Any) -> None:
        """Publish events another process appended to the shared log (on first load: just note where it ends)."""
        if not isinstance(logged, list):
            return
        fresh = [
            e
            for e in logged
            if isinstance(e, dict)
            and isinstance(e.get("id"), int)
            and isinstance(e.get("gpu"), int)
            and 0 <= e["gpu"] < len(self.gpus)
            and e["id"] > self._event_id
        ]
        first_load = self._stamp is None
        for event in fresh:
            if not first_load:
                self._publish(event)
        self._event_log = [e for e in logged if isinstance(e, dict)][-EVENT_LOG_LENGTH:]
        self._event_id = max([self._event_id, *(e["id"] for e in fresh)])

    def _refresh(self) -> None:
        """Pick up changes another process made to the shared state file (an admin carving MIG devices with
        a second simulator, as nvidia-smi would on real hardware)."""
        if self.state_path is None:
            return
        stamp = _file_stamp(self.state_path)
        if stamp is None or stamp == self._stamp:
            return
        try:
            self._load_state(self.state_path)
        except ConfigError as err:
            log.warning("ignoring unreadable simulated GPU state error=%s", err)
            self._stamp = stamp


@dataclass
class _GpuState:
    mig_current: bool
    mig_pending: bool
    compute_mode: int
    lost: bool
    gpu_instances: dict[int, SimGpuInstance]
    fabric: tuple[FabricState, int] | None
    ecc: tuple[int, int] = (0, 0)  # volatile, aggregate; files written before ECC was modelled have none
    timeslice: int = 0
    recovery_action: int = 0


def _parse_gpu_state(gpu: SimGpu, entry: dict[str, Any]) -> _GpuState:
    instances: dict[int, SimGpuInstance] = {}
    for gi_raw in entry["gpuInstances"]:
        profile = gpu.profile_by_id(int(gi_raw["profileId"]))
        if profile is None:
            raise ValueError(f"unknown GPU instance profile {gi_raw['profileId']}")
        placement = next(p for p in profile.placements if p.start == int(gi_raw["start"]))
        gi = SimGpuInstance(id=int(gi_raw["id"]), profile=profile, placement=placement)
        for ci_raw in gi_raw["computeInstances"]:
            ci_profile = int(ci_raw["profileId"])
            gi.compute_instances[int(ci_raw["id"])] = SimComputeInstance(
                id=int(ci_raw["id"]),
                profile_id=ci_profile,
                slices=CI_PROFILE_SLICES[ci_profile],
                uuid=str(ci_raw["uuid"]),
                compute_mode=ComputeMode(ci_raw.get("computeMode", 0)),
            )
        instances[gi.id] = gi
    fabric = entry.get("fabric")
    return _GpuState(
        bool(entry["migCurrent"]),
        bool(entry["migPending"]),
        ComputeMode(entry["computeMode"]),
        bool(entry.get("lost", False)),
        instances,
        (FabricState(int(fabric["state"])), int(fabric["status"])) if fabric is not None else None,
        (int(entry.get("eccVolatile", 0)), int(entry.get("eccAggregate", 0))),
        int(entry.get("timeslice", 0)),
        int(entry.get("recoveryAction", 0)),
    )


def _bad_state(path: Path, field_name: str, problem: str) -> ConfigError:
    return ConfigError(
        f"simulated GPU state file {path}: {f'{field_name}: ' if field_name else ''}{problem}; fix or delete the "
        "file to start from the profile's initial state"
    )


def _restore_gpu(gpu: SimGpu, state: _GpuState) -> None:
    """Set ``gpu`` to ``state``, keeping the objects of the instances that still exist."""
    gpu.mig_current, gpu.mig_pending, gpu.compute_mode, gpu.lost = (
        state.mig_current,
        state.mig_pending,
        state.compute_mode,
        state.lost,
    )
    gpu.ecc_volatile, gpu.ecc_aggregate = state.ecc
    gpu.recovery_action = state.recovery_action
    gpu.timeslice = state.timeslice
    # Files written before fabric info was modelled lack it: the profile's initial state holds.
    if state.fabric is not None and gpu.fabric_state is not None:
        gpu.fabric_state, gpu.fabric_status = state.fabric
    gpu.gpu_instances = _keep_identities(gpu.gpu_instances, state.gpu_instances)


def _keep_identities(old: dict[int, SimGpuInstance], new: dict[int, SimGpuInstance]) -> dict[int, SimGpuInstance]:
    """``new``, reusing the objects of ``old`` that describe the same instance, so NVML handles to instances
    that still exist stay valid across a reload (and handles to re-created ones do not)."""
    merged: dict[int, SimGpuInstance] = {}
    for gi_id, gi in new.items():
        kept = old.get(gi_id)
        if kept is None or (kept.profile.id, kept.placement) != (gi.profile.id, gi.placement):
            merged[gi_id] = gi
            continue
        cis: dict[int, SimComputeInstance] = {}
        for ci_id, ci in gi.compute_instances.items():
            old_ci = kept.compute_instances.get(ci_id)
            if old_ci is not None and old_ci.uuid == ci.uuid:
                old_ci.compute_mode = ci.compute_mode
            cis[ci_id] = old_ci if old_ci is not None and old_ci.uuid == ci.uuid else ci
        kept.compute_instances = cis
        merged[gi_id] = kept
    return merged


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def full_compute_instance_profile(slice_count: int) -> int:
    """The compute-instance profile spanning a whole GPU instance (the default CI of ``nvidia-smi mig -C``)."""
    return next(enum for enum, slices in CI_PROFILE_SLICES.items() if slices == slice_count)
