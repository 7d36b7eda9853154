"""VFIO passthrough: a whole GPU handed to a virtual machine (KubeVirt) through ``vfio-pci``.

With ``--passthrough`` every GPU is offered a second time as a passthrough device (``<gpu>-vfio``, attribute
``type`` ``vfio``, DeviceClass ``vfio.gpu.dradriver.dev``). Its prepare moves every PCI function of the GPU's
IOMMU group from its kernel driver to ``vfio-pci``, as the kernel requires of a group given to a VM, one recorded
step (``vfio-bind``) per function:

1. ``driver_override`` = ``vfio-pci`` (so no other driver takes the function meanwhile);
2. unbind from its driver (``nvidia`` for the GPU: refused while a process has the GPU open; this process's own
   NVML lets go of every GPU for it, and the write has a deadline, since the real driver waits for its holders);
3. bind to ``vfio-pci``.

The container then gets ``/dev/vfio/<group>`` and ``/dev/vfio/vfio`` through CDI, the PCI address in the device
metadata (KEP-5304) and in ``PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO`` (KubeVirt's variable for a DRA-allocated host
device; see docs/passthrough.md).

The undo clears the override, unbinds from ``vfio-pci`` and binds the function back to the driver it had, then
waits until NVML sees the GPU again. Each step's intent is in the checkpoint before sysfs is touched, and the
undo looks at what sysfs shows (override set or not, bound to ``vfio-pci``, to nothing, or back already), so a
kill between any two writes is repaired by start-up reconciliation replaying the undo.

The GPU's intent also holds what NVML said of the GPU: a driver restarted while a VM holds it cannot ask NVML (the
GPU is not NVML's while ``vfio-pci`` has it), and publishes the passthrough device from that record instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

from dradriver.driver.prepare.checkpoint import Action, ClaimRecord
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.errors import DeviceError
from dradriver.gpu.errors import GpuError, NotFound, NvmlReleased
from dradriver.gpu.interface import GpuLib, StillChanging
from dradriver.gpu.inventory import GpuDevice, Inventory, gpu_name
from dradriver.gpu.models import DeviceNode, GpuInfo
from dradriver.gpu.products import load_products
from dradriver.nvidia_install.pci_binding import (
    DISPLAY_CLASS_PREFIX,
    NVIDIA_DRIVER,
    VFIO_DRIVER,
    HoldersUnknown,
    HostPci,
    PciFunction,
)

log = logging.getLogger(__name__)

STEP_VFIO_BIND = "vfio-bind"
#: The GPU's ``vfio-bind`` intent holds this (true) when its claim asked for ``PreferIommuFD``; absent: legacy.
PREFER_IOMMUFD = "preferIommuFD"
VFIO_TYPE = "vfio"
NAME_SUFFIX = "-vfio"
#: How long unprepare waits for NVML to see a GPU given back to ``nvidia`` (the driver initialises it first).
NVML_RETURN_TIMEOUT_S = 30.0
NVML_POLL_S = 0.1
#: How long the sysfs write that unbinds a function may take: the ``nvidia`` driver's remove does not refuse a GPU
#: in use, it waits in the kernel until its last handle is closed (NVIDIA's driver waits up to 60 s for ``fuser`` to
#: find none before it writes; a holder that opens the GPU after such a check wedges the write for good).
UNBIND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class PassthroughDevice:
    """A GPU offered for VFIO passthrough: what sysfs shows of it, with what NVML last said (None while the GPU is
    bound to ``vfio-pci``, where NVML cannot see it, and was not seen before by this process)."""

    name: str
    function: PciFunction
    group_members: tuple[str, ...]  # the functions of its IOMMU group that go to the VM (bridges stay), itself too
    gpu: GpuDevice | None
    iommufd: bool = False  # the node offers IOMMUFD (/dev/iommu): a claim may ask for the device's cdev

    @property
    def address(self) -> str:
        return self.function.address

    @property
    def gpu_name(self) -> str:
        """The whole GPU's device name: a claim on either excludes the other (the checkpoint's overlap check)."""
        return self.name.removesuffix(NAME_SUFFIX)

    @property
    def uuid(self) -> str | None:
        return self.gpu.uuid if self.gpu is not None else None

    @property
    def group_shared(self) -> bool:
        """Whether the IOMMU group holds other functions, which go to the VM's launcher too."""
        return len(self.group_members) > 1

    @property
    def product_name(self) -> str:
        if self.gpu is not None:
            return self.gpu.info.product_name
        return _product_by_device_id().get(int(self.function.device_id, 16), "NVIDIA GPU")


@dataclass(frozen=True)
class PassthroughGpu(GpuDevice):
    """A passthrough device as the prepare recipe resolves it: a whole GPU (NVML's view of it, under the passthrough
    device's name) with its sysfs side. It is a :class:`GpuDevice` so the recipe's whole-GPU rules (overlap with
    every other claim on the GPU, its lock) hold for it; ``whole`` is the GPU under its own name."""

    passthrough: PassthroughDevice
    whole: GpuDevice


def passthrough_name(gpu_name: str) -> str:
    return gpu_name + NAME_SUFFIX


class PassthroughCatalog:
    """The node's passthrough devices, from sysfs, joined with the last inventory by PCI address. Remembers what
    NVML said of a GPU, so a GPU bound to ``vfio-pci`` keeps its UUID and product in the slices."""

    def __init__(self, pci: HostPci) -> None:
        self.pci = pci
        self._seen: dict[str, GpuDevice] = {}
        self._told_shared: set[str] = set()  # GPUs whose group holds another GPU, logged once
        self._told_undescribed: set[str] = set()  # GPUs on vfio-pci since before this process, logged once

    def devices(self, inventory: Inventory, recorded: Iterable[ClaimRecord] = ()) -> list[PassthroughDevice]:
        """Every NVIDIA GPU function in an IOMMU group, bound to ``nvidia`` or ``vfio-pci``; none where the IOMMU
        is off (nothing could be passed through). A GPU NVML has not described in this process is described as
        ``recorded`` claims' ``vfio-bind`` steps saw it (the driver restarted while a VM holds it); one that neither
        describes (bound to ``vfio-pci`` by the host, ``vfio-pci.ids=`` at boot) is left out: its claim could not
        be prepared."""
        for address, gpu in recorded_gpus(recorded).items():
            self._seen.setdefault(address, gpu)
        for gpu in inventory.gpus:
            self._seen[gpu.info.pci_bus_id] = gpu
        if not self.pci.iommu_enabled():
            return []
        found = []
        iommufd = self.pci.iommufd_enabled()
        for function in self.pci.gpus():
            if function.iommu_group is None or function.driver not in (NVIDIA_DRIVER, VFIO_DRIVER):
                continue
            others = other_displays_in_group(self.pci, function)
            if others:
                self._tell_shared(function.address, others)
                continue
            known = self._seen.get(function.address)
            if known is None and function.driver == VFIO_DRIVER:
                self._tell_undescribed(function.address)
                continue
            name = passthrough_name(known.name if known is not None else gpu_name(function.address))
            members = tuple(
                a for a in self.pci.group_members(function.iommu_group) if not self.pci.function(a).is_bridge
            )
            found.append(PassthroughDevice(name, function, members, known, iommufd=iommufd))
        return found

    def _tell_undescribed(self, address: str) -> None:
        if address in self._told_undescribed:
            return
        self._told_undescribed.add(address)
        log.info(
            "GPU not offered for passthrough: it was bound to vfio-pci before this driver started (vfio-pci.ids= on "
            "the kernel command line, or by hand), so NVML never described it and no claim of ours holds it; bind it "
            "to nvidia and it is offered address=%s",
            address,
        )

    def _tell_shared(self, address: str, others: Sequence[str]) -> None:
        if address in self._told_shared:
            return
        self._told_shared.add(address)
        log.info(
            "GPU not offered for passthrough: its IOMMU group holds other GPUs, which would go to the VM too "
            "address=%s others=%s",
            address,
            ",".join(others),
        )


class Passthrough:
    """VFIO passthrough on one node (``--passthrough``): its devices and its prepare step."""

    def __init__(self, catalog: PassthroughCatalog, steps: PassthroughSteps) -> None:
        self.catalog = catalog
        self.steps = steps
        self._devices: list[PassthroughDevice] = []

    def refresh(self, inventory: Inventory, recorded: Iterable[ClaimRecord] = ()) -> list[PassthroughGpu]:
        """Read sysfs again; the devices a claim can be prepared with (those whose GPU NVML has described, in this
        process or, for a GPU a VM holds since before it started, in the ``vfio-bind`` steps of ``recorded``)."""
        self._devices = self.catalog.devices(inventory, recorded)
        return [
            PassthroughGpu(
                name=d.name,
                info=d.gpu.info,
                nvlink_domain=d.gpu.nvlink_domain,
                mig_enabled=False,
                mig_profiles=(),
                passthrough=d,
                whole=d.gpu,
            )
            for d in self._devices
            if d.gpu is not None
        ]

    def devices(self) -> list[PassthroughDevice]:
        """What the last :meth:`refresh` found, for the slices."""
        return list(self._devices)


@cache
def _product_by_device_id() -> dict[int, str]:
    return {spec.pci_device_id: name for name, spec in load_products().items()}


def prefers_iommufd(config: object) -> bool:
    """Whether a resolved opaque config is a ``VfioDeviceConfig`` whose ``iommu.backendPolicy`` is
    ``PreferIommuFD`` (read by attribute: the config module loads with the first claim that has one)."""
    iommu = getattr(config, "iommu", None) if getattr(config, "kind", None) == "VfioDeviceConfig" else None
    return getattr(iommu, "backend_policy", None) == "PreferIommuFD"


def passthrough_env(device: PassthroughDevice) -> tuple[str, ...]:
    """The variables KubeVirt's virt-launcher reads for a DRA host device: the PCI address under the resource's
    name (``PCI_RESOURCE_<NAME>``, the name upper-cased with ``.`` and ``/`` as ``_``), and NVIDIA's ``void``."""
    return (f"PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO={device.address}", "NVIDIA_VISIBLE_DEVICES=void")


class PassthroughSteps:
    """The ``vfio-bind`` step on one node. ``nvml_sees(uuid)`` says whether NVML answers for the GPU now; the
    caller holds the GPU's lock around every call."""

    def __init__(
        self,
        pci: HostPci,
        *,
        nvml_sees: Callable[[str], bool],
        holders: Callable[[str], list[int]] = lambda _uuid: [],
        nvml_counts: Callable[[str], bool] = lambda _uuid: True,
        return_timeout_s: float = NVML_RETURN_TIMEOUT_S,
        release: Callable[[], AbstractContextManager[None]] = nullcontext,
        unbind_timeout_s: float = UNBIND_TIMEOUT_S,
    ) -> None:
        """``holders(uuid)``: the PIDs NVML shows on the GPU. They are asked before the unbind, because the real
        ``nvidia`` driver does not refuse an unbind while a process has the GPU open: it waits for it.
        ``nvml_counts(uuid)``: whether this process's NVML counts the GPU at all; it counts GPUs when it is
        initialised, so one that a VM held since before then is counted only once NVML is started again.
        ``release()``: a context in which this process's NVML holds no GPU (``GpuLib.released``), entered for each
        unbind from ``nvidia`` and before waiting for a GPU NVML does not count. ``unbind_timeout_s``: the deadline
        of an unbind write (:meth:`unbinding`)."""
        self.pci = pci
        self._nvml_sees = nvml_sees
        self._holders = holders
        self._nvml_counts = nvml_counts
        self._return_timeout_s = return_timeout_s
        # ``release()``: this process's NVML lets go of every GPU for a ``with`` block (``GpuLib.released``): it
        # holds each GPU's /dev/nvidia<minor> open, and the nvidia driver's unbind would wait for it forever.
        self._release = release
        self._unbind_timeout_s = unbind_timeout_s
        self._unbinding: dict[str, threading.Thread] = {}  # address → an unbind write past its deadline

    def kinds(self) -> list[StepKind]:
        return [StepKind(STEP_VFIO_BIND, self.undo, self.drift)]

    # --- prepare ------------------------------------------------------------------------------------------

    def expect(self, txn: Transaction, device: PassthroughDevice) -> None:
        """Declare one step per function of the group, GPU last (its companions must not hold the group)."""
        for address in _gpu_last(device):
            txn.expect(STEP_VFIO_BIND, device.name, self._intent(device, address))

    def _intent(self, device: PassthroughDevice, address: str) -> dict[str, Any]:
        function = self._function(address)
        previous = function.driver if function.driver != VFIO_DRIVER else None
        intent: dict[str, Any] = {"address": address, "group": device.function.iommu_group, "previousDriver": previous}
        if address == device.address and device.gpu is not None:
            intent["gpuUUID"] = device.gpu.uuid  # unprepare waits until NVML answers for it again
            intent["gpu"] = gpu_record(device.gpu)  # what a restarted driver publishes while NVML cannot see it
        return intent

    def bind(
        self, txn: Transaction, device: PassthroughDevice, *, prefer_iommufd: bool = False
    ) -> tuple[DeviceNode, ...]:
        """Move the device's IOMMU group to ``vfio-pci``; returns the device nodes its container needs: the group's
        node and ``/dev/vfio/vfio`` (the legacy backend), or, with ``prefer_iommufd`` on a node that offers IOMMUFD,
        the device's cdev and ``/dev/iommu`` (:meth:`container_nodes`)."""
        self.refuse_unusable(device)  # again: a process may have opened the GPU since the claim's check
        for address in _gpu_last(device):
            params = txn.intent(STEP_VFIO_BIND, device.name) or self._intent(device, address)
            if prefer_iommufd and address == device.address:
                params[PREFER_IOMMUFD] = True  # a CDI spec written again gives the same nodes (recorded_iommufd)
            try:
                txn.run(STEP_VFIO_BIND, device.name, {**params, "address": address}, self._to_vfio)
            except _LeftChanged as left:
                # The intent stays recorded (the step raised no DradriverError), so the claim's rollback undoes it.
                raise left.error from left
        group = device.function.iommu_group
        node = self.pci.vfio_group_node(int(group or 0))
        if not node.exists():
            raise DeviceError(
                f"{device.name}: /dev/vfio/{group} did not appear after binding IOMMU group {group} "
                f"({', '.join(device.group_members)}) to vfio-pci; a function of the group is held by another driver"
            )
        log.info("bound to vfio-pci claim=%s device=%s group=%s", txn.record.uid, device.name, group)
        return self.container_nodes(device, prefer_iommufd=prefer_iommufd)

    def container_nodes(self, device: PassthroughDevice, *, prefer_iommufd: bool) -> tuple[DeviceNode, ...]:
        """The device nodes of a bound device, as NVIDIA's driver gives them: with ``PreferIommuFD`` where the node
        has ``/dev/iommu``, the GPU's VFIO cdev ``/dev/vfio/devices/vfio<N>`` and the IOMMUFD API device
        ``/dev/iommu``; otherwise (``LegacyOnly``, the default, and what KubeVirt uses) the group's node and the
        legacy container ``/dev/vfio/vfio``. The API device is given either way: without it the other is useless."""
        if prefer_iommufd and self.pci.iommufd_enabled():
            cdev = self.pci.vfio_cdev(device.address)
            if cdev is None:
                raise DeviceError(
                    f"{device.name}: the node has /dev/iommu but GPU {device.address} has no VFIO device cdev "
                    "(sysfs vfio-dev/) on vfio-pci: the kernel lacks CONFIG_VFIO_DEVICE_CDEV; use backendPolicy "
                    "LegacyOnly"
                )
            return (DeviceNode(f"/dev/vfio/devices/{cdev}"), DeviceNode("/dev/iommu"))
        return (DeviceNode(f"/dev/vfio/{device.function.iommu_group}"), DeviceNode("/dev/vfio/vfio"))

    def refuse_unusable(self, device: PassthroughDevice) -> None:
        """Raise :class:`DeviceError` when ``device`` cannot go to ``vfio-pci`` now (no module, another driver, a
        process on the GPU, another GPU in its group); reads only. The recipe asks it of every passthrough device of
        a claim before the first bind, so a refusal of the second device does not move the first."""
        self._refuse_unbinding(device)
        vfs = self.pci.sriov_numvfs(device.address)
        if vfs > 0:
            raise DeviceError(
                f"{device.name}: GPU {device.address} has {vfs} SR-IOV virtual functions enabled (sysfs sriov_numvfs), "
                "which cannot go to a VM with it; disable them (echo 0 > /sys/bus/pci/devices/"
                f"{device.address}/sriov_numvfs, or stop the vGPU manager) and the claim is retried"
            )
        if not self.pci.vfio_module_loaded():
            raise DeviceError(
                f"{device.name}: the vfio-pci kernel module is not loaded on the node; load it (modprobe vfio-pci, "
                "and list it in /etc/modules-load.d) and the claim is retried"
            )
        try:
            others = other_displays_in_group(self.pci, self._function(device.address))
        except FileNotFoundError as err:
            raise DeviceError(f"{device.name}: a function of the IOMMU group of {device.address}: {err}") from err
        if others:
            raise DeviceError(
                f"{device.name}: the IOMMU group of GPU {device.address} holds other GPUs ({', '.join(others)}), "
                "which would leave the host with it; such a GPU is not offered for passthrough"
            )
        driver = self._function(device.address).driver
        if driver not in (None, VFIO_DRIVER, NVIDIA_DRIVER):
            raise DeviceError(f"{device.name}: GPU {device.address} is bound to {driver}, not to nvidia or vfio-pci")
        if driver == NVIDIA_DRIVER:
            self._refuse_held(device)

    def _refuse_held(self, device: PassthroughDevice) -> None:
        """Refuse while a process uses the GPU: one NVML lists (a CUDA context), or one that only holds its
        ``/dev/nvidia<minor>`` open (``nvidia-smi`` in a loop, a monitoring agent), which NVML does not list and
        whose handle makes the ``nvidia`` driver's unbind wait, not fail."""
        pids = self._holders(device.uuid) if device.uuid is not None else []
        if pids:
            raise DeviceError(
                f"{device.name}: processes {', '.join(str(p) for p in pids)} use GPU {device.address}, so it cannot "
                "leave the nvidia driver; stop them (nvidia-persistenced, DCGM, a pod not run through DRA) and the "
                "claim is retried"
            )
        minor = self.pci.live_minor(device.address)
        if minor is None and device.gpu is not None:
            minor = device.gpu.info.minor  # NVML's, where the driver's /proc does not say (stale after a re-bind)
        if minor is None:
            return
        try:
            handles = self.pci.gpu_node_holders(device.address, minor)
        except HoldersUnknown as err:
            raise DeviceError(f"{device.name}: GPU {device.address} is not moved to vfio-pci: {err}") from err
        own = _own_host_pid(self.pci)  # NVML's hold: let go, and the scan repeated counting it, for the unbind
        handles = [h for h in handles if h.pid != own]
        if handles:
            held = ", ".join(f"{h.pid} ({h.command})" for h in handles)
            nodes = ", ".join(sorted({h.node for h in handles}))
            raise DeviceError(
                f"{device.name}: processes {held} have {nodes} open, so GPU {device.address} cannot leave the nvidia "
                "driver (its unbind would wait for them); stop them (nvidia-smi, a monitoring agent, "
                "nvidia-persistenced, a display server on its /dev/dri nodes) and the claim is retried"
            )

    def _to_vfio(self, params: dict[str, Any]) -> dict[str, Any]:
        address = str(params["address"])
        function = self._function(address)
        if function.driver == VFIO_DRIVER:
            return {}
        if function.driver != NVIDIA_DRIVER:
            self._move(address, function.driver)
            return {}
        with self._release():  # this process's NVML holds the GPU open until here; counted again from here on
            self._refuse_open_now(address, params)
            self._move(address, function.driver)
        return {}

    def _move(self, address: str, driver: str | None) -> None:
        """Override, unbind (within the deadline), bind to ``vfio-pci``; a refusal puts the function back."""
        try:
            self.pci.set_driver_override(address, VFIO_DRIVER)
            if driver is not None:
                self._unbind_in_time(address, driver)
            self.pci.bind(address, VFIO_DRIVER)
        except _UnbindStuck as stuck:
            # The kernel is still in the driver's remove: nothing can be put back now. The intent stays, so the
            # claim's rollback (or start-up) gives the function back once the write has returned.
            raise _LeftChanged(DeviceError(str(stuck)), finished=stuck.finished) from stuck
        except OSError as err:
            # Nothing is left half-done: the function goes back as it was, and the step's intent is dropped.
            refusal = _refusal(address, driver, err)
            try:
                self._restore(address, driver)
            except _UnbindStuck as stuck:
                raise _LeftChanged(DeviceError(f"{refusal}; {stuck}"), finished=stuck.finished) from stuck
            except OSError as restore_err:
                # Left changed: the intent must stay so the claim's rollback (or start-up) finishes the restore.
                raise _LeftChanged(
                    DeviceError(f"{refusal}; putting it back failed too: {restore_err.strerror or restore_err}")
                ) from restore_err
            raise DeviceError(refusal) from err

    def _refuse_open_now(self, address: str, params: dict[str, Any]) -> None:
        """The open-handle scan again, with this process's NVML let go and no PID skipped: the last look before
        the unbind, which would wait for any holder."""
        minor = self.pci.live_minor(address)
        if minor is None:
            minor = _recorded_minor(params)
        if minor is None:
            return
        try:
            handles = self.pci.gpu_node_holders(address, minor)
        except HoldersUnknown as err:
            raise DeviceError(f"GPU {address} is not moved to vfio-pci: {err}") from err
        if handles:
            held = ", ".join(f"{h.pid} ({h.command}: {h.node})" for h in handles)
            raise DeviceError(
                f"processes {held} hold GPU {address} open with this driver's own NVML let go, so it cannot leave "
                "the nvidia driver (its unbind would wait for them); stop them and the claim is retried"
            )

    def _unbind_in_time(self, address: str, driver: str) -> None:
        """``unbind`` within ``unbind_timeout_s``: the write runs in a thread of its own, because the ``nvidia``
        driver's remove waits (in the kernel, holding its locks) while anything holds the GPU, and never answers
        ``EBUSY``. Past the deadline the write is left to finish, the function is marked (:meth:`unbinding`) and
        :class:`_UnbindStuck` raised, so this prepare (and the node-wide lock) goes on."""
        failures: list[OSError] = []
        late = threading.Event()  # set at the deadline: the write's result is then only logged

        def write() -> None:
            try:
                self.pci.unbind(address, driver)
            except OSError as err:
                failures.append(err)
            if late.is_set():
                _log_late_unbind(address, driver, failures)

        worker = threading.Thread(target=write, name=f"unbind {address}", daemon=True)
        worker.start()
        worker.join(self._unbind_timeout_s)
        if worker.is_alive():
            late.set()
            self._unbinding[address] = worker
            log.error("unbind has not returned; the GPU is left to it address=%s driver=%s", address, driver)
            raise _UnbindStuck(self._stuck_message(address, driver), finished=lambda: not worker.is_alive())
        if failures:
            raise failures[0]

    def _stuck_message(self, address: str, driver: str) -> str:
        if driver == VFIO_DRIVER:
            nodes = f"/dev/vfio/{self._function(address).iommu_group} /dev/vfio/devices/*"
        else:
            minor = self.pci.live_minor(address)
            nodes = f"{f'/dev/nvidia{minor}' if minor is not None else '/dev/nvidia*'} /dev/dri/*"
        return (
            f"GPU {address} is stuck leaving the {driver} driver: its unbind has not returned in "
            f"{self._unbind_timeout_s:g} s, so a process holds it open (find it on the node: "
            f"fuser -v {nodes}; dmesg shows the {driver} driver's messages about the removal). The unbind "
            "finishes once that process ends; until then no claim touches the GPU, and its claim is given back after"
        )

    def unbinding(self, address: str) -> bool:
        """Whether an unbind of ``address`` that outran its deadline is still in the kernel."""
        worker = self._unbinding.get(address)
        if worker is not None and not worker.is_alive():
            del self._unbinding[address]
            return False
        return worker is not None

    def _refuse_unbinding(self, device: PassthroughDevice) -> None:
        for address in device.group_members or (device.address,):
            if self.unbinding(address):
                raise DeviceError(
                    f"{device.name}: PCI function {address} is still leaving its driver (an unbind that outran its "
                    f"{self._unbind_timeout_s:g} s deadline): a process holds it open; stop it and the claim is "
                    "retried"
                )

    def _function(self, address: str) -> PciFunction:
        """The PCI function at ``address``; :class:`DeviceError` when sysfs has none (removed from the bus)."""
        try:
            return self.pci.function(address)
        except FileNotFoundError as err:
            raise DeviceError(
                f"PCI function {address} is not in sysfs any more ({err.strerror}): it was removed from the bus, or "
                "the host's /sys is not where the driver reads it"
            ) from err

    # --- undo ---------------------------------------------------------------------------------------------

    def undo(self, record: ClaimRecord, action: Action) -> None:
        """Give the function back to the driver it had (idempotent: looks at sysfs first)."""
        params = action.params
        address, previous = str(params["address"]), params.get("previousDriver")
        if self.unbinding(address):
            raise DeviceError(
                f"{address} is still leaving its driver (an unbind past its deadline): a process holds it open; the "
                "undo is retried once the unbind has returned"
            )
        try:
            self._restore(address, previous)
        except _UnbindStuck as stuck:
            raise DeviceError(f"giving {address} back to {previous or 'no driver'}: {stuck}") from stuck
        except OSError as err:
            raise DeviceError(
                f"giving {address} back to {previous or 'no driver'} failed: {err}; if a process holds "
                f"/dev/vfio/{params.get('group')}, stop it (the VM's launcher pod) and the undo is retried"
            ) from err
        if previous == NVIDIA_DRIVER and params.get("gpuUUID"):
            self._wait_for_nvml(address, str(params["gpuUUID"]))
        log.info("gave back from vfio-pci claim=%s address=%s driver=%s", record.uid, address, previous)

    def _restore(self, address: str, previous: str | None) -> None:
        """Clear the override and bind the function to ``previous``; its unbind within the deadline (``vfio-pci``'s
        remove waits while a VFIO user holds the device, as ``nvidia``'s does): :class:`_UnbindStuck` past it."""
        self.pci.set_driver_override(address, None)
        driver = self.pci.function(address).driver
        if driver == previous:
            return
        if driver is not None:
            self._unbind_in_time(address, driver)
        if previous is not None:
            self.pci.bind(address, previous)

    def _wait_for_nvml(self, address: str, uuid: str) -> None:
        if not self._nvml_counts(uuid):
            with self._release():
                pass  # NVML started again counts the node's GPUs anew: this one too, once the driver has it
        if not self._nvml_counts(uuid):
            # Waiting would time out at every retry of the unprepare: the GPU is back, NVML here cannot tell.
            log.warning(
                "GPU given back to nvidia, but this driver's NVML counted the node's GPUs while a VM held it, so it "
                "is not offered whole until the plugin restarts address=%s uuid=%s",
                address,
                uuid,
            )
            return
        deadline = time.monotonic() + self._return_timeout_s
        while not self._nvml_sees(uuid):
            if time.monotonic() >= deadline:
                raise DeviceError(
                    f"GPU {address} is bound to nvidia again but NVML has not seen it for "
                    f"{self._return_timeout_s:.0f} s; check dmesg for NVRM errors (a reset may be needed)"
                )
            time.sleep(NVML_POLL_S)

    # --- drift ----------------------------------------------------------------------------------------------

    def drift(self, _record: ClaimRecord, action: Action) -> str | None:
        address = str(action.params["address"])
        try:
            driver = self.pci.function(address).driver
        except FileNotFoundError:
            return f"PCI function {address} is not in sysfs any more"
        return None if driver == VFIO_DRIVER else f"PCI function {address} is bound to {driver or 'no driver'}"


def without_passthrough_losses(inventory: Inventory, pci: HostPci | None) -> Inventory:
    """``inventory`` less the GPUs it counts as lost because they are bound to ``vfio-pci`` (NVML cannot see a GPU
    a VM holds): health monitoring must not report them lost, nor taint them when they come back. That holds too
    for a GPU this process's NVML never read (bound to ``vfio-pci`` before the driver started), known by its index
    alone: NVML's order places it (:func:`unread_addresses`)."""
    if pci is None or not inventory.lost_gpus:
        return inventory
    functions = pci.gpus()
    passed = {f.address for f in functions if f.driver == VFIO_DRIVER}
    passed_names = {gpu_name(a) for a in passed}
    unread = unread_addresses(inventory, [f.address for f in functions])
    kept = tuple(
        g
        for g in inventory.lost_gpus
        if not (g.name in passed_names or (g.name is None and unread.get(g.index) in passed))
    )
    return inventory if len(kept) == len(inventory.lost_gpus) else replace(inventory, lost_gpus=kept)


def unread_addresses(inventory: Inventory, addresses: Sequence[str]) -> dict[int, str]:
    """The PCI address of each GPU NVML counts but could not read even once (a lost GPU known by its index alone),
    by index, where NVML's order tells it: NVML numbers GPUs by PCI address, so a run of unread indices lies between
    the addresses of the GPUs read just before and after it, and is those GPUs of ``addresses`` (sysfs) when as
    many lie there. Where the count differs (NVML does not count a GPU that was on ``vfio-pci`` when it started)
    the run is left out: it is not told apart from a lost GPU."""
    by_name = {gpu_name(a): a for a in addresses}
    known = {g.info.index: g.info.pci_bus_id for g in inventory.gpus}
    known.update({g.index: by_name[g.name] for g in inventory.lost_gpus if g.name in by_name})
    unread = sorted(g.index for g in inventory.lost_gpus if g.name is None)
    found: dict[int, str] = {}
    counted = len(inventory.gpus) + len(inventory.lost_gpus)
    for run in _consecutive_runs(unread):
        low = known.get(run[0] - 1) if run[0] > 0 else ""
        high = known.get(run[-1] + 1) if run[-1] + 1 < counted else "~"  # "~" sorts after every address
        if low is None or high is None:
            continue  # a neighbour whose address is not known: the run cannot be placed
        between = [a for a in sorted(addresses) if low < a < high and a not in known.values()]
        if len(between) == len(run):
            found.update(zip(run, between, strict=True))
    return found


def _consecutive_runs(indices: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def gpu_record(gpu: GpuDevice) -> dict[str, Any]:
    """What NVML said of ``gpu``, as a ``vfio-bind`` intent keeps it (JSON); :func:`recorded_gpus` reads it back."""
    return {"name": gpu.name, "nvlinkDomain": gpu.nvlink_domain, "info": asdict(gpu.info)}


def recorded_gpus(records: Iterable[ClaimRecord]) -> dict[str, GpuDevice]:
    """The GPUs the ``vfio-bind`` steps of ``records`` describe, by PCI address (a record written before the
    description was kept, or one that does not parse, describes none)."""
    found: dict[str, GpuDevice] = {}
    for record in records:
        for action in record.actions:
            raw = action.params.get("gpu") if action.step == STEP_VFIO_BIND else None
            gpu = _gpu_from_record(raw) if isinstance(raw, dict) else None
            if gpu is not None:
                found[gpu.info.pci_bus_id] = gpu
    return found


def recorded_iommufd(record: ClaimRecord, device: str) -> bool:
    """Whether ``record``'s claim got ``device`` with ``PreferIommuFD`` (its ``vfio-bind`` steps say so; a record
    written before the choice was kept says legacy, which is what such a claim got)."""
    return any(
        a.step == STEP_VFIO_BIND and a.device == device and a.params.get(PREFER_IOMMUFD) is True for a in record.actions
    )


def _gpu_from_record(raw: dict[str, Any]) -> GpuDevice | None:
    try:
        fields = dict(raw["info"])
        fields["cuda_compute_capability"] = tuple(fields["cuda_compute_capability"])
        info = GpuInfo(**fields)
        return GpuDevice(str(raw["name"]), info, str(raw["nvlinkDomain"]), mig_enabled=False, mig_profiles=())
    except (KeyError, TypeError, ValueError):
        return None


def nvml_holders(gpulib: GpuLib) -> Callable[[str], list[int]]:
    """The PIDs NVML shows on a GPU (none when NVML cannot say)."""

    def holders(uuid: str) -> list[int]:
        try:
            return [p.pid for p in gpulib.usage(uuid).processes]
        except NvmlReleased:
            raise  # NVML let go for another GPU's unbind still under way: refused (and retried), not "none"
        except GpuError:
            return []

    return holders


def nvml_counts(gpulib: GpuLib) -> Callable[[str], bool]:
    """Whether this process's NVML counts a GPU (by UUID) at all: ``NotFound`` says it was not there when NVML was
    initialised (a lost GPU it counted answers ``GpuIsLost``)."""

    def counts(uuid: str) -> bool:
        try:
            gpulib.probe(uuid)
        except NotFound:
            return False
        except GpuError:
            return True
        return True

    return counts


def nvml_sees(gpulib: GpuLib) -> Callable[[str], bool]:
    """Whether NVML answers for a GPU (by UUID) now: asked after giving it back to ``nvidia``."""

    def sees(uuid: str) -> bool:
        try:
            gpulib.probe(uuid)
        except GpuError:
            return False
        return True

    return sees


class _UnbindStuck(Exception):
    """An unbind write past its deadline (:meth:`PassthroughSteps._unbind_in_time`); the text says what to do.
    ``finished()``: whether the write has returned since."""

    def __init__(self, message: str, *, finished: Callable[[], bool]) -> None:
        super().__init__(message)
        self.finished = finished


def _log_late_unbind(address: str, driver: str, failures: Sequence[OSError]) -> None:
    """What an unbind that outran its deadline did in the end (its claim failed long before)."""
    if failures:
        log.error("late unbind failed address=%s driver=%s error=%s", address, driver, failures[0])
    else:
        log.info("late unbind returned: the function left its driver address=%s driver=%s", address, driver)


def _own_host_pid(pci: HostPci) -> int | None:
    """This process's PID as the host's ``/proc`` numbers it (its ``self`` link); None where it has none."""
    try:
        return int(os.readlink(pci.root / "proc/self"))
    except (OSError, ValueError):
        return None


def _recorded_minor(params: dict[str, Any]) -> int | None:
    """The GPU's ``/dev/nvidia`` minor as NVML said it (the intent's ``gpu`` record), if recorded."""
    gpu = params.get("gpu")
    minor = gpu.get("info", {}).get("minor") if isinstance(gpu, dict) else None
    return minor if isinstance(minor, int) else None


class _LeftChanged(StillChanging):
    """A ``vfio-bind`` change that failed and could not be put back: not a DradriverError, so ``Transaction.run``
    keeps its intent; :meth:`PassthroughSteps.bind` raises ``error`` in its place. ``finished()``: whether the
    kernel is done with it (false while an unbind past its deadline is in the kernel: NVML is not started again
    meanwhile, see ``GpuLib.released``)."""

    def __init__(self, error: DeviceError, *, finished: Callable[[], bool] = lambda: True) -> None:
        super().__init__(str(error), finished=finished)
        self.error = error


def other_displays_in_group(pci: HostPci, function: PciFunction) -> list[str]:
    """The display-class functions (GPUs, of any vendor) of ``function``'s IOMMU group other than itself: binding
    the group to vfio-pci would take them from the host, and a second claim on one would get the same group, so a
    GPU with any is not offered for passthrough."""
    if function.iommu_group is None:
        return []
    return [
        a
        for a in pci.group_members(function.iommu_group)
        if a != function.address and pci.function(a).pci_class.startswith(DISPLAY_CLASS_PREFIX)
    ]


def _gpu_last(device: PassthroughDevice) -> Iterable[str]:
    return [*(a for a in device.group_members if a != device.address), device.address]


def _refusal(address: str, driver: str | None, err: OSError) -> str:
    if driver == NVIDIA_DRIVER and err.errno == 16:  # EBUSY
        return (
            f"GPU {address} cannot leave the nvidia driver: a process has it open ({err.strerror}); stop it "
            "(nvidia-persistenced, DCGM, a pod not run through DRA) and the claim is retried"
        )
    return f"moving {address} from {driver or 'no driver'} to vfio-pci failed: {err.strerror or err}"
