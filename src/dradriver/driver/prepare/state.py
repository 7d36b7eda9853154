"""The GPU driver behind the kubelet plugin: prepare and unprepare claims for this node's GPUs.

``prepare`` reads as its recipe: return what the checkpoint records for a claim already prepared; resolve the
allocated devices; refuse any that overlaps another claim's (the checkpoint is the only record of what is
prepared); record the claim as PrepareStarted; carve MIG (dynamic mode); write the CDI spec; record it as
PrepareCompleted. Every change is a step of a :class:`~dradriver.driver.prepare.transaction.Transaction`: checkpointed
before and after, undone in reverse when a later step fails, and undone at start-up after a crash
(:mod:`~dradriver.driver.prepare.reconcile`). The step kinds live beside their apply, undo and drift check
(:mod:`~dradriver.driver.prepare.steps` lists them).

Locks follow the hardware: the plugin layer serialises each claim's lifecycle; here one lock per GPU covers
the changes to that GPU (MIG layout), and one short lock inside the checkpoint covers the overlap check. No
lock is held around NVML calls for unrelated GPUs, so claims on different GPUs prepare in parallel.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dradriver.driver.prepare.cdi_step import STEP_CDI_SPEC, CdiSpecStep, ReadyDevice, build_claim_spec
from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from dradriver.driver.prepare.mig import STEP_MIG_MODE, MigSteps
from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.partitions import FabricPartitions
from dradriver.driver.prepare.reconcile import ClaimExists, reconcile
from dradriver.driver.prepare.sharing import (
    CONFIG_FIELD,
    CONSUMED_FIELD,
    SHARE_IDS_FIELD,
    SharingSteps,
    check_mps_settings,
    consumed_total,
    refuse_conflicts,
    share_config,
)
from dradriver.driver.prepare.steps import step_kinds
from dradriver.driver.prepare.transaction import StepFailed, Transaction, crash_point
from dradriver.driver.prepare.vfio import (
    STEP_VFIO_BIND,
    Passthrough,
    PassthroughDevice,
    PassthroughGpu,
    PassthroughSteps,
    passthrough_env,
    prefers_iommufd,
    recorded_iommufd,
)
from dradriver.errors import ClaimError, DeviceError, DradriverError
from dradriver.gpu.fabric_manager import FabricManager
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, Inventory, MigMode, MigPartition
from dradriver.gpu.models import DeviceNode, MigDevice
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.device_nodes import gpu_device_nodes
from dradriver.plugin.handler import (
    AllocatedClaim,
    AllocatedDevice,
    ClaimConsumer,
    ClaimRef,
    DeviceToleration,
    PreparedDevice,
    PrepareResult,
)

if TYPE_CHECKING:
    from dradriver.driver.prepare.config import AnyConfig

log = logging.getLogger(__name__)

# Why a device must not go to a new claim (cause and time), given the tolerations its allocation carries.
DeviceProblem = Callable[[str, Sequence[DeviceToleration]], str | None]


@dataclass(frozen=True)
class PlannedDevice:
    """An allocated device resolved to this node's hardware, with the requests it serves."""

    device: GpuDevice | MigPartition
    requests: tuple[str, ...]
    admin_access: bool
    config: dict[str, Any] | None = None  # the resolved opaque config (GpuConfig / MigDeviceConfig), if any
    share_ids: tuple[str, ...] = ()  # consumable shares (KEP-5075) of a multi-allocatable GPU
    consumed: tuple[tuple[str, str], ...] = ()  # what the shares consume, summed: capacity name → quantity
    prefer_iommufd: bool = False  # a passthrough device whose VfioDeviceConfig asks for PreferIommuFD

    @property
    def gpu(self) -> GpuDevice:
        if isinstance(self.device, PassthroughGpu):
            return self.device.whole  # a claim on the GPU or any part of it excludes its passthrough device
        return self.device if isinstance(self.device, GpuDevice) else self.device.parent


# Whether the cluster no longer allocates ``device`` to the claim ``holder`` (deleted, replaced or deallocated).
HolderReleased = Callable[[ClaimRef, str], bool]
# The most earlier claims one prepare releases (one per refused device): a bound, so a cluster that keeps
# answering "released" cannot make a prepare loop forever.
MAX_RELEASES = 32


class DeviceInUse(ClaimError):
    """A device of the claim is prepared for another claim (``holder``), which holds it as ``device``."""

    def __init__(self, message: str, *, holder: ClaimRef, device: str) -> None:
        super().__init__(message)
        self.holder = holder
        self.device = device


@dataclass(frozen=True, kw_only=True)
class NodeFeatures:
    """The opt-in hardware features a driver runs with (None: off): ``passthrough`` (``--passthrough``) offers every
    GPU for VFIO passthrough too (:mod:`~dradriver.driver.prepare.vfio`); ``fabric_manager``
    (``--fabric-manager-partitions``) activates the NVSwitch partition of a claim's whole GPUs
    (:mod:`~dradriver.driver.prepare.partitions`)."""

    passthrough: Passthrough | None = None
    fabric_manager: FabricManager | None = None


@dataclass(frozen=True, kw_only=True)
class GpuDriverOptions:
    """Whose devices a :class:`GpuDriver` prepares: the driver name and pool (this node) the allocations name,
    how MIG is published, ``consumable_shares`` (--consumable-shares: a share's config chooses how it is kept
    apart, sharing.share_config) and the opt-in hardware ``features``."""

    driver_name: str
    pool: str
    mig_mode: MigMode
    consumable_shares: str | None = None
    features: NodeFeatures = field(default_factory=NodeFeatures)


class GpuDriver:
    """Implements the plugin layer's ``DriverHandler`` for NVIDIA GPUs.

    ``options`` say whose devices (:class:`GpuDriverOptions`); the rest are the parts it works with. ``gpulib`` is
    needed for dynamic MIG (carving at prepare); ``checkpoint`` defaults to one kept in memory; ``mps`` runs the
    claims' MPS daemons.
    """

    def __init__(
        self,
        options: GpuDriverOptions,
        *,
        inventory: Inventory,
        cdi: CdiWriter,
        gpulib: GpuLib | None = None,
        checkpoint: CheckpointStore | None = None,
        mps: MpsControl | None = None,
        device_problem: DeviceProblem | None = None,
        holder_released: HolderReleased | None = None,
    ) -> None:
        """``device_problem`` says why a device must not be given to a new claim (its health: cause and time),
        or None when it may; consulted for each device of a claim that is not prepared yet (a claim prepared
        before its device turned unhealthy is returned as recorded: its pod learns of the fault from the health
        stream). ``holder_released`` says whether the cluster no longer allocates a device to the claim
        prepared with it (so a new claim may take it over)."""
        passthrough, fabric_manager = options.features.passthrough, options.features.fabric_manager
        self.driver_name = options.driver_name
        self.pool = options.pool
        self.cdi = cdi
        self.mig_mode = options.mig_mode
        self.gpulib = gpulib
        self.checkpoint = checkpoint if checkpoint is not None else CheckpointStore()
        self._device_problem = device_problem
        self.consumable_shares = options.consumable_shares
        self._holder_released = holder_released
        self.mig = MigSteps(gpulib) if gpulib is not None else None
        self.sharing = SharingSteps(gpulib, self.checkpoint, mps)
        self.cdi_step = CdiSpecStep(cdi)
        self.passthrough = passthrough
        self.partitions = (
            FabricPartitions(fabric_manager, self.checkpoint, domain=options.driver_name)
            if fabric_manager is not None
            else None
        )
        self.step_kinds = step_kinds(
            cdi=self.cdi_step,
            sharing=self.sharing,
            mig=self.mig,
            vfio=passthrough.steps if passthrough else None,
            partitions=self.partitions,
        )
        self._lock = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._devices: dict[str, GpuDevice | MigPartition] = {}
        self._gpus: tuple[GpuDevice, ...] = ()
        self._on_passthrough_moved: list[Callable[[], None]] = []
        self.update_inventory(inventory, options.mig_mode)

    def on_passthrough_moved(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after a prepare moved a GPU to vfio-pci or an unprepare gave it back: NVML lost or
        sees the GPU again, so a rescan republishes it (whole, with its MIG devices, or not) at once instead of at
        the next interval."""
        self._on_passthrough_moved.append(callback)

    def _passthrough_moved(self, record: ClaimRecord) -> None:
        if any(a.step == STEP_VFIO_BIND for a in record.actions):
            for callback in self._on_passthrough_moved:
                callback()

    def gpus(self) -> tuple[GpuDevice, ...]:
        """This node's GPUs, as the last inventory showed them."""
        with self._lock:
            return self._gpus

    def update_inventory(self, inventory: Inventory, mig_mode: MigMode) -> None:
        """Use a fresh inventory (after rediscovery) for later prepares; ``FabricManagerError``, nothing changed,
        when NVML's module id of a GPU disagrees with Fabric Manager's partitions (so a driver refuses to start)."""
        if self.partitions is not None:
            self.partitions.check_gpus(g.info for g in inventory.gpus)
        devices = {d.name: d for d in inventory.devices(mig_mode)}
        if self.passthrough is not None:
            devices.update({d.name: d for d in self.passthrough.refresh(inventory, self.checkpoint.records())})
        with self._lock:
            self._devices = devices
            self._gpus = inventory.gpus

    # --- DriverHandler ------------------------------------------------------------------------------------

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            try:
                results[claim.uid] = PrepareResult(devices=self.prepare(claim))
            except DradriverError as err:
                log.warning("prepare failed claim=%s error=%s", claim.uid, err)
                results[claim.uid] = PrepareResult(error=str(err))
        return results

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        results: dict[str, str | None] = {}
        for ref in claims:
            try:
                self.unprepare(ref)
                results[ref.uid] = None
            except DradriverError as err:
                log.warning("unprepare failed claim=%s error=%s", ref.uid, err)
                results[ref.uid] = str(err)
        return results

    # --- the recipe ---------------------------------------------------------------------------------------

    def prepare(self, claim: AllocatedClaim) -> tuple[PreparedDevice, ...]:
        """Prepare one claim: all of its devices or, on any error, none (everything done is undone).

        A device still prepared for another claim is refused, unless ``holder_released`` says the cluster no
        longer allocates it to that claim: the kubelet removes a pod from the API server first and calls
        NodeUnprepareResources for its claims seconds later, so the scheduler can give the device to a new claim
        in between. That claim is then unprepared here (its pod's containers are gone) and the prepare goes on;
        the kubelet's own unprepare of it later finds nothing to do."""
        for _ in range(MAX_RELEASES):
            try:
                return self._prepare(claim)
            except DeviceInUse as err:
                if self._holder_released is None or not self._holder_released(err.holder, err.device):
                    raise
                log.info(
                    "releasing a device the cluster gave to another claim: unpreparing its earlier claim now, "
                    "before the kubelet does claim=%s device=%s earlier=%s",
                    claim.ref.uid,
                    err.device,
                    err.holder.uid,
                )
                try:
                    self.unprepare(err.holder)
                except DradriverError as undo:
                    raise DeviceError(
                        f"claim {claim.ref}: releasing device {err.device} from earlier claim {err.holder}: {undo}"
                    ) from undo
        return self._prepare(claim)

    def _prepare(self, claim: AllocatedClaim) -> tuple[PreparedDevice, ...]:
        ref = claim.ref
        earlier = self.checkpoint.get(ref.uid)
        if earlier is not None and earlier.state is ClaimState.PREPARE_COMPLETED and earlier.rollback_error is None:
            return self._prepared_already(claim, earlier)
        if earlier is not None:
            self._finish_earlier(ref, earlier)
        planned = self._plan(claim)
        record = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=[_device_record(p) for p in planned],
            reserved_for=list(claim.consumers),
        )
        txn = Transaction(record, self.checkpoint, self.step_kinds)
        # The GPUs' locks are held from before the intents are made (a compute mode to restore is read from the
        # device) until the claim is recorded complete or rolled back.
        with self._hold_gpus(sorted({p.gpu.name for p in planned})):
            self._record_intents(ref, txn, planned)
            self._apply(txn, planned)
        log.info(
            "prepared claim=%s name=%s/%s devices=%s",
            ref.uid,
            ref.namespace,
            ref.name,
            ",".join(d.name for d in record.devices),
        )
        self._passthrough_moved(record)
        return self._reported(record)

    def _prepared_already(self, claim: AllocatedClaim, earlier: ClaimRecord) -> tuple[PreparedDevice, ...]:
        """A kubelet retry of a claim prepared and recorded complete: what was recorded, with the CDI spec and MPS
        daemon it needs brought back if they went, and whom it is reserved for now."""
        uid = claim.ref.uid
        if self.cdi_step.spec_missing(earlier):
            # Cleaned or changed CDI directory: a pod (re)starting its containers needs the spec.
            log.warning("re-writing the missing CDI spec of a prepared claim claim=%s", uid)
            self.rewrite_spec(earlier)
        self._ensure_mps(uid)  # a kubelet retry finds the claim's MPS daemon serving
        self.note_consumers(uid, claim.consumers)
        return self._reported(self.checkpoint.get(uid) or earlier)

    def _finish_earlier(self, ref: ClaimRef, earlier: ClaimRecord) -> None:
        """Take back what an earlier attempt on the claim left, so that it is prepared afresh."""
        if earlier.state is ClaimState.PREPARE_COMPLETED:
            # An unprepare failed half way: what is recorded is no longer what the hardware has, so the claim must
            # not be answered from the record. Finish the undo, then prepare afresh.
            log.info("finishing an earlier unprepare that did not complete claim=%s", ref.uid)
            self.unprepare(ref)
        else:
            log.info("finishing an earlier prepare that did not complete: rolling it back claim=%s", ref.uid)
            self.roll_back(earlier, reason="an earlier prepare did not complete")

    def _record_intents(self, ref: ClaimRef, txn: Transaction, planned: Sequence[PlannedDevice]) -> None:
        """The intent of every step, recorded with the claim before the first change (the caller holds the GPUs'
        locks); refused when a device is another claim's or the claim's configs conflict."""
        if self.partitions is not None:
            # Declared first, as it is activated first: the undo (in the record's reverse order) gives the GPUs back
            # to their drivers before it deactivates their partition.
            self.partitions.expect(txn, str(ref), _whole_gpus(planned))
        for plan in planned:
            self._expect_ready(txn, plan)
        self.sharing.expect(txn, {p.device.name: self._known_target(p) for p in planned})
        self.cdi_step.expect(txn)
        record = txn.record
        # One write records the claim and the intent of every step before the first change. A claim whose only
        # change is its CDI spec needs none: start-up removes a spec the checkpoint does not know.
        durable = any(a.step != STEP_CDI_SPEC for a in record.actions)
        self.checkpoint.insert_checked(
            record, lambda others: _refuse_overlap_and_conflicts(ref, record, others), durable=durable
        )

    def _apply(self, txn: Transaction, planned: Sequence[PlannedDevice]) -> None:
        """Make the devices ready, share them, write the CDI spec, and record the claim complete; on a failure,
        roll back what was done and raise the claim's error."""
        record = txn.record
        try:
            crash_point("prepare-started")
            self._refuse_unusable(planned)
            if self.partitions is not None:
                # Before the devices are made ready, as NVIDIA's driver does: a GPU goes to vfio-pci inside its
                # activated partition, and the undo (in reverse) gives it back to nvidia before deactivating.
                self.partitions.activate(txn)
            ready = [self._make_ready(txn, p) for p in planned]
            for device in record.devices:
                self.sharing.apply_device(txn, device)
            self.sharing.apply_mps(txn)
            ready = [self._with_sharing(txn.record, r) for r in ready]
            self.cdi_step.apply(txn, ready)
            crash_point("prepare-completing")
            record.state = ClaimState.PREPARE_COMPLETED
            self.checkpoint.put(record)  # if this write fails (a full disk), the claim is rolled back
        except DradriverError as err:
            record.state = ClaimState.PREPARE_STARTED
            raise self._failed(txn, err) from err

    def note_consumers(self, uid: str, consumers: Sequence[ClaimConsumer]) -> None:
        """Record who a prepared claim is reserved for now, as the API server says (a shared claim's next pod
        prepares it again; the periodic re-check). The caller holds the claim's lock; the record is read again
        under its GPUs' locks, as the MPS check writes it under them (a restarted daemon's pid must not go back)."""
        record = self.checkpoint.get(uid)
        if not consumers or record is None:
            return
        with self._hold_gpus(sorted({d.gpu for d in record.devices})):
            record = self.checkpoint.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                return
            if list(consumers) != record.reserved_for:
                record.reserved_for = list(consumers)
                try:
                    self.checkpoint.put(record)
                except DradriverError as err:  # only the metrics' pod names are out of date
                    log.warning("cannot record the pods of a prepared claim claim=%s error=%s", record, err)

    def unprepare(self, ref: ClaimRef) -> None:
        """Undo prepare: destroy exactly what this claim created, remove its CDI spec, forget it.

        A claim never prepared here is already done. MIG mode stays as it is (see ``driver/prepare/mig.py``)."""
        record = self.checkpoint.get(ref.uid)
        if record is None:
            self.cdi.remove(ref.uid)  # a spec without a record can only be a leftover
            return
        moved = replace(record, actions=list(record.actions))  # before the undo empties them
        self.roll_back(record, reason="unprepare", keep_mig_mode=True)
        log.info("unprepared claim=%s", ref.uid)
        self._passthrough_moved(moved)

    def roll_back(self, record: ClaimRecord, *, reason: str, keep_mig_mode: bool = False) -> None:
        """Undo what ``record`` did; ``keep_mig_mode``: leave the MIG mode of a claim that completed as it is."""
        with self._hold_gpus(sorted({d.gpu for d in record.devices})):
            # Read again under the GPUs' locks (as _ensure_mps does): a daemon restarted since the first read has a
            # new pid, and a failed rollback writes back the copy it worked from.
            current = self.checkpoint.get(record.uid)
            if current is None:
                return  # finished meanwhile
            keep_mode = keep_mig_mode and current.state is ClaimState.PREPARE_COMPLETED
            txn = Transaction(current, self.checkpoint, self.step_kinds)
            error = txn.rollback(skip=lambda a: keep_mode and a.step == STEP_MIG_MODE)
            if error is None:
                # Forgotten before the locks go: the MPS check (which takes them too) must not find the record
                # still complete and start the daemon this undo just stopped.
                self.checkpoint.remove(record.uid)
        if error is not None:
            raise DeviceError(
                f"claim {record}: {reason}: {error}; the rest is recorded in the checkpoint and retried by the "
                "next unprepare or at start-up"
            )

    def _failed(self, txn: Transaction, err: DradriverError) -> ClaimError:
        """Roll the claim back after ``err`` (the caller holds its GPUs' locks); the error for the kubelet names
        device, step and cause."""
        record = txn.record
        rollback_error = txn.rollback()
        if rollback_error is None:
            self.checkpoint.remove(record.uid)
            outcome = "everything done for the claim was undone"
        else:
            outcome = (
                f"undoing it failed too ({rollback_error}); the rest is recorded in the checkpoint and "
                "finished at the next prepare or start-up"
            )
        where = f" at {err}" if isinstance(err, StepFailed) else f": {err}"
        return ClaimError(f"claim {record}: prepare failed{where}; {outcome}")

    # --- steps --------------------------------------------------------------------------------------------

    def _plan(self, claim: AllocatedClaim) -> list[PlannedDevice]:
        """Resolve each allocated device (no hardware is touched); a device may serve several requests."""
        by_device: dict[str, list[str]] = {}
        exclusive: set[str] = set()
        shares: dict[str, list[AllocatedDevice]] = {}
        tolerations: dict[str, list[DeviceToleration]] = {}
        for result in claim.devices:
            if result.pool != self.pool:
                raise ClaimError(
                    f"claim {claim.ref}: device {result.device} was allocated from pool {result.pool}, but this "
                    f"driver serves pool {self.pool} (node {self.pool}); the claim belongs to another node's driver"
                )
            by_device.setdefault(result.device, []).append(result.request)
            tolerations.setdefault(result.device, []).extend(result.tolerations)
            if result.share_id is not None:
                shares.setdefault(result.device, []).append(result)
            if not result.admin_access:
                exclusive.add(result.device)
        planned = [
            PlannedDevice(
                self._resolve(claim.ref, name, tolerations[name]),
                tuple(requests),
                name not in exclusive,
                share_ids=tuple(str(r.share_id) for r in shares.get(name, ())),
                consumed=consumed_total(shares.get(name, ())),
            )
            for name, requests in by_device.items()
        ]
        for p in planned:
            _refuse_admin_passthrough(str(claim.ref), p)
        configs = _resolved_configs(claim, planned) if claim.config else {}
        iommufd = {name for name, config in configs.items() if prefers_iommufd(config)}
        configs = {name: config for name, config in configs.items() if config.kind != "VfioDeviceConfig"}
        for p in planned:
            _refuse_multi_user_before_volta(str(claim.ref), p.device, configs.get(p.device.name))
        return [
            replace(
                p,
                config=share_config(
                    str(claim.ref),
                    p.device.name,
                    configs.get(p.device.name),
                    p.consumed,
                    bool(p.share_ids),
                    shares_mode=self.consumable_shares,
                ),
                prefer_iommufd=p.device.name in iommufd,
            )
            for p in planned
        ]

    def _resolve(self, ref: ClaimRef, name: str, tolerations: Sequence[DeviceToleration]) -> GpuDevice | MigPartition:
        with self._lock:
            found = self._devices.get(name)
        problem = self._device_problem(name, tolerations) if self._device_problem is not None else None
        if problem is not None:
            raise ClaimError(
                f"claim {ref}: device {name} is unhealthy: {problem}; delete the claim so the scheduler allocates "
                "a healthy device (the device is tainted until it recovers)"
            )
        if found is None:
            raise ClaimError(
                f"claim {ref}: device {name} is not offered by this node any more; delete the claim so the "
                "scheduler allocates a device that exists"
            )
        if self.mig_mode is MigMode.DYNAMIC and self.mig is None and _needs_hardware(found):
            raise ClaimError(
                f"claim {ref}: device {name} needs a MIG mode change or a MIG partition carved at prepare, but this "
                "driver was started without GPU access; use --mig-mode static"
            )
        return found

    def _expect_ready(self, txn: Transaction, planned: PlannedDevice) -> None:
        """Declare the steps :meth:`_make_ready` will take for ``planned`` (MIG mode switches, rare and decided
        by what the hardware shows then, are recorded when they happen)."""
        device = planned.device
        if isinstance(device, PassthroughGpu):
            self._passthrough_steps(device).expect(txn, device.passthrough)
        if (
            self.mig_mode is MigMode.DYNAMIC
            and self.mig is not None
            and isinstance(device, MigPartition)
            and not planned.admin_access
        ):
            self.mig.expect_carve(txn, device)

    def _known_target(self, planned: PlannedDevice) -> str | None:
        """The UUID a device's settings go to, if it is known before any change: a whole GPU's, or that of a MIG
        device that exists (static mode); None for a partition this prepare carves."""
        device = planned.device
        if isinstance(device, GpuDevice):
            return device.uuid
        if self.mig_mode is not MigMode.DYNAMIC and device.existing is not None:
            return device.existing.uuid
        return None

    def _refuse_unusable(self, planned: Sequence[PlannedDevice]) -> None:
        """Every check that can refuse a device, for all of the claim's devices, before the first change (the
        overlap check has passed): a passthrough device refused after another was bound would move a GPU for
        nothing."""
        for plan in planned:
            if isinstance(plan.device, PassthroughGpu):
                self._passthrough_steps(plan.device).refuse_unusable(plan.device.passthrough)

    def _make_ready(self, txn: Transaction, planned: PlannedDevice) -> ReadyDevice:
        """Bring one device into the state its allocation needs (dynamic mode: MIG mode and carving)."""
        device, record = planned.device, _record_of(txn.record, planned.device.name)
        if isinstance(device, PassthroughGpu):
            nodes = self._passthrough_steps(device).bind(txn, device.passthrough, prefer_iommufd=planned.prefer_iommufd)
            return ReadyDevice(device, nodes, False, env=passthrough_env(device.passthrough))
        if isinstance(device, GpuDevice):
            if (
                self.mig_mode is MigMode.DYNAMIC
                and self.mig is not None
                and device.info.mig_capable
                and not planned.admin_access
            ):
                record.previous_mig_mode = self.mig.ensure_mig_mode(
                    txn, device, False, lambda: self._users(txn.record.uid, device.name)
                )
            return ReadyDevice(device, gpu_device_nodes(device.info), planned.admin_access)
        mig = device.existing
        if self.mig_mode is MigMode.DYNAMIC:
            assert self.mig is not None  # checked in _resolve
            if planned.admin_access:
                mig = self._existing(device)
            else:
                record.previous_mig_mode = self.mig.ensure_mig_mode(
                    txn, device.parent, True, lambda: self._users(txn.record.uid, device.parent.name)
                )
                mig = self.mig.carve(txn, device)
        assert mig is not None  # static and none modes offer only partitions that exist
        # Recorded in every mode: DCGM exporter names a MIG device by its GPU's UUID and this GPU instance id.
        record.gpu_instance_id, record.compute_instance_id = mig.gpu_instance_id, mig.compute_instance_id
        record.mig_uuid = mig.uuid
        return ReadyDevice(replace(device, existing=mig), _mig_device_nodes(device, mig), planned.admin_access)

    def _with_sharing(self, record: ClaimRecord, ready: ReadyDevice) -> ReadyDevice:
        env, mounts = self.sharing.cdi_extras(record, _record_of(record, ready.name))
        return replace(ready, env=ready.env + env, mounts=mounts)

    def check_mps_daemons(self) -> None:
        """Restart the MPS daemon of every prepared claim whose daemon died (a periodic check; also at
        start-up, which re-adopts the daemons that outlived the previous instance)."""
        for record in self.checkpoint.records():
            try:
                self._ensure_mps(record.uid)
            except DradriverError as err:
                log.error("cannot restart the MPS daemon claim=%s error=%s", record, err)

    def _ensure_mps(self, uid: str) -> None:
        """Restart claim ``uid``'s MPS daemon if it died. Under its GPUs' locks, and with the record read again
        there: an unprepare running meanwhile (which holds them too) must not see its daemon come back."""
        record = self.checkpoint.get(uid)
        if record is None:
            return
        with self._hold_gpus(sorted({d.gpu for d in record.devices})):
            record = self.checkpoint.get(uid)
            # A claim whose unprepare failed half-way (rollback_error) is on its way out: the kubelet's re-sent
            # unprepare finishes it, and a daemon restarted meanwhile would serve nobody.
            if record is not None and record.state is ClaimState.PREPARE_COMPLETED and record.rollback_error is None:
                self.sharing.ensure_mps(record)

    def _existing(self, partition: MigPartition) -> MigDevice:
        """Admin access to a dynamic partition: monitoring what another claim carved; nothing is created."""
        assert self.gpulib is not None
        for mig in self.gpulib.mig_devices(partition.parent.uuid):
            if mig.profile.id == partition.profile.id and mig.placement == partition.placement:
                return mig
        raise DeviceError(
            f"admin access to MIG partition {partition.name}: it is not carved now, so there is nothing to monitor"
        )

    # --- helpers ------------------------------------------------------------------------------------------

    def _reported(self, record: ClaimRecord) -> tuple[PreparedDevice, ...]:
        return tuple(
            PreparedDevice(
                pool=self.pool,
                device=d.name,
                requests=tuple(d.requests),
                cdi_device_ids=tuple(d.cdi_device_ids),
                status_data=d.status_data,
                metadata=d.metadata,
            )
            for d in record.devices
        )

    def _passthrough_steps(self, device: PassthroughGpu) -> PassthroughSteps:
        if self.passthrough is None:
            raise DeviceError(f"device {device.name}: this driver was started without --passthrough")
        return self.passthrough.steps

    def passthrough_devices(self) -> list[PassthroughDevice]:
        """The node's VFIO passthrough devices as last discovered (none without ``--passthrough``)."""
        return self.passthrough.devices() if self.passthrough is not None else []

    def partition_attributes(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Each GPU's Fabric Manager attributes (``gpuModuleID``, ``partitionN``) by PCI address; none without
        ``--fabric-manager-partitions``."""
        return self.partitions.gpu_attributes() if self.partitions is not None else {}

    def _users(self, uid: str, gpu: str) -> list[str]:
        """Other claims with a device on ``gpu``."""
        return [str(r) for r in self.checkpoint.records() if r.uid != uid and any(d.gpu == gpu for d in r.devices)]

    @contextmanager
    def _hold_gpus(self, names: Sequence[str]) -> Iterator[None]:
        """Hold the locks of ``names`` (taken in sorted order, so two claims never deadlock)."""
        with self._lock:
            locks = [self._gpu_locks.setdefault(name, threading.Lock()) for name in sorted(names)]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    # --- start-up -----------------------------------------------------------------------------------------

    def reconcile(self, claim_exists: ClaimExists | None = None) -> None:
        """Bring the node in line with the checkpoint before the plugin registers (:mod:`~.reconcile`)."""
        reconcile(self, claim_exists)

    def rewrite_spec(self, record: ClaimRecord) -> None:
        """Write a prepared claim's CDI spec again, from its record and the devices as the node shows them now.

        The record holds all that the spec is built from (devices, admin access, the MPS directories), and CDI ids
        are named after claim and device, so the ids are those reported at prepare; no API server is needed."""
        ready = [self._with_sharing(record, self._ready_again(record, device)) for device in record.devices]
        try:
            self.cdi.write(build_claim_spec(record.uid, ready))
        except DeviceError as err:
            raise DeviceError(f"claim {record}: re-writing its missing CDI spec: {err}") from err

    def _ready_again(self, record: ClaimRecord, device: DeviceRecord) -> ReadyDevice:
        with self._lock:
            found = self._devices.get(device.name)
        if found is None:
            raise DeviceError(
                f"claim {record}: cannot re-write its missing CDI spec: device {device.name} is not offered by this "
                "node now (GPU lost?); delete the claim's pod so the claim is unprepared"
            )
        if isinstance(found, PassthroughGpu):
            # The nodes the claim got at prepare: the group's, or with PreferIommuFD the device's cdev.
            iommufd = recorded_iommufd(record, device.name)
            nodes = self._passthrough_steps(found).container_nodes(found.passthrough, prefer_iommufd=iommufd)
            return ReadyDevice(found, nodes, False, env=passthrough_env(found.passthrough))
        if isinstance(found, GpuDevice):
            return ReadyDevice(found, gpu_device_nodes(found.info), device.admin_access)
        candidates = self.gpulib.mig_devices(found.parent.uuid) if self.gpulib is not None else [found.existing]
        mig = next((m for m in candidates if m is not None and m.uuid == device.mig_uuid), None)
        if mig is None:
            raise DeviceError(
                f"claim {record}: cannot re-write its missing CDI spec: MIG device {device.mig_uuid} of "
                f"{device.name} is gone; delete the claim's pod so the claim is unprepared"
            )
        return ReadyDevice(replace(found, existing=mig), _mig_device_nodes(found, mig), device.admin_access)


def _refuse_overlap_and_conflicts(ref: ClaimRef, record: ClaimRecord, others: list[ClaimRecord]) -> None:
    check_mps_settings(record)
    _refuse_overlap(ref, record, others)
    refuse_conflicts(str(ref), record, others)


def _resolved_configs(claim: AllocatedClaim, planned: Sequence[PlannedDevice]) -> dict[str, AnyConfig]:
    """The claim's opaque configs resolved per device. The config module and its pydantic models load here, at
    the first claim that carries a config, not with the driver (docs/reliability.md, memory)."""
    from dradriver.driver.prepare.config import ConfigSource, DeviceTarget, resolve_configs

    # Admin access is monitoring another claim's device: its settings are that claim's, not this one's. A passthrough
    # device takes only a VfioDeviceConfig (a GpuConfig or MigDeviceConfig naming it is refused, and the reverse);
    # the caller reads its backend policy and records nothing of it. Sharing and compute modes are none of its
    # business: the VM's guest driver owns the GPU.
    resolved = resolve_configs(
        str(claim.ref),
        [ConfigSource(c.source, c.requests, c.parameters) for c in claim.config],
        [DeviceTarget(p.device.name, p.requests, _config_kind(p.device)) for p in planned if not p.admin_access],
    )
    return resolved


def _config_kind(device: GpuDevice | MigPartition) -> str:
    if isinstance(device, PassthroughGpu):
        return "vfio"
    return "gpu" if isinstance(device, GpuDevice) else "mig"


def _refuse_admin_passthrough(ref: str, planned: PlannedDevice) -> None:
    """Admin access monitors a device another claim may hold; a passthrough device's prepare moves the GPU to
    vfio-pci, which would take it from that claim, so admin access to one is refused before anything changes."""
    if planned.admin_access and isinstance(planned.device, PassthroughGpu):
        raise ClaimError(
            f"claim {ref}: device {planned.device.name} is a VFIO passthrough device: admin access to it is refused, "
            "because preparing it moves the GPU to vfio-pci and takes it from any claim that holds it; ask for "
            f"the whole GPU {planned.device.whole.name} with admin access to monitor it"
        )


def _refuse_multi_user_before_volta(ref: str, device: GpuDevice | MigPartition, config: AnyConfig | None) -> None:
    """MPS's multi-user mode needs Volta (compute capability 7.0) or newer, as NVIDIA's driver checks."""
    sharing = getattr(config, "sharing", None)
    mps = getattr(sharing, "mps", None)
    gpu = device if isinstance(device, GpuDevice) else device.parent
    if mps is not None and mps.multi_user and gpu.info.cuda_compute_capability < (7, 0):
        major, minor = gpu.info.cuda_compute_capability
        raise ClaimError(
            f"claim {ref}: device {device.name} asks for MPS multiUser, which needs a Volta or newer GPU (compute "
            f"capability 7.0); {gpu.info.product_name} has {major}.{minor}: remove multiUser"
        )


def _refuse_overlap(ref: ClaimRef, record: ClaimRecord, others: list[ClaimRecord]) -> None:
    """A device is prepared for one claim at a time (admin access excepted): after a scheduler race or a
    force-deleted claim two claims can name the same device, or partitions that share memory slices, and both
    must not get it. A whole GPU overlaps every partition of it."""
    for mine in record.devices:
        if mine.admin_access:
            continue
        for other in others:
            for theirs in other.devices:
                if theirs.admin_access or theirs.gpu != mine.gpu:
                    continue
                if mine.extra.get(SHARE_IDS_FIELD) and theirs.extra.get(SHARE_IDS_FIELD):
                    continue  # shares of one multi-allocatable GPU: the scheduler accounts their capacity
                holder = ClaimRef(namespace=other.namespace, name=other.name, uid=other.uid)
                if theirs.name == mine.name:
                    raise DeviceInUse(
                        f"claim {ref}: device {mine.name} is already prepared for claim {other.uid} "
                        f"({other.namespace}/{other.name}); it is released when that claim is unprepared (if that "
                        "claim is gone, its pod is still being torn down)",
                        holder=holder,
                        device=theirs.name,
                    )
                if set(mine.slices) & set(theirs.slices):
                    raise DeviceInUse(
                        f"claim {ref}: device {mine.name} overlaps {theirs.name}, which is already prepared for "
                        f"claim {other.uid} ({other.namespace}/{other.name}); it is released when that claim is "
                        "unprepared",
                        holder=holder,
                        device=theirs.name,
                    )


def _whole_gpus(planned: Sequence[PlannedDevice]) -> list[GpuDevice]:
    """The whole GPUs (passthrough ones too) a claim uses exclusively: those its fabric partition is made of."""
    gpus = {p.gpu.name: p.gpu for p in planned if isinstance(p.device, GpuDevice) and not p.admin_access}
    return [gpus[name] for name in sorted(gpus)]


def _device_record(planned: PlannedDevice) -> DeviceRecord:
    device = planned.device
    record = DeviceRecord(
        name=device.name,
        requests=list(planned.requests),
        gpu=planned.gpu.name,
        gpu_uuid=planned.gpu.uuid,
        kind="gpu" if isinstance(device, GpuDevice) else "mig",
        admin_access=planned.admin_access,
    )
    if planned.config is not None:
        record.extra[CONFIG_FIELD] = planned.config
    if planned.share_ids:
        record.extra[SHARE_IDS_FIELD] = list(planned.share_ids)
        record.extra[CONSUMED_FIELD] = dict(planned.consumed)
    if isinstance(device, MigPartition):
        record.placement_start, record.placement_size = device.placement.start, device.placement.size
        record.profile_id = device.profile.id
    return record


def _record_of(record: ClaimRecord, name: str) -> DeviceRecord:
    return next(d for d in record.devices if d.name == name)


def _needs_hardware(device: GpuDevice | MigPartition) -> bool:
    return isinstance(device, MigPartition) or device.mig_enabled


def _mig_device_nodes(partition: MigPartition, mig: MigDevice) -> tuple[DeviceNode, ...]:
    minor = partition.parent.info.minor
    if not mig.capability_nodes:
        raise DeviceError(
            f"the MIG capability device nodes of {partition.name} cannot be read "
            f"(/proc/driver/nvidia/capabilities/gpu{minor}/mig/…); is /proc from the host and the NVIDIA "
            "driver's MIG support available to the driver?"
        )
    return (DeviceNode(f"/dev/nvidia{minor}"), *mig.capability_nodes)
