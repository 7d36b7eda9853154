"""``NvmlGpuLib``: the ``GpuLib`` port implemented on NVML through nvidia-ml-py's ``pynvml`` module.

A thin adapter: it calls NVML as the NVIDIA tools do (nvidia-smi, go-nvlib, the NVIDIA DRA driver) and turns the
answers into our models. Every NVML failure becomes a typed ``GpuError`` naming the device and the NVML function.
The same class runs on a real node (the default ``import pynvml``) and on the simulator (``sim.fakelib`` hands it
a pynvml copy wired to a ``SimulatedNode``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import math
import os
import subprocess
import threading
import time
import uuid as uuid_lib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from dradriver.gpu.caps import MigCapabilities, ProcMigCapabilities
from dradriver.gpu.errors import (
    GpuError,
    GpuIsLost,
    InvalidArgument,
    LibraryNotFound,
    NotFound,
    NotSupported,
    NvmlReleased,
    SessionEnded,
    error_for_code,
)
from dradriver.gpu.interface import StillChanging
from dradriver.gpu.models import (
    ComputeInstance,
    ComputeMode,
    DeviceNode,
    DeviceUsage,
    FabricInfo,
    FabricState,
    GpuEvent,
    GpuInfo,
    GpuInstance,
    GpuProbe,
    GpuProcess,
    MigDevice,
    MigModeState,
    MigProfile,
    NvlinkConnection,
    NvlinkPeerType,
    Placement,
    SystemInfo,
    UnreadableGpu,
)
from dradriver.gpu.products import ARCHITECTURE_NAMES, load_products

log = logging.getLogger(__name__)

LIBRARY_NOT_FOUND_MESSAGE = "NVML library not found: install the NVIDIA driver or use --gpu-backend sim"

_SUCCESS = 0
_LIBRARY_NOT_FOUND = 12
_TIMEOUT = 10
_GPU_IS_LOST = 15
_ARGUMENT_VERSION_MISMATCH = 25
_NOT_ATTRIBUTABLE = 0xFFFFFFFF
_CI_PROFILE_1_SLICE_REV1 = 0x7
_HEALTH_EVENTS = 0x8 | 0x2 | 0x1  # XidCriticalError | DoubleBitEccError | SingleBitEccError
_XID_EVENT = 0x8
_DOUBLE_BIT_ECC_EVENT = 0x2
_MEMORY_ERROR_UNCORRECTED = 1
_VOLATILE_ECC = 0
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU: the GPU die
_FIELD_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (drivers from the 565 branch on)
#: The health loop's event wait is cut in slices this long, so a release of NVML (:meth:`NvmlGpuLib.released`)
#: waits at most one slice for it; an event raised meanwhile stays queued in the event set.
EVENT_WAIT_SLICE_S = 0.25

_STILL_UNBINDING = (
    "NVML is let go while a GPU's unbind from the nvidia driver is still in the kernel (a process holds the GPU "
    "open); GPU calls resume once the unbind returns"
)
#: NVML calls that change a GPU: a method that made one is not run again when its session ends (:func:`_one_session`).
_CHANGING_CALLS = frozenset(
    {
        "nvmlDeviceSetMigMode",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceDestroy",
        "nvmlDeviceSetComputeMode",
    }
)

#: NVML_ERROR_FUNCTION_NOT_FOUND: the installed driver's NVML lacks the function.
FUNCTION_NOT_FOUND = 13
# nvmlDeviceGetAddressingMode values → the names go-nvlib (and NVIDIA's addressingMode attribute) use.
ADDRESSING_MODE_NAMES = {0: "None", 1: "HMM", 2: "ATS"}
# nvmlDeviceGetBrand values → go-nvlib's brand strings.
BRAND_NAMES = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
# Name suffix of a GPU-instance profile by its NVML_GPU_INSTANCE_PROFILE_* enum (go-nvlib's attributes).
_PROFILE_SUFFIX = {
    0x7: "+me",
    0x8: "+me",
    0xA: "+gfx",
    0xB: "+gfx",
    0xC: "+gfx",
    0x11: "+gfx",
    0xD: "-me",
    0xE: "-me",
    0xF: "+me.all",
    0x10: "+me.all",
}


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as sysfs and Kubernetes spell it: ``0000:07:00.0``, lower case."""
    domain, rest = bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def mig_profile_name(enum: int, slice_count: int, memory_mib: int, total_memory_bytes: int) -> str:
    """A GPU-instance profile's name as nvidia-smi prints it (``3g.40gb``, ``1g.10gb+me``).

    The memory figure is the profile's share of the GPU in eighths, rounded up, times the GPU's memory in whole
    GiB — how NVIDIA's go-nvlib derives it, so it matches nvidia-smi also where plain rounding would not."""
    gib = 1024**3
    fraction = math.ceil(memory_mib * 1024 * 1024 / total_memory_bytes * 8) / 8
    total_gib = (total_memory_bytes + gib - 1) // gib
    memory_gb = math.floor(fraction * total_gib + 0.5)
    return f"{slice_count}g.{memory_gb}gb{_PROFILE_SUFFIX.get(enum, '')}"


class PciTopology(Protocol):
    """Where a GPU sits on the host: facts NVML does not give, read from sysfs on a real node."""

    def numa_node(self, pci_bus_id: str) -> int | None:
        """NUMA node of the device at normalised ``pci_bus_id``, None when the platform has none."""

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """PCIe root complex (``pci0000:00``) above the device, None when unknown."""


class SysfsPciTopology:
    """``PciTopology`` from ``/sys/bus/pci/devices/<bdf>`` (``numa_node`` file, and the link target's path)."""

    def __init__(self, root: Path = Path("/sys/bus/pci/devices")) -> None:
        self.root = root

    def numa_node(self, pci_bus_id: str) -> int | None:
        try:
            value = int((self.root / pci_bus_id / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return None if value < 0 else value

    def pcie_root(self, pci_bus_id: str) -> str | None:
        # The device link reads like ../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0.
        try:
            target = os.readlink(self.root / pci_bus_id)
        except OSError:
            return None
        parts = Path(target).parts
        for before, after in itertools.pairwise(parts):
            if before == "devices" and after.startswith("pci"):
                return after
        return None


@dataclass(frozen=True)
class NvidiaSmi:
    """How this process runs the driver's ``nvidia-smi``, for the two things NVML has no public call for. In the
    driver's pod the tool is the driver root's (``/driver-root/usr/bin/nvidia-smi``, or below
    ``/usr/local/nvidia``), and the image's loader finds no ``libnvidia-ml.so.1``: ``preload`` names the root's, so
    the tool's own ``dlopen`` of the soname finds it loaded. ``dradriver run`` says which once it found the root
    (:meth:`NvmlGpuLib.use_nvidia_smi`); until then, and outside a pod, the one on PATH as it is."""

    command: tuple[str, ...] = ("nvidia-smi",)
    preload: tuple[str, ...] = ()  # put before any LD_PRELOAD this process has

    def reset(self, gpu_uuid: str) -> None:
        """Reset a GPU with ``nvidia-smi --gpu-reset`` (mig-parted does the same)."""
        done = self._run(["--gpu-reset", "-i", gpu_uuid], gpu_uuid, "nvidia-smi -r", "reset the GPU", timeout=120)
        if done.returncode != 0:
            raise GpuError(
                f"GPU reset failed: {(done.stdout + done.stderr).strip()}; stop every process using the GPU and retry",
                device=gpu_uuid,
                call="nvidia-smi -r",
            )

    def set_timeslice(self, gpu_uuid: str, value: int) -> None:
        """Set a GPU's time-slice with ``nvidia-smi compute-policy --set-timeslice`` (NVML's only time-slice setters
        are the vGPU scheduler's; NVIDIA's DRA driver does the same)."""
        call = "nvidia-smi compute-policy --set-timeslice"
        done = self._run(
            ["compute-policy", "-i", gpu_uuid, "--set-timeslice", str(value)], gpu_uuid, call, "set the time-slice"
        )
        if done.returncode != 0:
            raise GpuError(
                f"setting the time-slice failed: {(done.stdout + done.stderr).strip()}", device=gpu_uuid, call=call
            )

    def _env(self) -> dict[str, str]:
        if not self.preload:
            return dict(os.environ)
        preload = [*self.preload, *(p for p in os.environ.get("LD_PRELOAD", "").split(":") if p)]
        return {**os.environ, "LD_PRELOAD": ":".join(preload)}

    def _run(
        self, arguments: list[str], gpu_uuid: str, call: str, purpose: str, *, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*self.command, *arguments],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                env=self._env(),
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise GpuError(f"cannot run {self.command[0]} to {purpose}: {err}", device=gpu_uuid, call=call) from err


class _SessionGate:
    """Who may use this process's NVML session: NVML calls share it, a release (:meth:`NvmlGpuLib.released`) takes
    it alone, after the calls in flight and before any new one (a waiting release goes first, so back-to-back
    event waits cannot starve it). The releasing thread's own calls pass through."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharers = 0
        self._owner: int | None = None  # the thread that holds it alone
        self._waiting = 0  # releases waiting for it
        self._mine = threading.local()  # whether this thread shares it already (a nested call)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        if self._owner == threading.get_ident() or getattr(self._mine, "sharing", False):
            yield  # the releasing thread, or a call nested in one that already shares it
            return
        with self._cond:
            while self._owner is not None or self._waiting:
                self._cond.wait()
            self._sharers += 1
        self._mine.sharing = True
        try:
            yield
        finally:
            self._mine.sharing = False
            with self._cond:
                self._sharers -= 1
                self._cond.notify_all()

    def held_here(self) -> bool:
        """Whether this thread shares it or holds it alone now."""
        return self._owner == threading.get_ident() or bool(getattr(self._mine, "sharing", False))

    @property
    def sharers(self) -> int:
        """How many threads share it now (for tests that must see a call in flight)."""
        with self._cond:
            return self._sharers

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        if self._owner == threading.get_ident():
            yield  # a release nested in this thread's own
            return
        if getattr(self._mine, "sharing", False):
            # It would wait for this thread's own share to end: a deadlock, never a wait.
            raise RuntimeError("NVML cannot be released from inside an NVML call of the same thread")
        with self._cond:
            self._waiting += 1
            while self._owner is not None or self._sharers:
                self._cond.wait()
            self._waiting -= 1
            self._owner = threading.get_ident()
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()


def _load_library(nvml: Any, path: str) -> None:
    """Hand pynvml the library loaded from ``path``: pynvml loads ``libnvidia-ml.so.1`` by soname only when its
    ``nvmlLib`` is unset, so a library set first is the one every call uses."""
    with nvml.libLoadLock:
        if nvml.nvmlLib is not None:
            return
        try:
            nvml.nvmlLib = ctypes.CDLL(path)
        except OSError as err:
            raise LibraryNotFound(
                f"cannot load NVML from {path}: {err}; check the driver root (--driver-root, "
                "--container-driver-root) or use --gpu-backend sim",
                call="dlopen",
            ) from err


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_session(method: Callable[Concatenate[NvmlGpuLib, _P], _R]) -> Callable[Concatenate[NvmlGpuLib, _P], _R]:
    """Run ``method``'s NVML calls in one NVML session: a handle it read before a release (:meth:`NvmlGpuLib.released`)
    is refused after it (:class:`SessionEnded`), and the method runs once more in the new session, unless it had
    already changed the GPU (then the retryable error is raised: running it again would change it twice)."""

    def run(self: NvmlGpuLib, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._pinned_session() is not None:
            return method(self, *args, **kwargs)  # nested in a method that holds the session already
        self._local.changed = False
        try:
            with self._pin_session():
                return method(self, *args, **kwargs)
        except SessionEnded:
            if self._changed_gpu():
                raise
        with self._pin_session():
            return method(self, *args, **kwargs)

    functools.update_wrapper(run, method)
    return run


class NvmlGpuLib:
    """The ``GpuLib`` port on NVML. Thread-safe as NVML is; ``close()`` shuts NVML down."""

    def __init__(
        self,
        *,
        nvml: ModuleType | None = None,
        pci_topology: PciTopology | None = None,
        mig_capabilities: MigCapabilities | None = None,
        gpu_reset: Callable[[str], None] | None = None,
        timeslice_setter: Callable[[str, int], None] | None = None,
        library_path: str | None = None,
    ) -> None:
        """``library_path``: load ``libnvidia-ml.so.1`` from this file (the driver root's, as discovery found it)
        instead of by soname through this process's loader, so one image works on every driver layout."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        if library_path is not None:
            _load_library(nvml, library_path)
        self._topology = pci_topology if pci_topology is not None else SysfsPciTopology()
        self._capabilities = mig_capabilities if mig_capabilities is not None else ProcMigCapabilities()
        self._gpu_reset = gpu_reset  # None: nvidia-smi's (tests give their own)
        self._set_timeslice = timeslice_setter
        self._smi = NvidiaSmi()
        self._lock = threading.RLock()
        self._gate = _SessionGate()
        self._needs_init = False  # NVML is shut down since a release: started again at the next gpus()
        self._released_why = ""  # why NVML is not running, while _needs_init
        self._restart_when: Callable[[], bool] | None = None  # an unbind under way since a release: its end
        self._releases = 0  # released() blocks this thread is in (nested ones start nothing)
        self._session = 0  # NVML's session: counted up at each release (its handles end with it)
        self._local = threading.local()  # the session a method runs in (_one_session), per thread
        self._closed = False
        self._gpus: list[GpuInfo] | None = None
        self._unreadable: dict[int, str] = {}  # NVML index → why the GPU could not be read (lost before discovery)
        self._handles: dict[str, Any] = {}
        self._profiles: dict[str, list[MigProfile]] = {}
        self._ci_profiles: dict[tuple[str, int], list[tuple[int, Any]]] = {}
        self._links: dict[str, list[NvlinkConnection]] = {}
        self._fabric: dict[str, FabricInfo | None] = {}
        self._event_set: Any = None
        self._event_error: GpuError | None = None
        self._event_uuids: dict[int, str] = {}
        self._reported_lost: set[str] = set()
        self._lost_before_watch: list[str] = []
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            if err.value == _LIBRARY_NOT_FOUND:
                raise LibraryNotFound(LIBRARY_NOT_FOUND_MESSAGE, call="nvmlInit") from err
            raise error_for_code(err.value, str(err), call="nvmlInit") from err

    # --- plumbing -----------------------------------------------------------------------------------------

    def _call(
        self, function: str, *args: Any, device: str | None = None, context: str | None = None, **kwargs: Any
    ) -> Any:
        """``pynvml.<function>(*args)``, with NVML errors turned into typed ``GpuError``s (``context`` says what
        was being attempted, for the message). Waits while this process has released NVML; fails fast
        (:class:`NvmlReleased`) while NVML stays shut down after one, and with :class:`SessionEnded` where the
        calling method began in a session that has ended since (its handles would be stale)."""
        if self._needs_init and not self._gate.held_here():
            # Started lazily (gpus()) once the unbind that kept it shut down has returned. Never from inside the
            # gate: gpus() takes the lock, which a release holds while it waits for the gate (lock, then gate).
            with contextlib.suppress(NvmlReleased):
                self.gpus()
        try:
            with self._gate.shared():
                self._refuse_ended(function, device)
                result = getattr(self._nvml, function)(*args, **kwargs)
        except self._nvml.NVMLError as err:
            text = f"{context}: {err}" if context else str(err)
            raise error_for_code(err.value, text, device=device, call=function) from err
        if function in _CHANGING_CALLS:
            self._local.changed = True
        return result

    def _refuse_ended(self, function: str, device: str | None) -> None:
        if self._needs_init:
            raise NvmlReleased(self._released_why, device=device, call=function)
        pinned = self._pinned_session()
        if pinned is not None and pinned != self._session:
            raise SessionEnded(
                "NVML was let go and started again during this operation (a GPU left the nvidia driver); retry it",
                device=device,
                call=function,
            )

    def _lifecycle(self, function: str) -> None:
        """``nvmlInit`` / ``nvmlShutdown`` themselves, errors typed; only under :meth:`released`'s lock and gate."""
        try:
            getattr(self._nvml, function)()
        except self._nvml.NVMLError as err:
            raise error_for_code(err.value, str(err), call=function) from err

    def _pinned_session(self) -> int | None:
        session: int | None = getattr(self._local, "session", None)
        return session

    def _changed_gpu(self) -> bool:
        return bool(getattr(self._local, "changed", False))

    @contextlib.contextmanager
    def _pin_session(self) -> Iterator[None]:
        """This thread's calls belong to the current session for the block (the outer one's again after it)."""
        outer, outer_changed = self._pinned_session(), self._changed_gpu()
        self._local.session, self._local.changed = self._session, False
        try:
            yield
        finally:
            self._local.session = outer
            self._local.changed = outer_changed or self._local.changed

    def _handle(self, uuid: str) -> Any:
        """A device handle for a GPU or MIG UUID (GPU handles are cached: they never change)."""
        handle = self._handles.get(uuid)
        if handle is None:
            self.gpus()
            handle = self._handles.get(uuid)
        if handle is None:
            if not isinstance(uuid, str):
                # ctypes would pass a number as a pointer: NVML would read whatever memory it names.
                raise NotFound(f"{uuid!r} is not a GPU or MIG UUID", device=str(uuid), call="nvmlDeviceGetHandleByUUID")
            handle = self._call("nvmlDeviceGetHandleByUUID", uuid, device=uuid)
        return handle

    @staticmethod
    def _address(handle: Any) -> int:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0

    def _gpu_info(self, uuid: str) -> GpuInfo:
        for gpu in self.gpus():
            if gpu.uuid == uuid:
                return gpu
        raise NotFound(f"no GPU with UUID {uuid} on this node; `dradriver inventory` lists them", device=uuid)

    # --- identity -----------------------------------------------------------------------------------------

    def system(self) -> SystemInfo:
        extra: dict[str, str] = {}
        with contextlib.suppress(GpuError):  # informational only
            extra["nvmlVersion"] = self._call("nvmlSystemGetNVMLVersion")
        return SystemInfo(
            driver_version=self._call("nvmlSystemGetDriverVersion"),
            cuda_driver_version=self._call("nvmlSystemGetCudaDriverVersion_v2"),
            extra=extra,
        )

    def gpus(self) -> list[GpuInfo]:
        """Every GPU that could be read. One that cannot (lost before discovery) is skipped, not fatal: it is
        listed by ``unreadable_gpus`` and read again at the next call, so it joins once it answers. Raises
        :class:`NvmlReleased` while NVML cannot be started again after a release (an unbind still under way)."""
        with self._lock, self._pin_session():
            if self._needs_init:
                self._start_again()
                if self._needs_init:
                    raise NvmlReleased(self._released_why, call="nvmlInit")
            if self._gpus is None:
                self._gpus = []
                for index in range(self._call("nvmlDeviceGetCount")):
                    self._try_read(index)
                self._watch_events()
            elif self._unreadable:
                for index in sorted(self._unreadable):
                    info = self._try_read(index)
                    if info is not None and self._event_set is not None:
                        self._register_returned(info.uuid)
            return list(self._gpus)

    def unreadable_gpus(self) -> list[UnreadableGpu]:
        """GPUs NVML counts but could not describe at the last ``gpus()`` call."""
        with self._lock:
            return [UnreadableGpu(index, error) for index, error in sorted(self._unreadable.items())]

    def _try_read(self, index: int) -> GpuInfo | None:
        assert self._gpus is not None
        try:
            info = self._read_gpu(index)
        except GpuError as err:
            if index not in self._unreadable:
                log.error("GPU skipped: it cannot be read gpu_index=%d error=%s", index, err)
            self._unreadable[index] = str(err)
            return None
        if self._unreadable.pop(index, None) is not None:
            log.info("GPU readable again gpu_index=%d gpu=%s", index, info.pci_bus_id)
        self._gpus = sorted([*self._gpus, info], key=lambda g: g.index)
        return info

    def _read_gpu(self, index: int) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", index, device=f"GPU index {index}")
        uuid = self._call("nvmlDeviceGetUUID", handle, device=f"GPU index {index}")
        self._handles[uuid] = handle
        self._event_uuids[self._address(handle)] = uuid
        pci = self._call("nvmlDeviceGetPciInfo_v3", handle, device=uuid)
        bus_id = normalize_pci_bus_id(_text(pci.busId))
        name = self._call("nvmlDeviceGetName", handle, device=uuid)
        try:
            self._call("nvmlDeviceGetMigMode", handle, device=uuid)
            mig_capable = True
        except NotSupported:
            mig_capable = False
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", handle, device=uuid)
        return GpuInfo(
            index=index,
            minor=self._call("nvmlDeviceGetMinorNumber", handle, device=uuid),
            uuid=uuid,
            product_name=name,
            brand=BRAND_NAMES.get(self._call("nvmlDeviceGetBrand", handle, device=uuid), "Unknown"),
            architecture=ARCHITECTURE_NAMES.get(
                self._call("nvmlDeviceGetArchitecture", handle, device=uuid), "Unknown"
            ),
            cuda_compute_capability=(major, minor),
            memory_bytes=self._call("nvmlDeviceGetMemoryInfo", handle, device=uuid).total,
            multiprocessors=self._multiprocessors(handle, uuid, name),
            pci_bus_id=bus_id,
            pci_device_id=pci.pciDeviceId >> 16,
            numa_node=self._topology.numa_node(bus_id),
            pcie_root=self._topology.pcie_root(bus_id),
            mig_capable=mig_capable,
            addressing_mode=self._addressing_mode(handle, uuid),
            module_id=self._module_id(handle, uuid),
        )

    def _addressing_mode(self, handle: Any, uuid: str) -> str | None:
        # Absent from older drivers (no such function) and unsupported on non-coherent platforms: both mean none.
        if not hasattr(self._nvml, "nvmlDeviceGetAddressingMode"):
            return None
        try:
            mode = self._call("nvmlDeviceGetAddressingMode", handle, device=uuid)
        except GpuError as err:
            if isinstance(err, NotSupported) or err.code == FUNCTION_NOT_FOUND:
                return None
            raise
        return ADDRESSING_MODE_NAMES.get(int(mode))

    def _module_id(self, handle: Any, uuid: str) -> int | None:
        # HGX/DGX baseboards number their GPU modules from 1 (FM's physicalId). NOT_SUPPORTED, a driver without the
        # call, and 0 (what some boards answer; NVIDIA's driver reads 0 as none too) all mean none, never an error.
        if not hasattr(self._nvml, "nvmlDeviceGetModuleId"):
            return None
        try:
            # A c_uint of this call's own: pynvml's default argument is one object shared by every thread.
            module_id = int(self._call("nvmlDeviceGetModuleId", handle, ctypes.c_uint(), device=uuid))
        except GpuError as err:
            if isinstance(err, NotSupported) or err.code == FUNCTION_NOT_FOUND:
                return None
            raise
        return module_id or None

    def _multiprocessors(self, handle: Any, uuid: str, name: str) -> int:
        # NVML reports SM counts only for MIG device handles; for a whole GPU we know them per product (0 when not).
        try:
            return int(self._call("nvmlDeviceGetAttributes_v2", handle, device=uuid).multiprocessorCount)
        except NotSupported:
            product = load_products().get(name)
            return product.multiprocessors if product else 0

    # --- MIG ----------------------------------------------------------------------------------------------

    @_one_session
    def mig_mode(self, gpu_uuid: str) -> MigModeState:
        current, pending = self._call("nvmlDeviceGetMigMode", self._handle(gpu_uuid), device=gpu_uuid)
        return MigModeState(current=current == 1, pending=pending == 1)

    @_one_session
    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> MigModeState:
        status = self._call("nvmlDeviceSetMigMode", self._handle(gpu_uuid), int(enabled), device=gpu_uuid)
        if status != 0:
            # NVML can accept the request yet report that activating it failed (e.g. the GPU is busy).
            raise error_for_code(status, "MIG mode change not activated", device=gpu_uuid, call="nvmlDeviceSetMigMode")
        return self.mig_mode(gpu_uuid)

    @_one_session
    def mig_profiles(self, gpu_uuid: str) -> list[MigProfile]:
        with self._lock:
            cached = self._profiles.get(gpu_uuid)
            if cached is None:
                cached = self._profiles[gpu_uuid] = self._read_profiles(gpu_uuid)
            return list(cached)

    def _read_profiles(self, gpu_uuid: str) -> list[MigProfile]:
        gpu = self._gpu_info(gpu_uuid)
        if not gpu.mig_capable:
            return []
        handle = self._handle(gpu_uuid)
        # The versioned call (which also names the profile) answers only while MIG is enabled.
        version = 2 if self.mig_mode(gpu_uuid).current else 1
        profiles: dict[int, MigProfile] = {}
        for enum in range(self._nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum, version=version, device=gpu_uuid)
            except (NotSupported, InvalidArgument):
                continue
            if info.id in profiles:
                continue
            placements = self._placements(handle, gpu_uuid, info.id)
            name = _text(info.name).removeprefix("MIG ") if version == 2 else ""
            profiles[info.id] = MigProfile(
                id=info.id,
                name=name or mig_profile_name(enum, info.sliceCount, info.memorySizeMB, gpu.memory_bytes),
                slice_count=info.sliceCount,
                memory_slices=placements[0].size if placements else 0,
                max_instances=info.instanceCount,
                memory_mib=info.memorySizeMB,
                multiprocessors=info.multiprocessorCount,
                copy_engines=info.copyEngineCount,
                decoders=info.decoderCount,
                encoders=info.encoderCount,
                jpeg_engines=info.jpegCount,
                ofa_engines=info.ofaCount,
                placements=placements,
            )
        return list(profiles.values())

    def _placements(self, handle: Any, gpu_uuid: str, profile_id: int) -> tuple[Placement, ...]:
        count = ctypes.c_uint(0)
        call = "nvmlDeviceGetGpuInstancePossiblePlacements"
        self._call(call, handle, profile_id, None, ctypes.byref(count), device=gpu_uuid)
        buffer = (self._nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        self._call(call, handle, profile_id, buffer, ctypes.byref(count), device=gpu_uuid)
        return tuple(Placement(buffer[i].start, buffer[i].size) for i in range(count.value))

    def _profile(self, gpu_uuid: str, profile_id: int, call: str) -> MigProfile:
        profiles = self.mig_profiles(gpu_uuid)
        for profile in profiles:
            if profile.id == profile_id:
                return profile
        known = ", ".join(f"{p.id} ({p.name})" for p in profiles) or "none: the GPU has no MIG"
        raise InvalidArgument(f"no MIG profile id {profile_id}; known: {known}", device=gpu_uuid, call=call)

    @_one_session
    def gpu_instances(self, gpu_uuid: str) -> list[GpuInstance]:
        if not self._gpu_info(gpu_uuid).mig_capable or not self.mig_mode(gpu_uuid).current:
            return []
        handle = self._handle(gpu_uuid)
        found: list[GpuInstance] = []
        for profile in self.mig_profiles(gpu_uuid):
            capacity = max(profile.max_instances, 1)
            buffer = (self._nvml.c_nvmlGpuInstance_t * capacity)()
            count = ctypes.c_uint(capacity)
            self._call("nvmlDeviceGetGpuInstances", handle, profile.id, buffer, ctypes.byref(count), device=gpu_uuid)
            found.extend(self._gpu_instance(buffer[i], gpu_uuid) for i in range(count.value))
        return sorted(found, key=lambda gi: gi.id)

    def _gpu_instance(self, gi: Any, gpu_uuid: str) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", gi, device=gpu_uuid)
        computes: list[ComputeInstance] = []
        for _enum, ci_profile in self._compute_profiles(gi, gpu_uuid, info.profileId):
            capacity = max(ci_profile.instanceCount, 1)
            buffer = (self._nvml.c_nvmlComputeInstance_t * capacity)()
            count = ctypes.c_uint(capacity)
            self._call(
                "nvmlGpuInstanceGetComputeInstances", gi, ci_profile.id, buffer, ctypes.byref(count), device=gpu_uuid
            )
            for i in range(count.value):
                ci_info = self._call("nvmlComputeInstanceGetInfo", buffer[i], device=gpu_uuid)
                computes.append(
                    ComputeInstance(id=ci_info.id, profile_id=ci_info.profileId, slice_count=ci_profile.sliceCount)
                )
        return GpuInstance(
            id=info.id,
            profile_id=info.profileId,
            placement=Placement(info.placement.start, info.placement.size),
            compute_instances=tuple(sorted(computes, key=lambda ci: ci.id)),
        )

    def _compute_profiles(self, gi: Any, gpu_uuid: str, gi_profile_id: int) -> list[tuple[int, Any]]:
        """(enum, profile info) of every compute-instance profile a GPU instance of this profile offers."""
        key = (gpu_uuid, gi_profile_id)
        with self._lock:
            cached = self._ci_profiles.get(key)
        if cached is None:
            cached = []
            for enum in range(self._nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    info = self._call(
                        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                        gi,
                        enum,
                        self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                        device=gpu_uuid,
                    )
                except (NotSupported, InvalidArgument):
                    continue
                cached.append((enum, info))
            with self._lock:
                self._ci_profiles[key] = cached
        return cached

    @_one_session
    def create_gpu_instance(self, gpu_uuid: str, profile_id: int, placement_start: int) -> GpuInstance:
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        profile = self._profile(gpu_uuid, profile_id, call)
        placement = self._nvml.c_nvmlGpuInstancePlacement_t(placement_start, profile.memory_slices)
        starts = ", ".join(str(p.start) for p in profile.placements)
        gi = self._call(
            call,
            self._handle(gpu_uuid),
            profile_id,
            ctypes.byref(placement),
            device=gpu_uuid,
            context=f"GPU instance {profile.name} (profile {profile_id}) at slice {placement_start} "
            f"(valid starts: {starts})",
        )
        created = self._gpu_instance(gi, gpu_uuid)
        log.info(
            "created GPU instance gpu=%s gi=%d profile=%s start=%d", gpu_uuid, created.id, profile.name, placement_start
        )
        return created

    @_one_session
    def destroy_gpu_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        gi = self._call("nvmlDeviceGetGpuInstanceById", self._handle(gpu_uuid), gpu_instance_id, device=gpu_uuid)
        self._call("nvmlGpuInstanceDestroy", gi, device=f"{gpu_uuid} GPU instance {gpu_instance_id}")
        log.info("destroyed GPU instance gpu=%s gi=%d", gpu_uuid, gpu_instance_id)

    @_one_session
    def create_compute_instance(
        self, gpu_uuid: str, gpu_instance_id: int, slice_count: int | None = None
    ) -> ComputeInstance:
        gi = self._call("nvmlDeviceGetGpuInstanceById", self._handle(gpu_uuid), gpu_instance_id, device=gpu_uuid)
        info = self._call("nvmlGpuInstanceGetInfo", gi, device=gpu_uuid)
        wanted = (
            slice_count
            if slice_count is not None
            else self._profile(gpu_uuid, info.profileId, "nvmlGpuInstanceGetInfo").slice_count
        )
        choice = next(
            (
                ci
                for enum, ci in self._compute_profiles(gi, gpu_uuid, info.profileId)
                if ci.sliceCount == wanted and enum != _CI_PROFILE_1_SLICE_REV1
            ),
            None,
        )
        where = f"{gpu_uuid} GPU instance {gpu_instance_id}"
        if choice is None:
            raise NotSupported(
                f"no {wanted}-slice compute instance profile in this GPU instance",
                device=where,
                call="nvmlGpuInstanceGetComputeInstanceProfileInfo",
            )
        ci = self._call("nvmlGpuInstanceCreateComputeInstance", gi, choice.id, device=where)
        ci_info = self._call("nvmlComputeInstanceGetInfo", ci, device=where)
        log.info("created compute instance gpu=%s gi=%d ci=%d slices=%d", gpu_uuid, gpu_instance_id, ci_info.id, wanted)
        return ComputeInstance(id=ci_info.id, profile_id=ci_info.profileId, slice_count=choice.sliceCount)

    @_one_session
    def destroy_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        gi = self._call("nvmlDeviceGetGpuInstanceById", self._handle(gpu_uuid), gpu_instance_id, device=gpu_uuid)
        where = f"{gpu_uuid} GPU instance {gpu_instance_id}"
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, compute_instance_id, device=where)
        self._call("nvmlComputeInstanceDestroy", ci, device=f"{where} compute instance {compute_instance_id}")
        log.info("destroyed compute instance gpu=%s gi=%d ci=%d", gpu_uuid, gpu_instance_id, compute_instance_id)

    @_one_session
    def mig_devices(self, gpu_uuid: str) -> list[MigDevice]:
        if not self._gpu_info(gpu_uuid).mig_capable:
            return []
        handle = self._handle(gpu_uuid)
        devices: list[MigDevice] = []
        for index in range(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, device=gpu_uuid)):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index, device=gpu_uuid)
            except (NotFound, InvalidArgument):
                continue
            gi_id = self._call("nvmlDeviceGetGpuInstanceId", mig, device=gpu_uuid)
            ci_id = self._call("nvmlDeviceGetComputeInstanceId", mig, device=gpu_uuid)
            uuid = self._call("nvmlDeviceGetUUID", mig, device=gpu_uuid)
            gi = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id, device=gpu_uuid)
            info = self._call("nvmlGpuInstanceGetInfo", gi, device=gpu_uuid)
            devices.append(
                MigDevice(
                    uuid=uuid,
                    parent_uuid=gpu_uuid,
                    gpu_instance_id=gi_id,
                    compute_instance_id=ci_id,
                    profile=self._profile(gpu_uuid, info.profileId, "nvmlGpuInstanceGetInfo"),
                    placement=Placement(info.placement.start, info.placement.size),
                    capability_nodes=self._capability_nodes(gpu_uuid, gi_id, ci_id),
                )
            )
        return devices

    @_one_session
    def mig_device(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> MigDevice:
        where = f"{gpu_uuid} GPU instance {gpu_instance_id}"
        gi = self._call("nvmlDeviceGetGpuInstanceById", self._handle(gpu_uuid), gpu_instance_id, device=gpu_uuid)
        gi_info = self._call("nvmlGpuInstanceGetInfo", gi, device=where)
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, compute_instance_id, device=where)
        ci_info = self._call("nvmlComputeInstanceGetInfo", ci, device=where)
        uuid = self._call("nvmlDeviceGetUUID", ci_info.device, device=where)
        return MigDevice(
            uuid=uuid,
            parent_uuid=gpu_uuid,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
            profile=self._profile(gpu_uuid, gi_info.profileId, "nvmlGpuInstanceGetInfo"),
            placement=Placement(gi_info.placement.start, gi_info.placement.size),
            capability_nodes=self._capability_nodes(gpu_uuid, gpu_instance_id, compute_instance_id),
        )

    @property
    def nvidia_smi(self) -> NvidiaSmi:
        """The ``nvidia-smi`` a reset or time-slice runs (unless a test gave its own setters)."""
        return self._smi

    def use_nvidia_smi(self, smi: NvidiaSmi) -> None:
        """Run this ``nvidia-smi`` from now on (the driver root's, once found; again after an in-place upgrade)."""
        self._smi = smi

    def reset_gpu(self, gpu_uuid: str) -> None:
        with self._outside_nvml("nvidia-smi -r", gpu_uuid):
            (self._gpu_reset or self._smi.reset)(gpu_uuid)
        log.info("reset GPU gpu=%s", gpu_uuid)

    @contextlib.contextmanager
    def _outside_nvml(self, call: str, gpu_uuid: str) -> Iterator[None]:
        """Share the session for a tool that opens the GPUs itself (``nvidia-smi``): a release waits for it to end,
        and none starts while NVML is let go (it would open the GPU that is leaving ``nvidia``)."""
        with self._gate.shared():
            if self._needs_init:
                raise NvmlReleased(self._released_why, device=gpu_uuid, call=call)
            yield

    def _capability_nodes(self, gpu_uuid: str, gi_id: int, ci_id: int) -> tuple[DeviceNode, ...]:
        # Missing capability files leave the MIG device listed but unpreparable: prepare says why.
        try:
            return self._capabilities.device_nodes(self._gpu_info(gpu_uuid).minor, gi_id, ci_id)
        except GpuError as err:
            log.warning("no MIG capability nodes gpu=%s gi=%d ci=%d error=%s", gpu_uuid, gi_id, ci_id, err)
            return ()

    # --- compute mode -------------------------------------------------------------------------------------

    @_one_session
    def compute_mode(self, device_uuid: str) -> ComputeMode:
        return ComputeMode(self._call("nvmlDeviceGetComputeMode", self._handle(device_uuid), device=device_uuid))

    @_one_session
    def set_compute_mode(self, device_uuid: str, mode: ComputeMode) -> None:
        self._call("nvmlDeviceSetComputeMode", self._handle(device_uuid), int(mode), device=device_uuid)
        log.info("set compute mode device=%s mode=%s", device_uuid, mode.name)

    def set_timeslice(self, gpu_uuid: str, value: int) -> None:
        with self._outside_nvml("nvidia-smi compute-policy", gpu_uuid):
            (self._set_timeslice or self._smi.set_timeslice)(gpu_uuid, value)
        log.info("set time-slice gpu=%s value=%d", gpu_uuid, value)

    # --- NVLink -------------------------------------------------------------------------------------------

    @_one_session
    def nvlinks(self, gpu_uuid: str) -> list[NvlinkConnection]:
        with self._lock:
            cached = self._links.get(gpu_uuid)
            if cached is None:
                cached = self._links[gpu_uuid] = self._read_links(gpu_uuid)
            return list(cached)

    def _read_links(self, gpu_uuid: str) -> list[NvlinkConnection]:
        handle = self._handle(gpu_uuid)
        links: list[NvlinkConnection] = []
        for link in range(self._nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", handle, link, device=gpu_uuid)
            except (NotSupported, InvalidArgument):
                continue
            if state != self._nvml.NVML_FEATURE_ENABLED:
                continue
            remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, device=gpu_uuid)
            kind = self._call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, device=gpu_uuid)
            links.append(
                NvlinkConnection(
                    link=link,
                    remote_pci_bus_id=normalize_pci_bus_id(_text(remote.busId)),
                    remote_type=NvlinkPeerType(kind)
                    if kind in NvlinkPeerType._value2member_map_
                    else NvlinkPeerType.UNKNOWN,
                )
            )
        return links

    # --- NVLink fabric ------------------------------------------------------------------------------------

    @_one_session
    def fabric_info(self, gpu_uuid: str, *, fresh: bool = False) -> FabricInfo | None:
        with self._lock:
            if not fresh and gpu_uuid in self._fabric:
                return self._fabric[gpu_uuid]
        info = self._read_fabric(gpu_uuid)
        # Only settled answers are kept: a registration that is still running (or failed and will be retried by
        # the fabric manager) must be read again at the next rescan, or the GPU would never join its domain.
        with self._lock:
            if info is None or info.registered:
                self._fabric[gpu_uuid] = info
            else:
                self._fabric.pop(gpu_uuid, None)
        return info

    def _read_fabric(self, gpu_uuid: str) -> FabricInfo | None:
        handle = self._handle(gpu_uuid)
        call = "nvmlDeviceGetGpuFabricInfoV"
        # pynvml's v3 struct constructor sets the version too; set it explicitly as the C API requires, so an
        # older pynvml whose struct lacks that constructor still passes a valid version.
        info = self._nvml.c_nvmlGpuFabricInfo_v3_t()
        info.version = self._nvml.nvmlGpuFabricInfo_v3
        try:
            self._call(call, handle, ctypes.byref(info), device=gpu_uuid)
        except NotSupported:
            return None
        except GpuError as err:
            if err.code != _ARGUMENT_VERSION_MISMATCH:
                raise
            # Drivers that predate the v3 struct (healthSummary) answer the v2 one, which has every field we read.
            info = self._nvml.c_nvmlGpuFabricInfo_v2_t()
            info.version = self._nvml.nvmlGpuFabricInfo_v2
            try:
                self._call(call, handle, ctypes.byref(info), device=gpu_uuid)
            except NotSupported:
                return None
        if info.state == FabricState.NOT_SUPPORTED:
            return None
        return FabricInfo(
            cluster_uuid=str(uuid_lib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
            health_mask=int(info.healthMask),
        )

    # --- health events ------------------------------------------------------------------------------------

    def _watch_events(self) -> None:
        """Register every GPU for health events. Done with the first enumeration, not the first wait: NVML
        records only events raised after registration, and none between discovery and the first wait may be
        lost."""
        try:
            event_set = self._call("nvmlEventSetCreate")
        except GpuError as err:
            self._event_error = err
            log.warning("GPU health events unavailable error=%s", err)
            return
        assert self._gpus is not None
        for gpu in self._gpus:
            try:
                self._register_events(gpu.uuid, event_set)
            except NotSupported:
                log.warning("GPU health events not supported; XIDs will not be reported gpu=%s", gpu.uuid)
            except GpuIsLost:
                # Lost before we started watching: the first wait reports it (once, also when watching anew).
                if gpu.uuid not in self._reported_lost:
                    self._reported_lost.add(gpu.uuid)
                    self._lost_before_watch.append(gpu.uuid)
            except GpuError as err:
                log.warning("GPU health events unavailable error=%s", err)
                self._event_error = err
                with contextlib.suppress(GpuError):
                    self._call("nvmlEventSetFree", event_set)
                return
        self._event_set = event_set

    def _register_events(self, gpu_uuid: str, event_set: Any) -> None:
        handle = self._handles[gpu_uuid]
        supported = self._call("nvmlDeviceGetSupportedEventTypes", handle, device=gpu_uuid)
        self._call("nvmlDeviceRegisterEvents", handle, _HEALTH_EVENTS & supported, event_set, device=gpu_uuid)

    def _register_returned(self, gpu_uuid: str) -> None:
        """Watch a GPU that answers again after it was lost (or unreadable): a reset GPU reports events anew."""
        self._reported_lost.discard(gpu_uuid)
        if self._event_set is None:
            return
        try:
            self._register_events(gpu_uuid, self._event_set)
        except GpuError as err:
            log.warning("GPU health events not registered after the GPU came back gpu=%s error=%s", gpu_uuid, err)

    @_one_session
    def probe(self, gpu_uuid: str) -> GpuProbe:
        """Cheap reads that tell whether a GPU answers and is fit: a fresh handle lookup (``GpuIsLost`` when it
        fell off the bus), the volatile uncorrectable ECC count, the NVLink fabric registration."""
        self._call("nvmlDeviceGetHandleByUUID", gpu_uuid, device=gpu_uuid)
        handle = self._handle(gpu_uuid)
        try:
            ecc: int | None = int(
                self._call(
                    "nvmlDeviceGetTotalEccErrors", handle, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC, device=gpu_uuid
                )
            )
        except NotSupported:
            ecc = None
        fabric = self._read_fabric(gpu_uuid)
        recovery_action = self._recovery_action(gpu_uuid, handle)
        with self._lock:
            if gpu_uuid in self._reported_lost:
                self._register_returned(gpu_uuid)
        return GpuProbe(
            uuid=gpu_uuid,
            ecc_uncorrected_volatile=ecc,
            fabric_registered=None if fabric is None else fabric.registered,
            recovery_action=recovery_action,
        )

    @_one_session
    def usage(self, device_uuid: str) -> DeviceUsage:
        """One NVML read of each figure; NOT_SUPPORTED (and, for ECC on a MIG handle, INVALID_ARGUMENT) is None."""
        handle = self._handle(device_uuid)

        def read(function: str, *args: Any, absent: tuple[type[GpuError], ...] = (NotSupported,)) -> Any:
            try:
                return self._call(function, handle, *args, device=device_uuid)
            except absent:
                return None

        utilization = read("nvmlDeviceGetUtilizationRates")
        memory = read("nvmlDeviceGetMemoryInfo")
        temperature = read("nvmlDeviceGetTemperature", _TEMPERATURE_GPU)
        power_mw = read("nvmlDeviceGetPowerUsage")
        ecc = read(
            "nvmlDeviceGetTotalEccErrors",
            _MEMORY_ERROR_UNCORRECTED,
            _VOLATILE_ECC,
            absent=(NotSupported, InvalidArgument),
        )
        processes = read("nvmlDeviceGetComputeRunningProcesses") or []
        return DeviceUsage(
            uuid=device_uuid,
            utilization_percent=int(utilization.gpu) if utilization is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_celsius=int(temperature) if temperature is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            ecc_uncorrected_volatile=int(ecc) if ecc is not None else None,
            processes=tuple(_process(p) for p in processes),
        )

    def _recovery_action(self, gpu_uuid: str, handle: Any) -> int | None:
        """NVML's recommended recovery action; None where the driver does not report it (or the GPU is lost:
        the probe's handle lookup says so)."""
        try:
            [value] = self._call("nvmlDeviceGetFieldValues", handle, [_FIELD_GPU_RECOVERY_ACTION], device=gpu_uuid)
        except GpuIsLost:
            raise
        except GpuError:
            return None  # NOT_SUPPORTED, FUNCTION_NOT_FOUND on older drivers, …
        if value.nvmlReturn != _SUCCESS:
            return None
        return int(value.value.uiVal)

    def rewatch_events(self) -> None:
        """Register every GPU for health events anew, in a fresh event set, after the event wait failed.
        Raises ``GpuError`` while NVML still refuses; events raised in between are not reported."""
        self.gpus()
        with self._lock:
            old, self._event_set, self._event_error = self._event_set, None, None
            if old is not None:
                with contextlib.suppress(GpuError):
                    self._call("nvmlEventSetFree", old)
            self._watch_events()
            if self._event_set is None:
                raise self._event_error or GpuError("GPU health events are not being watched")

    def wait_for_event(self, timeout_s: float) -> GpuEvent | None:
        self.gpus()
        with self._lock:
            if self._lost_before_watch:
                return GpuEvent(gpu_uuid=self._lost_before_watch.pop(0), gpu_lost=True)
            if self._event_set is None:
                raise self._event_error or GpuError("GPU health events are not being watched")
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_s = max(0.0, deadline - time.monotonic())
            data, gpu_uuid = self._wait_slice(min(remaining_s, EVENT_WAIT_SLICE_S))
            if isinstance(data, int):
                if data == _TIMEOUT:
                    if remaining_s <= EVENT_WAIT_SLICE_S:
                        return None
                    continue
                return self._lost_gpu_event()
            # Single-bit ECC events are registered (as NVIDIA's drivers do) but not reported: they were corrected.
            if data.eventType & _DOUBLE_BIT_ECC_EVENT:
                return GpuEvent(gpu_uuid=gpu_uuid, ecc_double_bit=True)
            if data.eventType & _XID_EVENT:
                return GpuEvent(
                    gpu_uuid=gpu_uuid,
                    xid=int(data.eventData),
                    gpu_instance_id=None if data.gpuInstanceId == _NOT_ATTRIBUTABLE else int(data.gpuInstanceId),
                    compute_instance_id=(
                        None if data.computeInstanceId == _NOT_ATTRIBUTABLE else int(data.computeInstanceId)
                    ),
                )
            if remaining_s == 0:
                return None

    def _wait_slice(self, timeout_s: float) -> tuple[Any, str]:
        """One ``nvmlEventSetWait_v2`` on the current event set (a release between two slices makes a new one):
        the event and its GPU's UUID (read in the same session: the event's handle ends with it), or ``_TIMEOUT`` /
        ``_GPU_IS_LOST`` as a number; other NVML errors raise."""
        with self._gate.shared():
            if self._needs_init:
                raise NvmlReleased(self._released_why, call="nvmlEventSetWait_v2")
            event_set = self._event_set
            if event_set is None:  # NVML started again after a release, but its GPUs could not be registered
                raise self._event_error or GpuError("GPU health events are not being watched")
            try:
                data = self._nvml.nvmlEventSetWait_v2(event_set, round(timeout_s * 1000))
            except self._nvml.NVMLError as err:
                if err.value in (_TIMEOUT, _GPU_IS_LOST):
                    return int(err.value), ""
                raise error_for_code(err.value, str(err), call="nvmlEventSetWait_v2") from err
            return data, self._event_gpu(data.device)

    def _event_gpu(self, device: Any) -> str:
        uuid = self._event_uuids.get(self._address(device))
        return uuid if uuid is not None else str(self._call("nvmlDeviceGetUUID", device))

    def _lost_gpu_event(self) -> GpuEvent:
        # NVML says a GPU is lost but not which: the lost one is the GPU that no longer answers a UUID lookup.
        for gpu in self.gpus():
            if gpu.uuid in self._reported_lost:
                continue
            try:
                self._call("nvmlDeviceGetHandleByUUID", gpu.uuid, device=gpu.uuid)
            except GpuIsLost:
                self._reported_lost.add(gpu.uuid)
                return GpuEvent(gpu_uuid=gpu.uuid, gpu_lost=True)
        raise GpuIsLost(
            "a GPU fell off the bus (which one is unknown); drain the node and reset or reboot it",
            call="nvmlEventSetWait_v2",
        )

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """This process holds no GPU for the ``with`` block: NVML is shut down (its health event set freed first)
        once the NVML calls in flight are done, and started again after the block, handles, caches and health
        events anew, so it also counts GPUs given back from ``vfio-pci`` since. Other threads' NVML calls wait
        meanwhile (the health loop's event wait pauses, it does not fail); events raised in the block are lost.
        A :class:`StillChanging` raised out of the block keeps NVML shut down until its change has finished
        (calls fail fast with :class:`NvmlReleased` until then; the first :meth:`gpus` after it starts NVML).

        Why a shutdown: ``nvmlInit`` attaches every GPU it opens a handle of, and an attached GPU's
        ``/dev/nvidia<minor>`` stays open in this process until ``nvmlShutdown``, where the ``nvidia`` driver's
        unbind waits for it. ``nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH)`` only defers the attach to the first
        ``nvmlDeviceGetHandleBy*``, which discovery, probes and event registration make for every GPU anyway."""
        with self._lock, self._gate.alone():
            if not self._needs_init:  # not running already (a failed start, an unbind under way): nothing to shut
                self._free_events()
                try:
                    self._lifecycle("nvmlShutdown")
                except GpuError:
                    if self._gpus is not None:
                        self._watch_events()  # still running: its health events are watched again
                    raise
                self._forget_session("NVML is let go while a GPU leaves the nvidia driver")
            self._releases += 1
            try:
                yield
            except StillChanging as change:
                if not change.finished():
                    # Chained: with two unbinds stuck at once, NVML starts again only once both have returned.
                    earlier, this = self._restart_when, change.finished
                    self._restart_when = lambda: (earlier is None or earlier()) and this()
                raise
            finally:
                self._releases -= 1
                if not self._releases:  # the outermost block: NVML was let go for all of it
                    self._start_again()

    def _free_events(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            try:
                self._call("nvmlEventSetFree", event_set)
            except GpuError as err:
                log.warning("could not free the NVML event set error=%s", err)

    def _forget_session(self, why: str) -> None:
        """NVML is shut down: its handles, and all read through them, end with the session."""
        self._session += 1
        self._needs_init, self._released_why = True, why
        self._gpus, self._unreadable, self._event_error = None, {}, None
        for cache in (self._handles, self._profiles, self._ci_profiles, self._links, self._fabric, self._event_uuids):
            cache.clear()

    def _start_again(self) -> None:
        """NVML afresh after :meth:`released`: started, the GPUs counted and read again and registered for health
        events; not while an unbind the release left under way has not returned (NVML would open that GPU again,
        and the unbind would wait for this process). A failure is logged; the next :meth:`gpus` retries."""
        if self._releases:
            return  # asked from inside a released() block (the releasing thread's own call): it stays let go
        if self._restart_when is not None:
            if not self._restart_when():
                if self._released_why != _STILL_UNBINDING:
                    log.warning("NVML stays shut down until a GPU's unbind from nvidia returns")
                self._released_why = _STILL_UNBINDING
                return
            self._restart_when = None
        try:
            self._lifecycle("nvmlInit")
        except GpuError as err:
            why = f"NVML could not be started again after it was let go ({err}); retried at each call"
            if why != self._released_why:
                log.error("NVML could not be started again; GPU calls fail until it can error=%s", err)
            self._released_why = why
            return
        self._needs_init = False
        try:
            self.gpus()
        except GpuError as err:
            log.error("GPUs could not be counted again after NVML was released error=%s", err)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._needs_init:
                return  # shut down since a release, never started again
            if self._event_set is not None:
                try:
                    self._call("nvmlEventSetFree", self._event_set)
                except GpuError as err:
                    log.warning("could not free the NVML event set error=%s", err)
            self._lifecycle("nvmlShutdown")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _process(info: Any) -> GpuProcess:
    """pynvml's process entry: instance ids of 0xFFFFFFFF (not in a MIG instance) become None."""
    gi, ci = getattr(info, "gpuInstanceId", _NOT_ATTRIBUTABLE), getattr(info, "computeInstanceId", _NOT_ATTRIBUTABLE)
    used = info.usedGpuMemory
    return GpuProcess(
        pid=int(info.pid),
        used_memory_bytes=int(used) if used is not None else None,
        gpu_instance_id=None if gi in (None, _NOT_ATTRIBUTABLE) else int(gi),
        compute_instance_id=None if ci in (None, _NOT_ATTRIBUTABLE) else int(ci),
    )
