"""VFIO passthrough: a whole GPU handed to a virtual machine (KubeVirt) through ``vfio-pci``.

With ``--passthrough`` every GPU is offered a second time as a passthrough device (``<gpu>-vfio``, attribute
``type`` ``vfio``, DeviceClass ``vfio.gpu.dradriver.dev``). Its prepare moves every PCI function of the GPU's
IOMMU group from its kernel driver to ``vfio-pci``, as the kernel requires of a group given to a VM, one recorded
step (``vfio-bind``) per function:

1. ``driver_override`` = ``vfio-pci`` (so no other driver takes the function meanwhile);
2. unbind from its driver (``nvidia`` for the GPU: refused while a process has the GPU open);
3. bind to ``vfio-pci``.

The container then gets ``/dev/vfio/<group>`` and ``/dev/vfio/vfio`` through CDI, the PCI address in the device
metadata (KEP-5304) and in ``PCI_RESOURCE_GPU_DRADRIVER_DEV_VFIO`` (KubeVirt's variable for a DRA-allocated host
device; see docs/passthrough.md).

The undo clears the override, unbinds from ``vfio-pci`` and binds the function back to the driver it had, then
waits until NVML sees the GPU again. Each step's intent is in the checkpoint before sysfs is touched, and the
undo looks at what sysfs shows (override set or not, bound to ``vfio-pci``, to nothing, or back already), so a
kill between any two writes is repaired by start-up reconciliation replaying the undo.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from dradriver.driver.prepare.checkpoint import Action, ClaimRecord
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.errors import DeviceError
from dradriver.gpu.errors import GpuError
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, Inventory, gpu_name
from dradriver.gpu.models import DeviceNode
from dradriver.gpu.products import load_products
from dradriver.nvidia_install.pci_binding import (
    DISPLAY_CLASS_PREFIX,
    NVIDIA_DRIVER,
    VFIO_DRIVER,
    HostPci,
    PciFunction,
)

log = logging.getLogger(__name__)

STEP_VFIO_BIND = "vfio-bind"
VFIO_TYPE = "vfio"
NAME_SUFFIX = "-vfio"
#: How long unprepare waits for NVML to see a GPU given back to ``nvidia`` (the driver initialises it first).
NVML_RETURN_TIMEOUT_S = 30.0
NVML_POLL_S = 0.1


@dataclass(frozen=True)
class PassthroughDevice:
    """A GPU offered for VFIO passthrough: what sysfs shows of it, with what NVML last said (None while the GPU is
    bound to ``vfio-pci``, where NVML cannot see it, and was not seen before by this process)."""

    name: str
    function: PciFunction
    group_members: tuple[str, ...]  # the functions of its IOMMU group that go to the VM (bridges stay), itself too
    gpu: GpuDevice | None

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

    def devices(self, inventory: Inventory) -> list[PassthroughDevice]:
        """Every NVIDIA GPU function in an IOMMU group, bound to ``nvidia`` or ``vfio-pci``; none where the IOMMU
        is off (nothing could be passed through)."""
        for gpu in inventory.gpus:
            self._seen[gpu.info.pci_bus_id] = gpu
        if not self.pci.iommu_enabled():
            return []
        found = []
        for function in self.pci.gpus():
            if function.iommu_group is None or function.driver not in (NVIDIA_DRIVER, VFIO_DRIVER):
                continue
            others = other_displays_in_group(self.pci, function)
            if others:
                self._tell_shared(function.address, others)
                continue
            known = self._seen.get(function.address)
            name = passthrough_name(known.name if known is not None else gpu_name(function.address))
            members = tuple(
                a for a in self.pci.group_members(function.iommu_group) if not self.pci.function(a).is_bridge
            )
            found.append(PassthroughDevice(name, function, members, known))
        return found

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

    def refresh(self, inventory: Inventory) -> list[PassthroughGpu]:
        """Read sysfs again; the devices a claim can be prepared with (those whose GPU NVML has described)."""
        self._devices = self.catalog.devices(inventory)
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
        return_timeout_s: float = NVML_RETURN_TIMEOUT_S,
    ) -> None:
        """``holders(uuid)``: the PIDs NVML shows on the GPU. They are asked before the unbind, because the real
        ``nvidia`` driver does not refuse an unbind while a process has the GPU open: it waits for it."""
        self.pci = pci
        self._nvml_sees = nvml_sees
        self._holders = holders
        self._return_timeout_s = return_timeout_s

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
        if address == device.address and device.uuid is not None:
            intent["gpuUUID"] = device.uuid  # unprepare waits until NVML answers for it again
        return intent

    def bind(self, txn: Transaction, device: PassthroughDevice) -> tuple[DeviceNode, ...]:
        """Move the device's IOMMU group to ``vfio-pci``; returns the device nodes its container needs."""
        self.refuse_unusable(device)  # again: a process may have opened the GPU since the claim's check
        for address in _gpu_last(device):
            params = txn.intent(STEP_VFIO_BIND, device.name) or self._intent(device, address)
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
        return (DeviceNode(f"/dev/vfio/{group}"), DeviceNode("/dev/vfio/vfio"))

    def refuse_unusable(self, device: PassthroughDevice) -> None:
        """Raise :class:`DeviceError` when ``device`` cannot go to ``vfio-pci`` now (no module, another driver, a
        process on the GPU, another GPU in its group); reads only. The recipe asks it of every passthrough device of
        a claim before the first bind, so a refusal of the second device does not move the first."""
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
        pids = self._holders(device.uuid) if device.uuid is not None and driver == NVIDIA_DRIVER else []
        if pids:
            raise DeviceError(
                f"{device.name}: processes {', '.join(str(p) for p in pids)} use GPU {device.address}, so it cannot "
                "leave the nvidia driver; stop them (nvidia-persistenced, DCGM, a pod not run through DRA) and the "
                "claim is retried"
            )

    def _to_vfio(self, params: dict[str, Any]) -> dict[str, Any]:
        address = str(params["address"])
        function = self._function(address)
        if function.driver == VFIO_DRIVER:
            return {}
        try:
            self.pci.set_driver_override(address, VFIO_DRIVER)
            if function.driver is not None:
                self.pci.unbind(address, function.driver)
            self.pci.bind(address, VFIO_DRIVER)
        except OSError as err:
            # Nothing is left half-done: the function goes back as it was, and the step's intent is dropped.
            refusal = _refusal(address, function.driver, err)
            try:
                self._restore(address, function.driver)
            except OSError as restore_err:
                # Left changed: the intent must stay so the claim's rollback (or start-up) finishes the restore.
                raise _LeftChanged(
                    DeviceError(f"{refusal}; putting it back failed too: {restore_err.strerror or restore_err}")
                ) from restore_err
            raise DeviceError(refusal) from err
        return {}

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
        try:
            self._restore(address, previous)
        except OSError as err:
            raise DeviceError(
                f"giving {address} back to {previous or 'no driver'} failed: {err}; if a process holds "
                f"/dev/vfio/{params.get('group')}, stop it (the VM's launcher pod) and the undo is retried"
            ) from err
        if previous == NVIDIA_DRIVER and params.get("gpuUUID"):
            self._wait_for_nvml(address, str(params["gpuUUID"]))
        log.info("gave back from vfio-pci claim=%s address=%s driver=%s", record.uid, address, previous)

    def _restore(self, address: str, previous: str | None) -> None:
        self.pci.set_driver_override(address, None)
        driver = self.pci.function(address).driver
        if driver == previous:
            return
        if driver is not None:
            self.pci.unbind(address, driver)
        if previous is not None:
            self.pci.bind(address, previous)

    def _wait_for_nvml(self, address: str, uuid: str) -> None:
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
    a VM holds): health monitoring must not report them lost, nor taint them when they come back."""
    if pci is None or not inventory.lost_gpus:
        return inventory
    passed = {gpu_name(f.address) for f in pci.gpus() if f.driver == VFIO_DRIVER}
    kept = tuple(g for g in inventory.lost_gpus if g.name not in passed)
    return inventory if len(kept) == len(inventory.lost_gpus) else replace(inventory, lost_gpus=kept)


def nvml_holders(gpulib: GpuLib) -> Callable[[str], list[int]]:
    """The PIDs NVML shows on a GPU (none when NVML cannot say)."""

    def holders(uuid: str) -> list[int]:
        try:
            return [p.pid for p in gpulib.usage(uuid).processes]
        except GpuError:
            return []

    return holders


def nvml_sees(gpulib: GpuLib) -> Callable[[str], bool]:
    """Whether NVML answers for a GPU (by UUID) now: asked after giving it back to ``nvidia``."""

    def sees(uuid: str) -> bool:
        try:
            gpulib.probe(uuid)
        except GpuError:
            return False
        return True

    return sees


class _LeftChanged(Exception):
    """A ``vfio-bind`` change that failed and could not be put back: not a DradriverError, so ``Transaction.run``
    keeps its intent; :meth:`PassthroughSteps.bind` raises ``error`` in its place."""

    def __init__(self, error: DeviceError) -> None:
        super().__init__(str(error))
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
