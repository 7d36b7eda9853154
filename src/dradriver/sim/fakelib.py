"""The simulated node behind pynvml's C boundary: a fake ``libnvidia-ml.so`` written in Python.

``fake_pynvml(node)`` loads a private copy of the real ``pynvml`` module (nvidia-ml-py) and swaps its function
lookup for a table of Python functions that emulate NVML's C entry points on a ``SimulatedNode``. Everything above
that boundary — pynvml's own wrappers, its structs, its ``NVMLError`` classes, and our ``NvmlGpuLib`` adapter — runs
unchanged, so the simulator exercises the same code as a real node does.

Each emulated function receives exactly the ctypes arguments pynvml passes to the C library (``byref()`` out
parameters, string buffers, opaque handle pointers), writes its results into them and returns an NVML return code.
Opaque handles point at small ctypes structs owned here; a registry maps their addresses back to simulated objects
and forgets the handles of destroyed instances and freed event sets, so it stays as large as what is alive.
Symbols we do not emulate answer ``NVML_ERROR_FUNCTION_NOT_FOUND``, as the real library does for missing symbols.

Only pynvml's public names are used: ``nvmlLib``, the loaded library, is set to an object that answers C symbols
as attributes, as a ``ctypes.CDLL`` does; pynvml then finds it loaded and never looks for ``libnvidia-ml.so``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver.gpu.caps import CAPS_DIR
from dradriver.gpu.errors import GpuError, error_for_code
from dradriver.gpu.models import MIB, DeviceNode
from dradriver.gpu.nvml import NvmlGpuLib
from dradriver.gpu.products import ARCHITECTURE_NUMBERS, COMPUTE_SLICES_PER_GPU, MigProfileSpec
from dradriver.sim import node as sim
from dradriver.sim.node import (
    CI_PROFILE_SLICES,
    SimComputeInstance,
    SimGpu,
    SimGpuInstance,
    SimNvmlError,
    SimulatedNode,
)
from dradriver.sim.profiles import load_node_profile

# NVML return codes used here beyond the ones the simulator raises.
UNINITIALIZED = 1
INSUFFICIENT_SIZE = 7
FUNCTION_NOT_FOUND = 13
ARGUMENT_VERSION_MISMATCH = 25

GPU_INSTANCE_PROFILE_COUNT = 0x12
COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
PCI_VENDOR_NVIDIA = 0x10DE
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
SUPPORTED_EVENTS = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID
FIELD_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
VALUE_TYPE_UNSIGNED_INT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
NOT_ATTRIBUTABLE = 0xFFFFFFFF
MEMORY_ERROR_CORRECTED = 0
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
AGGREGATE_ECC = 1
BRAND_NVIDIA = 14
# What an idle GPU reports as used memory (driver reservations), in bytes.
IDLE_USED_BYTES = 1 * MIB
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
IDLE_CELSIUS = 34  # an idle data-centre GPU; every 10 % of load adds 4 °C
IDLE_MILLIWATTS, BUSY_MILLIWATTS = 70_000, 400_000  # nvidia-smi's power draw, idle and at 100 %

_ERROR_TEXT = {
    0: "Success",
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    7: "Insufficient Size",
    10: "Timeout",
    13: "Function Not Found",
    15: "GPU is lost",
    19: "In use by another client",
    23: "Insufficient Resources",
    25: "Argument Version Mismatch",
}

# The registry prunes handles of what no longer exists once it holds this many (and then twice what is alive).
PRUNE_HANDLES_AT = 1024

# ctypes has no public name for what ``byref()`` returns; its type, taken once, identifies it. Its ``_obj`` is
# the referenced object (typeshed does not list it, hence ``type[Any]``).
_BYREF_TYPE: type[Any] = type(ctypes.byref(ctypes.c_int()))

_copies = itertools.count(1)


def fake_pynvml(node: SimulatedNode) -> ModuleType:
    """A private copy of pynvml whose C calls are answered by ``node`` instead of ``libnvidia-ml.so``."""
    # Found, not imported: pynvml itself is never used on a simulated node, and a second copy of its thousand
    # functions and structures is 2 MB of a simulated driver's memory (docs/reliability.md).
    found = importlib.util.find_spec("pynvml")
    assert found is not None and found.origin is not None, "nvidia-ml-py is a dependency"
    name = f"dradriver_fake_pynvml_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, found.origin)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # pynvml looks itself up in sys.modules while it builds its NVMLError subclasses; it is not needed afterwards.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    patched: Any = module
    patched.nvmlLib = FakeNvmlLibrary(node, module).symbols  # "loaded", so pynvml never looks for the .so
    return module


class SimPciTopology:
    """NUMA node and PCIe root of the simulated GPUs, as the node profile declares them."""

    def __init__(self, node: SimulatedNode) -> None:
        self._gpus = {gpu.pci_bus_id: gpu for gpu in node.gpus}

    def numa_node(self, pci_bus_id: str) -> int | None:
        gpu = self._gpus.get(pci_bus_id)
        return gpu.numa_node if gpu else None

    def pcie_root(self, pci_bus_id: str) -> str | None:
        gpu = self._gpus.get(pci_bus_id)
        return gpu.pcie_root if gpu else None


class SimMigCapabilities:
    """MIG capability nodes of the simulated node, numbered as ``/proc/driver/nvidia-caps/mig-minors`` lays them
    out (config 1, monitor 2, then per GPU 15 GPU instances, each with its access node and 8 compute instances).
    A simulated node has no such host nodes, so no major number is given."""

    def device_nodes(self, gpu_minor: int, gpu_instance_id: int, compute_instance_id: int) -> tuple[DeviceNode, ...]:
        gi_minor = 3 + gpu_minor * 15 * 9 + gpu_instance_id * 9
        return tuple(
            DeviceNode(path=f"{CAPS_DIR}/nvidia-cap{minor}", minor=minor)
            for minor in (gi_minor, gi_minor + 1 + compute_instance_id)
        )


def simulated_gpulib(
    profile: str, *, node_name: str = "sim-node", state_path: Path | None = None
) -> tuple[NvmlGpuLib, SimulatedNode]:
    """``NvmlGpuLib`` on a simulated node built from a node profile (built-in name or file path)."""
    node = SimulatedNode(load_node_profile(profile), node_name=node_name, state_path=state_path)
    return simulated_gpulib_on(node), node


def simulated_gpulib_on(node: SimulatedNode) -> NvmlGpuLib:
    """``NvmlGpuLib`` on an existing simulated node (tests keep the node to inspect and inject faults)."""
    return NvmlGpuLib(
        nvml=fake_pynvml(node),
        pci_topology=SimPciTopology(node),
        mig_capabilities=SimMigCapabilities(),
        gpu_reset=SimGpuReset(node),
        timeslice_setter=SimTimeslice(node),
    )


class SimTimeslice:
    """``nvidia-smi compute-policy --set-timeslice`` on the simulated node."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def __call__(self, gpu_uuid: str, value: int) -> None:
        gpu = next((g for g in self._node.gpus if g.uuid == gpu_uuid), None)
        if gpu is None:
            raise GpuError(f"no GPU with UUID {gpu_uuid}", device=gpu_uuid, call="nvidia-smi compute-policy")
        try:
            self._node.set_timeslice(gpu.index, value)
        except SimNvmlError as err:
            raise error_for_code(
                err.code, f"setting the time-slice failed: {err}", device=gpu_uuid, call="nvidia-smi compute-policy"
            ) from err


class SimGpuReset:
    """``nvidia-smi -r`` on the simulated node."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def __call__(self, gpu_uuid: str) -> None:
        gpu = next((g for g in self._node.gpus if g.uuid == gpu_uuid), None)
        if gpu is None:
            raise GpuError(f"no GPU with UUID {gpu_uuid}", device=gpu_uuid, call="nvidia-smi -r")
        try:
            self._node.reset_gpu(gpu.index)
        except SimNvmlError as err:
            raise error_for_code(err.code, f"GPU reset failed: {err}", device=gpu_uuid, call="nvidia-smi -r") from err


# --- what the opaque handles point at -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Gpu:
    index: int


@dataclass(frozen=True)
class _MigDevice:
    index: int
    gi: SimGpuInstance
    ci: SimComputeInstance


@dataclass(frozen=True)
class _GpuInstanceRef:
    index: int
    gi: SimGpuInstance


@dataclass(frozen=True)
class _ComputeInstanceRef:
    index: int
    gi: SimGpuInstance
    ci: SimComputeInstance


@dataclass
class _EventSet:
    cursor: int
    # GPU index → (registered event mask, last event sequence before registration)
    registrations: dict[int, tuple[int, int]] = field(default_factory=dict)
    freed: bool = False


def _nvml_bus_id(bus_id: str) -> str:
    """NVML's spelling of a PCI address: 8-digit domain, upper-case hex ("00000000:0F:00.0")."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _target(arg: Any) -> Any:
    """The object an out/in pointer argument refers to: ``byref(x)`` → x, pointer → its target, else itself."""
    if isinstance(arg, _BYREF_TYPE):
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _buffer(arg: Any) -> Any:
    """An array argument: ``byref(array)`` → the array; an array or a pointer is indexed as it is."""
    return arg._obj if isinstance(arg, _BYREF_TYPE) else arg


def _text(arg: Any) -> str:
    """A ``const char *`` argument (``c_char_p`` or bytes) as text."""
    raw = arg if isinstance(arg, bytes) else arg.value
    return raw.decode() if raw else ""


def _int(arg: Any) -> int:
    return int(arg.value) if hasattr(arg, "value") else int(arg)


class _Fail(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Symbols:
    """What pynvml expects of the loaded library (a ``ctypes.CDLL``): C functions looked up as attributes.

    pynvml turns the AttributeError of a symbol we lack into ``NVML_ERROR_FUNCTION_NOT_FOUND``."""

    def __init__(self, entries: dict[str, Callable[..., int]]) -> None:
        self._entries = entries

    def __getattr__(self, name: str) -> Callable[..., int]:
        try:
            return self._entries[name]
        except KeyError:
            raise AttributeError(f"the simulated libnvidia-ml has no symbol {name}") from None


class FakeNvmlLibrary:
    """NVML's C entry points emulated on a simulated node; ``symbols`` is what pynvml loads as the library."""

    def __init__(self, node: SimulatedNode, module: ModuleType, *, prune_handles_at: int = PRUNE_HANDLES_AT) -> None:
        self.node = node
        self._module = module
        self._lock = threading.RLock()
        self._init_count = 0
        self._counted = [gpu.index for gpu in node.gpus]  # the node's GPUs NVML enumerates, by NVML index
        self._handles: dict[Any, ctypes.Structure] = {}  # key → the struct a handle points at
        self._targets: dict[int, object] = {}  # struct address → what the handle means
        self._prune_floor = prune_handles_at
        self._prune_at = prune_handles_at
        self.symbols = _Symbols(
            {name: self._entry(name, getattr(self, name)) for name in dir(self) if name.startswith("nvml")}
        )

    @property
    def handle_count(self) -> int:
        """How many handles the registry holds (bounded by what is alive, see ``PRUNE_HANDLES_AT``)."""
        with self._lock:
            return len(self._handles)

    def _entry(self, name: str, impl: Callable[..., int]) -> Callable[..., int]:
        needs_init = name not in {"nvmlInit_v2", "nvmlInitWithFlags", "nvmlInit", "nvmlErrorString"}

        def call(*args: Any) -> Any:
            if needs_init and self._init_count == 0:
                return UNINITIALIZED
            fault = self.node.take_fault(name)
            if fault is not None:
                return fault
            try:
                return impl(*args)
            except SimNvmlError as err:
                return err.code
            except _Fail as err:
                return err.code

        call.__name__ = name
        return call

    # --- handles ------------------------------------------------------------------------------------------

    def _set_handle(self, out_ref: Any, key: Any, meaning: object) -> None:
        """Point the caller's handle (``byref(c_nvmlDevice_t())`` etc.) at the struct for ``key``."""
        pointer = _target(out_ref)
        pointer.contents = self._struct(type(pointer)._type_, key, meaning)

    def _struct(self, struct_type: Any, key: Any, meaning: object) -> ctypes.Structure:
        with self._lock:
            struct = self._handles.get(key)
            if struct is None:
                if len(self._handles) >= self._prune_at:
                    self._prune()
                struct = struct_type()
                self._handles[key] = struct
                self._targets[ctypes.addressof(struct)] = meaning
            return struct

    def _prune(self) -> None:
        """Forget the handles of destroyed instances and freed event sets: they resolve to nothing afterwards,
        as before (a caller that still holds one keeps its struct alive, so no new handle gets its address)."""
        for key, struct in list(self._handles.items()):
            address = ctypes.addressof(struct)
            if not self._alive(self._targets.get(address)):
                del self._handles[key]
                self._targets.pop(address, None)
        self._prune_at = max(self._prune_floor, 2 * len(self._handles))

    def _alive(self, meaning: object) -> bool:
        if isinstance(meaning, _EventSet):
            return not meaning.freed
        if isinstance(meaning, _MigDevice | _ComputeInstanceRef):
            return self._instance_alive(meaning.index, meaning.gi, meaning.ci)
        if isinstance(meaning, _GpuInstanceRef):
            return self._instance_alive(meaning.index, meaning.gi, None)
        return meaning is not None  # physical GPUs: one handle each, for good

    def _instance_alive(self, index: int, gi: SimGpuInstance, ci: SimComputeInstance | None) -> bool:
        try:
            self._check_alive(index, gi, ci)
        except _Fail:
            return False
        except SimNvmlError:
            return True  # the GPU is lost, not the instance: its handles answer GPU_IS_LOST meanwhile
        return True

    def _pointer(self, struct_type: Any, key: Any, meaning: object) -> Any:
        return ctypes.pointer(self._struct(struct_type, key, meaning))

    def _resolve(self, handle: Any) -> object:
        if not handle:
            raise _Fail(sim.INVALID_ARGUMENT)
        with self._lock:
            meaning = self._targets.get(ctypes.addressof(handle.contents))
        if meaning is None:
            raise _Fail(sim.INVALID_ARGUMENT)
        return meaning

    def _device(self, handle: Any) -> _Gpu | _MigDevice:
        meaning = self._resolve(handle)
        if isinstance(meaning, _Gpu):
            self.node.gpu(meaning.index)  # GPU_IS_LOST once it fell off the bus
            return meaning
        if isinstance(meaning, _MigDevice):
            self._check_alive(meaning.index, meaning.gi, meaning.ci)
            return meaning
        raise _Fail(sim.INVALID_ARGUMENT)

    def _gpu(self, handle: Any) -> SimGpu:
        """The physical GPU a device handle names; MIG device handles are refused."""
        meaning = self._device(handle)
        if not isinstance(meaning, _Gpu):
            raise _Fail(sim.INVALID_ARGUMENT)
        return self.node.gpu(meaning.index)

    def _gpu_instance(self, handle: Any) -> _GpuInstanceRef:
        meaning = self._resolve(handle)
        if not isinstance(meaning, _GpuInstanceRef):
            raise _Fail(sim.INVALID_ARGUMENT)
        self._check_alive(meaning.index, meaning.gi, None)
        return meaning

    def _compute_instance(self, handle: Any) -> _ComputeInstanceRef:
        meaning = self._resolve(handle)
        if not isinstance(meaning, _ComputeInstanceRef):
            raise _Fail(sim.INVALID_ARGUMENT)
        self._check_alive(meaning.index, meaning.gi, meaning.ci)
        return meaning

    def _check_alive(self, index: int, gi: SimGpuInstance, ci: SimComputeInstance | None) -> None:
        # Handles of destroyed instances are invalid, even if a new instance later gets the same id.
        gpu = self.node.gpu(index)
        if gpu.gpu_instances.get(gi.id) is not gi or (ci is not None and gi.compute_instances.get(ci.id) is not ci):
            raise _Fail(sim.INVALID_ARGUMENT)

    def _gpu_handle(self, out_ref: Any, index: int) -> None:
        self._set_handle(out_ref, ("gpu", index), _Gpu(index))

    def _mig_handle_pointer(self, struct_type: Any, index: int, gi: SimGpuInstance, ci: SimComputeInstance) -> Any:
        return self._pointer(struct_type, ("mig", index, id(ci)), _MigDevice(index, gi, ci))

    def _gi_pointer(self, struct_type: Any, index: int, gi: SimGpuInstance) -> Any:
        return self._pointer(struct_type, ("gi", index, id(gi)), _GpuInstanceRef(index, gi))

    def _ci_pointer(self, struct_type: Any, index: int, gi: SimGpuInstance, ci: SimComputeInstance) -> Any:
        return self._pointer(struct_type, ("ci", index, id(ci)), _ComputeInstanceRef(index, gi, ci))

    @staticmethod
    def _write_string(buffer: Any, size: Any, text: str) -> int:
        data = text.encode()
        if len(data) + 1 > _int(size):
            return INSUFFICIENT_SIZE
        buffer.value = data
        return sim.SUCCESS

    # --- init and system ----------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: Any) -> int:
        with self._lock:
            self._init_count += 1
            if self._init_count == 1:
                self.node.nvml_sessions += 1  # NVML attaches the GPUs: this process holds them open
                self._counted = [
                    gpu.index for gpu in self.node.gpus if not self.node.nvml_counts_at_init or self.node.nvml_sees(gpu)
                ]
        return sim.SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        with self._lock:
            self._init_count -= 1
            if self._init_count == 0:
                self.node.nvml_sessions -= 1  # detached: the GPUs' device nodes are closed
                # Every handle ends with the session (a real NVML frees its device structs): one kept across a
                # shutdown and a new init answers INVALID_ARGUMENT, never for whatever GPU now sits at its address.
                self._handles.clear()
                self._targets.clear()
        return sim.SUCCESS

    def nvmlErrorString(self, code: Any) -> bytes:
        return _ERROR_TEXT.get(_int(code), "Unknown Error").encode()

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        return self._write_string(buffer, size, self.node.driver_version)

    def nvmlSystemGetNVMLVersion(self, buffer: Any, size: Any) -> int:
        return self._write_string(buffer, size, f"{self.node.cuda_driver_version // 1000}.{self.node.driver_version}")

    def nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        _target(version).value = self.node.cuda_driver_version
        return sim.SUCCESS

    def nvmlSystemGetCudaDriverVersion_v2(self, version: Any) -> int:
        return self.nvmlSystemGetCudaDriverVersion(version)

    # --- device identity ----------------------------------------------------------------------------------

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _target(count).value = len(self._counted)
        return sim.SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        position = _int(index)
        if not 0 <= position < len(self._counted):
            raise _Fail(sim.INVALID_ARGUMENT)
        gpu = self.node.gpu(self._counted[position])
        self._gpu_handle(out, gpu.index)
        return sim.SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, out: Any) -> int:
        wanted = _text(uuid)
        for gpu in self.node.gpus:
            if gpu.uuid == wanted and gpu.index not in self._counted:
                return sim.NOT_FOUND  # not the nvidia driver's when NVML started
            if gpu.uuid == wanted:
                self.node.gpu(gpu.index)
                self._gpu_handle(out, gpu.index)
                return sim.SUCCESS
        index, gi, ci = self.node.find_mig_device(wanted)
        self.node.gpu(index)
        pointer = _target(out)
        pointer.contents = self._mig_handle_pointer(type(pointer)._type_, index, gi, ci).contents
        return sim.SUCCESS

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, out: Any) -> int:
        raw = _text(bus_id)
        try:
            domain, rest = raw.lower().split(":", 1)
            wanted = f"{int(domain, 16):04x}:{rest}"
        except ValueError:
            raise _Fail(sim.INVALID_ARGUMENT) from None
        for gpu in self.node.gpus:
            if gpu.pci_bus_id == wanted and gpu.index in self._counted:
                self.node.gpu(gpu.index)
                self._gpu_handle(out, gpu.index)
                return sim.SUCCESS
        return sim.NOT_FOUND

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: Any) -> int:
        device = self._device(handle)
        gpu = self.node.gpus[device.index]
        if isinstance(device, _MigDevice):
            return self._write_string(buffer, size, f"{gpu.product_name} MIG {_ci_name(device.gi, device.ci)}")
        return self._write_string(buffer, size, gpu.product_name)

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: Any) -> int:
        device = self._device(handle)
        uuid = device.ci.uuid if isinstance(device, _MigDevice) else self.node.gpus[device.index].uuid
        return self._write_string(buffer, size, uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        device = self._device(handle)
        if isinstance(device, _MigDevice):
            total = device.gi.profile.memory_bytes
            processes = self.node.processes_on(device.index, device.ci.uuid)
        else:
            total = self.node.gpus[device.index].product.memory_mib * MIB
            processes = self.node.processes_on(device.index)
        used = min(total, IDLE_USED_BYTES + sum(p.memory_bytes for p in processes))
        info = _target(memory)
        info.total, info.used, info.free = total, used, total - used
        return sim.SUCCESS

    # --- usage: what nvidia-smi's table shows ---------------------------------------------------------------
    # On real hardware a MIG device handle answers NOT_SUPPORTED for utilisation, temperature and power (they are
    # the GPU's), and a GPU in MIG mode answers NOT_SUPPORTED for utilisation too.

    def nvmlDeviceGetUtilizationRates(self, handle: Any, utilization: Any) -> int:
        device = self._device(handle)
        if isinstance(device, _MigDevice) or self.node.gpus[device.index].mig_current:
            return sim.NOT_SUPPORTED
        busy = self.node.utilization(device.index)
        rates = _target(utilization)
        rates.gpu, rates.memory = busy, busy // 2
        return sim.SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temperature: Any) -> int:
        device = self._device(handle)
        if isinstance(device, _MigDevice):
            return sim.NOT_SUPPORTED
        if _int(sensor) != TEMPERATURE_GPU:
            return sim.INVALID_ARGUMENT
        _target(temperature).value = IDLE_CELSIUS + self.node.utilization(device.index) * 4 // 10
        return sim.SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any, milliwatts: Any) -> int:
        device = self._device(handle)
        if isinstance(device, _MigDevice):
            return sim.NOT_SUPPORTED
        busy = self.node.utilization(device.index)
        _target(milliwatts).value = IDLE_MILLIWATTS + busy * (BUSY_MILLIWATTS - IDLE_MILLIWATTS) // 100
        return sim.SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        """A GPU lists every process on it, its MIG devices' included (with their instance ids); a MIG device
        lists its own. The two-call protocol: no buffer (or too small) answers the count with INSUFFICIENT_SIZE,
        or SUCCESS when there are none."""
        device = self._device(handle)
        mig_uuid = device.ci.uuid if isinstance(device, _MigDevice) else None
        processes = self.node.processes_on(device.index, mig_uuid)
        counter = _target(count)
        if infos is None or counter.value < len(processes):
            counter.value = len(processes)
            return INSUFFICIENT_SIZE if processes else sim.SUCCESS
        buffer = _buffer(infos)
        instances = self._instance_ids(device.index)
        for i, process in enumerate(processes):
            gi, ci = instances.get(process.device_uuid, (NOT_ATTRIBUTABLE, NOT_ATTRIBUTABLE))
            entry = buffer[i]
            entry.pid, entry.usedGpuMemory = process.pid, process.memory_bytes
            entry.gpuInstanceId, entry.computeInstanceId = gi, ci
        counter.value = len(processes)
        return sim.SUCCESS

    def _instance_ids(self, index: int) -> dict[str, tuple[int, int]]:
        """MIG device UUID → (GPU instance id, compute instance id) on GPU ``index``."""
        gpu = self.node.gpus[index]
        return {ci.uuid: (gi.id, ci.id) for gi in gpu.gpu_instances.values() for ci in gi.compute_instances.values()}

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, pci: Any) -> int:
        device = self._device(handle)
        gpu = self.node.gpus[device.index]
        _fill_pci(_target(pci), gpu.pci_bus_id, gpu.product.pci_device_id)
        return sim.SUCCESS

    def nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> int:
        _target(minor).value = self._gpu(handle).minor
        return sim.SUCCESS

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        device = self._device(handle)
        cc_major, cc_minor = self.node.gpus[device.index].product.compute_capability.split(".")
        _target(major).value, _target(minor).value = int(cc_major), int(cc_minor)
        return sim.SUCCESS

    def nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> int:
        device = self._device(handle)
        _target(arch).value = ARCHITECTURE_NUMBERS.get(self.node.gpus[device.index].product.architecture, 0xFFFFFFFF)
        return sim.SUCCESS

    def nvmlDeviceGetBrand(self, handle: Any, brand: Any) -> int:
        self._device(handle)
        _target(brand).value = BRAND_NVIDIA
        return sim.SUCCESS

    def nvmlDeviceGetNumaNodeId(self, handle: Any, node: Any) -> int:
        # Only GPUs that are NUMA nodes themselves (coherent platforms) answer; none of the simulated ones are.
        self._device(handle)
        return sim.NOT_SUPPORTED

    def nvmlDeviceGetAddressingMode(self, handle: Any, mode: Any) -> int:
        # Discrete GPUs of x86 hosts are not coherent: NVML reports not supported unless a test sets a mode.
        value = self._gpu(handle).addressing_mode
        if value is None:
            return sim.NOT_SUPPORTED
        _target(mode).value = value
        return sim.SUCCESS

    def nvmlDeviceGetModuleId(self, handle: Any, module_id: Any) -> int:
        # NVSwitch baseboards (HGX/DGX) number their GPU modules 1..n. Other boards answer NOT_SUPPORTED here (real
        # PCIe boards answer 1, 0 or NOT_SUPPORTED; none has Fabric Manager partitions to match).
        value = self._gpu(handle).module_id
        if value is None:
            return sim.NOT_SUPPORTED
        _target(module_id).value = value
        return sim.SUCCESS

    def nvmlDeviceGetAttributes_v2(self, handle: Any, attributes: Any) -> int:
        # NVML answers this for MIG device handles only.
        device = self._device(handle)
        if not isinstance(device, _MigDevice):
            return sim.NOT_SUPPORTED
        profile = device.gi.profile
        out = _target(attributes)
        out.multiprocessorCount = profile.multiprocessors * device.ci.slices // profile.slice_count
        out.sharedCopyEngineCount = profile.copy_engines
        out.sharedDecoderCount = profile.decoders
        out.sharedEncoderCount = profile.encoders
        out.sharedJpegCount = profile.jpeg_engines
        out.sharedOfaCount = profile.ofa_engines
        out.gpuInstanceSliceCount = profile.slice_count
        out.computeInstanceSliceCount = device.ci.slices
        out.memorySizeMB = profile.memory_mib
        return sim.SUCCESS

    # --- MIG mode -----------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable:
            return sim.NOT_SUPPORTED
        _target(current).value, _target(pending).value = int(gpu.mig_current), int(gpu.mig_pending)
        return sim.SUCCESS

    def nvmlDeviceSetMigMode(self, handle: Any, mode: Any, activation_status: Any) -> int:
        gpu = self._gpu(handle)
        if _int(mode) not in (0, 1):
            return sim.INVALID_ARGUMENT
        _target(activation_status).value = self.node.set_mig_mode(gpu.index, bool(_int(mode)))
        return sim.SUCCESS

    # --- GPU instance profiles and placements --------------------------------------------------------------

    def _profile_by_enum(self, handle: Any, enum: Any) -> tuple[SimGpu, MigProfileSpec]:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable:
            raise _Fail(sim.NOT_SUPPORTED)
        value = _int(enum)
        if not 0 <= value < GPU_INSTANCE_PROFILE_COUNT:
            raise _Fail(sim.INVALID_ARGUMENT)
        spec = next((p for p in gpu.product.mig_profiles if p.enum == value), None)
        if spec is None:
            raise _Fail(sim.NOT_SUPPORTED)
        return gpu, spec

    @staticmethod
    def _fill_profile_info(out: Any, spec: MigProfileSpec) -> None:
        out.id = spec.id
        out.isP2pSupported = 0
        out.sliceCount = spec.slices
        out.instanceCount = spec.max
        out.multiprocessorCount = spec.sm
        out.copyEngineCount = spec.ce
        out.decoderCount = spec.dec
        out.encoderCount = spec.enc
        out.jpegCount = spec.jpeg
        out.ofaCount = spec.ofa
        out.memorySizeMB = spec.memory_mib

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, enum: Any, info: Any) -> int:
        _, spec = self._profile_by_enum(handle, enum)
        self._fill_profile_info(_target(info), spec)
        return sim.SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, enum: Any, info: Any) -> int:
        gpu, spec = self._profile_by_enum(handle, enum)
        out = _target(info)
        if out.version != self._module.nvmlGpuInstanceProfileInfo_v2:
            return ARGUMENT_VERSION_MISMATCH
        # The versioned call answers only while MIG is on; nvidia-smi and NVLIB fall back to the v1 call.
        if not gpu.mig_current:
            return sim.NOT_SUPPORTED
        self._fill_profile_info(out, spec)
        out.name = f"MIG {spec.name}".encode()
        return sim.SUCCESS

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count: Any
    ) -> int:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable:
            return sim.NOT_SUPPORTED
        profile = gpu.profile_by_id(_int(profile_id))
        if profile is None:
            return sim.INVALID_ARGUMENT
        counter = _target(count)
        wanted = len(profile.placements)
        if placements is None:
            counter.value = wanted
            return sim.SUCCESS
        if counter.value < wanted:
            counter.value = wanted
            return INSUFFICIENT_SIZE
        buffer = _buffer(placements)
        for i, placement in enumerate(profile.placements):
            buffer[i].start, buffer[i].size = placement.start, placement.size
        counter.value = wanted
        return sim.SUCCESS

    # --- GPU instances ------------------------------------------------------------------------------------

    def _return_gi(self, out: Any, index: int, gi: SimGpuInstance) -> int:
        pointer = _target(out)
        pointer.contents = self._gi_pointer(type(pointer)._type_, index, gi).contents
        return sim.SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: Any, placement: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        wanted = _target(placement)
        profile = gpu.profile_by_id(_int(profile_id))
        if profile is not None and wanted.size != profile.placements[0].size:
            return sim.INVALID_ARGUMENT
        gi = self.node.create_gpu_instance(gpu.index, _int(profile_id), int(wanted.start))
        return self._return_gi(out, gpu.index, gi)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        gi = self.node.create_gpu_instance(gpu.index, _int(profile_id))
        return self._return_gi(out, gpu.index, gi)

    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        ref = self._gpu_instance(handle)
        self.node.destroy_gpu_instance(ref.index, ref.gi.id)
        return sim.SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: Any, instances: Any, count: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable or not gpu.mig_current:
            return sim.NOT_SUPPORTED
        if gpu.profile_by_id(_int(profile_id)) is None:
            return sim.INVALID_ARGUMENT
        found = [gi for _, gi in sorted(gpu.gpu_instances.items()) if gi.profile.id == _int(profile_id)]
        counter = _target(count)
        if instances is None or counter.value < len(found):
            counter.value = len(found)
            return INSUFFICIENT_SIZE if instances is not None else sim.SUCCESS
        buffer = _buffer(instances)
        for i, gi in enumerate(found):
            buffer[i] = self._gi_pointer(type(buffer[i])._type_, gpu.index, gi)
        counter.value = len(found)
        return sim.SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        gi = self.node.gpu_instance(gpu.index, _int(gi_id))
        return self._return_gi(out, gpu.index, gi)

    def nvmlGpuInstanceGetInfo(self, handle: Any, info: Any) -> int:
        ref = self._gpu_instance(handle)
        out = _target(info)
        out.device = self._pointer(_device_struct(out), ("gpu", ref.index), _Gpu(ref.index))
        out.id = ref.gi.id
        out.profileId = ref.gi.profile.id
        out.placement.start, out.placement.size = ref.gi.placement.start, ref.gi.placement.size
        return sim.SUCCESS

    # --- compute instances --------------------------------------------------------------------------------

    def _ci_profile(self, ref: _GpuInstanceRef, enum: Any, engine: Any) -> tuple[int, int]:
        value = _int(enum)
        if not 0 <= value < len(CI_PROFILE_SLICES) or _int(engine) != 0:
            raise _Fail(sim.INVALID_ARGUMENT)
        slices = CI_PROFILE_SLICES[value]
        gi_slices = ref.gi.profile.slice_count
        # Compute instances come in the 1/2/3/4/7-slice shapes and never exceed their GPU instance; the
        # 6/8-slice and NVL shapes belong to products we do not simulate.
        if (value > 4 and value != COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1) or slices > gi_slices:
            raise _Fail(sim.NOT_SUPPORTED)
        # The media-extension compute shape exists only inside a "+me" GPU instance.
        if value == COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 and not ref.gi.profile.name.endswith("+me"):
            raise _Fail(sim.NOT_SUPPORTED)
        return value, slices

    def _fill_ci_profile(self, out: Any, ref: _GpuInstanceRef, enum: int, slices: int) -> None:
        profile = ref.gi.profile
        out.id = enum
        out.sliceCount = slices
        out.instanceCount = profile.slice_count // slices
        out.multiprocessorCount = profile.multiprocessors * slices // profile.slice_count
        out.sharedCopyEngineCount = profile.copy_engines
        out.sharedDecoderCount = profile.decoders
        out.sharedEncoderCount = profile.encoders
        out.sharedJpegCount = profile.jpeg_engines
        out.sharedOfaCount = profile.ofa_engines

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle: Any, enum: Any, engine: Any, info: Any) -> int:
        ref = self._gpu_instance(handle)
        value, slices = self._ci_profile(ref, enum, engine)
        self._fill_ci_profile(_target(info), ref, value, slices)
        return sim.SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle: Any, enum: Any, engine: Any, info: Any) -> int:
        ref = self._gpu_instance(handle)
        value, slices = self._ci_profile(ref, enum, engine)
        out = _target(info)
        if out.version != self._module.nvmlComputeInstanceProfileInfo_v2:
            return ARGUMENT_VERSION_MISMATCH
        self._fill_ci_profile(out, ref, value, slices)
        out.name = f"MIG {_ci_shape_name(ref.gi.profile.name, ref.gi.profile.slice_count, slices)}".encode()
        return sim.SUCCESS

    def _return_ci(self, out: Any, ref: _GpuInstanceRef, ci: SimComputeInstance) -> int:
        pointer = _target(out)
        pointer.contents = self._ci_pointer(type(pointer)._type_, ref.index, ref.gi, ci).contents
        return sim.SUCCESS

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: Any, out: Any) -> int:
        ref = self._gpu_instance(handle)
        ci = self.node.create_compute_instance(ref.index, ref.gi.id, _int(profile_id))
        return self._return_ci(out, ref, ci)

    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        ref = self._compute_instance(handle)
        self.node.destroy_compute_instance(ref.index, ref.gi.id, ref.ci.id)
        return sim.SUCCESS

    def nvmlGpuInstanceGetComputeInstances(self, handle: Any, profile_id: Any, instances: Any, count: Any) -> int:
        ref = self._gpu_instance(handle)
        if _int(profile_id) not in CI_PROFILE_SLICES:
            return sim.INVALID_ARGUMENT
        found = [ci for _, ci in sorted(ref.gi.compute_instances.items()) if ci.profile_id == _int(profile_id)]
        counter = _target(count)
        if instances is None or counter.value < len(found):
            counter.value = len(found)
            return INSUFFICIENT_SIZE if instances is not None else sim.SUCCESS
        buffer = _buffer(instances)
        for i, ci in enumerate(found):
            buffer[i] = self._ci_pointer(type(buffer[i])._type_, ref.index, ref.gi, ci)
        counter.value = len(found)
        return sim.SUCCESS

    def nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: Any, out: Any) -> int:
        ref = self._gpu_instance(handle)
        ci = ref.gi.compute_instances.get(_int(ci_id))
        if ci is None:
            return sim.NOT_FOUND
        return self._return_ci(out, ref, ci)

    def nvmlComputeInstanceGetInfo_v2(self, handle: Any, info: Any) -> int:
        ref = self._compute_instance(handle)
        out = _target(info)
        out.device = self._mig_handle_pointer(_device_struct(out), ref.index, ref.gi, ref.ci)
        out.gpuInstance = self._gi_pointer(out.gpuInstance._type_, ref.index, ref.gi)
        out.id = ref.ci.id
        out.profileId = ref.ci.profile_id
        # Compute instances fill their GPU instance's compute slices in id order.
        start = sum(ci.slices for ci_id, ci in ref.gi.compute_instances.items() if ci_id < ref.ci.id)
        out.placement.start, out.placement.size = start, ref.ci.slices
        return sim.SUCCESS

    # --- MIG devices --------------------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        gpu = self._gpu(handle)
        _target(count).value = COMPUTE_SLICES_PER_GPU if gpu.product.mig_capable and gpu.mig_current else 0
        return sim.SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable or not gpu.mig_current:
            return sim.NOT_SUPPORTED
        position = _int(index)
        devices = self.node.mig_devices(gpu.index)
        if position >= COMPUTE_SLICES_PER_GPU:
            return sim.INVALID_ARGUMENT
        if position >= len(devices):
            return sim.NOT_FOUND
        gi, ci = devices[position]
        pointer = _target(out)
        pointer.contents = self._mig_handle_pointer(type(pointer)._type_, gpu.index, gi, ci).contents
        return sim.SUCCESS

    def _mig(self, handle: Any) -> _MigDevice:
        device = self._device(handle)
        if not isinstance(device, _MigDevice):
            raise _Fail(sim.NOT_SUPPORTED)
        return device

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, gi_id: Any) -> int:
        _target(gi_id).value = self._mig(handle).gi.id
        return sim.SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ci_id: Any) -> int:
        _target(ci_id).value = self._mig(handle).ci.id
        return sim.SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> int:
        device = self._mig(handle)
        self._gpu_handle(out, device.index)
        return sim.SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, is_mig: Any) -> int:
        _target(is_mig).value = int(isinstance(self._device(handle), _MigDevice))
        return sim.SUCCESS

    # --- compute mode -------------------------------------------------------------------------------------

    def nvmlDeviceGetComputeMode(self, handle: Any, mode: Any) -> int:
        device = self._device(handle)
        if isinstance(device, _MigDevice):
            current = device.ci.compute_mode
        else:
            current = self.node.gpus[device.index].compute_mode
        _target(mode).value = int(current)
        return sim.SUCCESS

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: Any) -> int:
        device = self._device(handle)
        mig = (device.gi.id, device.ci.id) if isinstance(device, _MigDevice) else None
        self.node.set_compute_mode(device.index, _int(mode), mig)
        return sim.SUCCESS

    # --- NVLink -------------------------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active: Any) -> int:
        gpu = self._gpu(handle)
        _target(active).value = int(self.node.nvlink(gpu.index, _int(link)) is not None)
        return sim.SUCCESS

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: Any, pci: Any) -> int:
        gpu = self._gpu(handle)
        peer = self.node.nvlink(gpu.index, _int(link))
        if peer is None:
            return sim.NOT_SUPPORTED
        bus_id, _ = peer
        remote = next((g for g in self.node.gpus if g.pci_bus_id == bus_id), None)
        _fill_pci(_target(pci), bus_id, remote.product.pci_device_id if remote else 0)
        # NVML leaves the subsystem id of the far end unset.
        _target(pci).pciSubSystemId = 0
        return sim.SUCCESS

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: Any, kind: Any) -> int:
        gpu = self._gpu(handle)
        peer = self.node.nvlink(gpu.index, _int(link))
        if peer is None:
            return sim.NOT_SUPPORTED
        _target(kind).value = int(peer[1])
        return sim.SUCCESS

    # --- NVLink fabric -------------------------------------------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        gpu = self._gpu(handle)
        fabric = self.node.fabric(gpu.index)  # NOT_SUPPORTED before Hopper
        out = _target(info)
        # The versioned call accepts the v2 and v3 layouts; v3 only adds healthSummary at the end.
        if out.version not in {self._module.nvmlGpuFabricInfo_v2, self._module.nvmlGpuFabricInfo_v3}:
            return ARGUMENT_VERSION_MISMATCH
        out.clusterUuid[:] = list(uuid.UUID(fabric.cluster_uuid).bytes)
        out.status = fabric.status
        out.cliqueId = fabric.clique_id
        out.state = int(fabric.state)
        out.healthMask = fabric.health_mask
        if out.version == self._module.nvmlGpuFabricInfo_v3:
            # Hopper reports no health summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED).
            out.healthSummary = 0
        return sim.SUCCESS

    # --- ECC ----------------------------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, count: Any) -> int:
        gpu = self._gpu(handle)
        kind, counter = _int(error_type), _int(counter_type)
        if kind not in (MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED) or counter not in (
            VOLATILE_ECC,
            AGGREGATE_ECC,
        ):
            return sim.INVALID_ARGUMENT
        # Single-bit errors are corrected and not modelled: their counters stay at zero.
        value = self.node.ecc_errors(gpu.index, volatile=counter == VOLATILE_ECC) if kind else 0
        _target(count).value = value
        return sim.SUCCESS

    # --- field values -------------------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        """Only the recovery action field is modelled; every other field answers NOT_SUPPORTED in its entry."""
        gpu = self._gpu(handle)
        entries = _target(values)
        for i in range(_int(count)):
            entry = entries[i]
            if entry.fieldId == FIELD_GPU_RECOVERY_ACTION:
                entry.valueType = VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = self.node.recovery_action(gpu.index)
                entry.nvmlReturn = sim.SUCCESS
            else:
                entry.nvmlReturn = sim.NOT_SUPPORTED
        return sim.SUCCESS

    # --- events -------------------------------------------------------------------------------------------

    def _event_set(self, handle: Any) -> _EventSet:
        meaning = self._resolve(handle)
        if not isinstance(meaning, _EventSet) or meaning.freed:
            raise _Fail(sim.INVALID_ARGUMENT)
        return meaning

    def nvmlEventSetCreate(self, out: Any) -> int:
        event_set = _EventSet(cursor=self.node.last_event_sequence())
        self._set_handle(out, ("eventset", id(event_set)), event_set)
        return sim.SUCCESS

    def nvmlEventSetFree(self, handle: Any) -> int:
        self._event_set(handle).freed = True
        return sim.SUCCESS

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, types: Any) -> int:
        self._gpu(handle)
        _target(types).value = SUPPORTED_EVENTS
        return sim.SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._gpu(handle)
        target = self._event_set(event_set)
        mask = _int(types)
        if mask & ~SUPPORTED_EVENTS:
            return sim.NOT_SUPPORTED
        with self._lock:
            previous, since = target.registrations.get(gpu.index, (0, self.node.last_event_sequence()))
            target.registrations[gpu.index] = (previous | mask, since)
        return sim.SUCCESS

    def nvmlEventSetWait_v2(self, handle: Any, data: Any, timeout_ms: Any) -> int:
        target = self._event_set(handle)
        deadline = time.monotonic() + _int(timeout_ms) / 1000
        while True:
            event = self.node.wait_event(
                target.cursor, set(target.registrations), max(0.0, deadline - time.monotonic())
            )
            if event is None:
                return sim.TIMEOUT
            target.cursor = event.sequence
            mask, since = target.registrations[event.gpu_index]
            kind = EVENT_DOUBLE_BIT_ECC if event.ecc_double_bit else EVENT_XID
            # Only events raised after registration, of a registered type, reach the set.
            if event.sequence <= since or (not event.gpu_lost and not mask & kind):
                continue
            out = _target(data)
            out.device = self._pointer(_device_struct(out), ("gpu", event.gpu_index), _Gpu(event.gpu_index))
            if event.gpu_lost:
                return sim.GPU_IS_LOST
            if event.ecc_double_bit:
                # ECC events carry no data and are never attributed to a MIG device.
                out.eventType, out.eventData = EVENT_DOUBLE_BIT_ECC, 0
                out.gpuInstanceId = out.computeInstanceId = NOT_ATTRIBUTABLE
                return sim.SUCCESS
            out.eventType = EVENT_XID
            out.eventData = event.xid or 0
            out.gpuInstanceId = NOT_ATTRIBUTABLE if event.gpu_instance_id is None else event.gpu_instance_id
            out.computeInstanceId = NOT_ATTRIBUTABLE if event.compute_instance_id is None else event.compute_instance_id
            return sim.SUCCESS


def _device_struct(struct: Any) -> Any:
    """The opaque device struct type behind a struct's ``device`` handle field."""
    return dict(type(struct)._fields_)["device"]._type_


def _fill_pci(out: Any, bus_id: str, device_id: int) -> None:
    domain, bus, rest = bus_id.split(":")
    device, _function = rest.split(".")
    nvml_id = _nvml_bus_id(bus_id)
    out.busId = nvml_id.encode()
    out.busIdLegacy = nvml_id[4:].encode()
    out.domain, out.bus, out.device = int(domain, 16), int(bus, 16), int(device, 16)
    out.pciDeviceId = (device_id << 16) | PCI_VENDOR_NVIDIA
    out.pciSubSystemId = 0


def _ci_shape_name(gi_name: str, gi_slices: int, ci_slices: int) -> str:
    """nvidia-smi's name of a compute instance shape: the GI name, prefixed ``<C>c.`` when it is smaller."""
    return gi_name if ci_slices == gi_slices else f"{ci_slices}c.{gi_name}"


def _ci_name(gi: SimGpuInstance, ci: SimComputeInstance) -> str:
    return _ci_shape_name(gi.profile.name, gi.profile.slice_count, ci.slices)
