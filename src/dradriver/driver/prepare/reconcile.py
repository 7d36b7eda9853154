"""Start-up reconciliation: bring the node in line with the checkpoint before the plugin registers with the kubelet.

Claims from an earlier boot are dropped (their CDI specs removed); claims left PrepareStarted are rolled back;
claims the API server no longer has, or whose unprepare failed or was cut short (CDI spec gone and some hardware
change gone too), are unprepared; a prepared claim that only lost its CDI spec gets it re-written, and one whose
hardware drifted while its spec is there is kept with a warning (its pod may be running); in dynamic mode, MIG
instances no claim owns are destroyed; CDI specs and MPS daemons of claims the checkpoint does not know are
removed. Each action is logged with its claim; a failure is logged and left for the kubelet's next call.

What "drifted" means is each step kind's own business (its ``drift`` check, declared beside its apply and undo);
this module only decides what to do about it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from dradriver.driver.prepare.cdi_step import STEP_CDI_SPEC, CdiSpecStep
from dradriver.driver.prepare.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from dradriver.driver.prepare.mig import STEP_GPU_INSTANCE, MigSteps
from dradriver.driver.prepare.sharing import SharingSteps
from dradriver.driver.prepare.transaction import StepKind
from dradriver.errors import DradriverError
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, MigMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import ClaimRef

log = logging.getLogger(__name__)

#: Whether the API server still has a claim: True, False (gone or replaced), or None (cannot tell now).
ClaimExists = Callable[[ClaimRef], bool | None]


class ReconciledDriver(Protocol):
    """What reconciliation needs of the driver (``GpuDriver`` is one): its records, CDI specs, step kinds and
    hardware, and its own unprepare, rollback and spec re-write, so that a claim is cleaned up as a kubelet
    call would clean it up."""

    @property
    def checkpoint(self) -> CheckpointStore: ...
    @property
    def cdi(self) -> CdiWriter: ...
    @property
    def cdi_step(self) -> CdiSpecStep: ...
    @property
    def step_kinds(self) -> Mapping[str, StepKind]: ...
    @property
    def mig_mode(self) -> MigMode: ...
    @property
    def mig(self) -> MigSteps | None: ...
    @property
    def gpulib(self) -> GpuLib | None: ...
    @property
    def sharing(self) -> SharingSteps: ...

    def gpus(self) -> tuple[GpuDevice, ...]: ...
    def roll_back(self, record: ClaimRecord, *, reason: str) -> None: ...
    def unprepare(self, ref: ClaimRef) -> None: ...
    def rewrite_spec(self, record: ClaimRecord) -> None: ...
    def check_mps_daemons(self) -> None: ...


def reconcile(driver: ReconciledDriver, claim_exists: ClaimExists | None = None) -> None:
    """Reconcile ``driver``'s node with its checkpoint (see the module docstring for what is done)."""
    for record in driver.checkpoint.discarded:
        log.warning("reconcile: dropping claim prepared before the last reboot claim=%s", record)
        driver.cdi.remove(record.uid)
    driver.checkpoint.discarded = []
    for record in driver.checkpoint.records():
        try:
            _reconcile_claim(driver, record, claim_exists)
        except DradriverError as err:
            log.error("reconcile: could not clean up claim=%s error=%s", record, err)
    if driver.mig_mode is MigMode.DYNAMIC and driver.mig is not None:
        _destroy_orphan_instances(driver)
    for name in driver.cdi.remove_temp_files():
        log.warning("reconcile: removed a CDI spec left half-written by a crash file=%s", name)
    driver.check_mps_daemons()
    known = {r.uid for r in driver.checkpoint.records()}
    _remove_orphan_specs(driver, known)
    _stop_orphan_mps_daemons(driver, known)


def _reconcile_claim(driver: ReconciledDriver, record: ClaimRecord, claim_exists: ClaimExists | None) -> None:
    if record.state is ClaimState.PREPARE_STARTED:
        log.warning("reconcile: rolling back a prepare that did not complete claim=%s", record)
        driver.roll_back(record, reason="start-up rollback")
        return
    ref = ClaimRef(namespace=record.namespace, name=record.name, uid=record.uid)
    if claim_exists is not None and claim_exists(ref) is False:
        log.warning("reconcile: unpreparing a claim the API server no longer has claim=%s", record)
        driver.unprepare(ref)
        return
    if record.rollback_error is not None:
        log.warning("reconcile: finishing an unprepare that failed claim=%s found=%s", record, record.rollback_error)
        driver.unprepare(ref)
        return
    # The claim's pod may be running: only our own unprepare, cut short, may be finished here. It removes the
    # CDI spec first, so a claim that still has its spec was not being unprepared, whatever else drifted.
    drifted = drifted_changes(driver, record)
    if not driver.cdi_step.spec_missing(record):
        if drifted:
            log.warning(
                "reconcile: a prepared claim changed behind the driver; keeping it, its pod may be running "
                "claim=%s drifted=%s",
                record,
                "; ".join(drifted),
            )
        return
    if drifted:
        log.warning(
            "reconcile: finishing an unprepare that did not complete claim=%s found=CDI spec removed; %s",
            record,
            "; ".join(drifted),
        )
        driver.unprepare(ref)
        return
    # A crash right after the unprepare removed the spec, or a changed or cleaned CDI directory: nothing tells
    # them apart, and destroying a running pod's devices is the worse mistake. A re-sent unprepare finishes.
    log.warning(
        "reconcile: re-writing the missing CDI spec of a prepared claim (its hardware is all there) claim=%s file=%s",
        record,
        driver.cdi.spec_path(record.uid),
    )
    driver.rewrite_spec(record)


def drifted_changes(driver: ReconciledDriver, record: ClaimRecord) -> list[str]:
    """What of a prepared claim's hardware changes the node no longer shows, newest first, as each step kind's
    drift check words it (the CDI spec aside: the caller weighs that). Nothing is written here: a read of the
    hardware per recorded change, at start-up only."""
    drifted = []
    for action in reversed(record.actions):
        kind = driver.step_kinds.get(action.step)
        if not action.done or action.step == STEP_CDI_SPEC or kind is None or kind.drift is None:
            continue
        try:
            found = kind.drift(record, action)
        except (DradriverError, KeyError, ValueError, TypeError) as err:
            log.error("reconcile: cannot check a recorded change claim=%s step=%s error=%s", record, action.step, err)
            continue
        if found is not None:
            drifted.append(found)
    return drifted


def _destroy_orphan_instances(driver: ReconciledDriver) -> None:
    mig, gpulib = driver.mig, driver.gpulib
    assert mig is not None and gpulib is not None
    owned = _owned_instances(driver)
    for gpu in driver.gpus():
        if not gpu.info.mig_capable:
            continue
        try:
            if not gpulib.mig_mode(gpu.uuid).current:
                continue
            for gi in gpulib.gpu_instances(gpu.uuid):
                if (gpu.uuid, gi.id) not in owned:
                    log.warning(
                        "reconcile: destroying a MIG instance no claim owns gpu=%s gi=%d start=%d profile=%d",
                        gpu.name,
                        gi.id,
                        gi.placement.start,
                        gi.profile_id,
                    )
                    mig.destroy_orphan(gpu.uuid, gi.id)
        except DradriverError as err:
            log.error("reconcile: cannot clean up MIG instances gpu=%s error=%s", gpu.name, err)


def _owned_instances(driver: ReconciledDriver) -> dict[tuple[str, int], str]:
    """(GPU UUID, GPU instance id) → the claim that owns the instance, from the checkpoint."""
    owned: dict[tuple[str, int], str] = {}
    for record in driver.checkpoint.records():
        for device in record.devices:
            if device.gpu_instance_id is not None:
                owned[(device.gpu_uuid, device.gpu_instance_id)] = record.uid
        for action in record.actions:
            if action.step == STEP_GPU_INSTANCE and "gpuInstanceId" in action.params:
                try:
                    owned[(str(action.params["gpuUUID"]), int(action.params["gpuInstanceId"]))] = record.uid
                except (KeyError, ValueError, TypeError):
                    log.error("reconcile: ignoring a malformed checkpoint action claim=%s action=%s", record, action)
    return owned


def _remove_orphan_specs(driver: ReconciledDriver, known: set[str]) -> None:
    for uid in driver.cdi.claim_uids():
        if uid not in known:
            log.warning("reconcile: removing CDI spec of a claim not in the checkpoint claim=%s", uid)
            try:
                driver.cdi.remove(uid)
            except DradriverError as err:
                log.error("reconcile: cannot remove a CDI spec no claim owns claim=%s error=%s", uid, err)


def _stop_orphan_mps_daemons(driver: ReconciledDriver, known: set[str]) -> None:
    mps = driver.sharing.mps
    if mps is None:
        return
    for uid in mps.claim_uids():
        if uid not in known:
            # Only a damaged or hand-edited state leaves these: every daemon's intent is recorded before it starts,
            # and its undo removes the directories.
            log.warning("reconcile: stopping the MPS daemon of a claim not in the checkpoint claim=%s", uid)
            pipe, logs = mps.dirs(uid)
            mps.stop({"pipeDir": str(pipe), "logDir": str(logs)})
