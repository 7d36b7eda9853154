"""Dynamic MIG: the prepare steps that switch MIG mode and carve partitions, and their undos.

Steps (each recorded by the claim's :class:`~dradriver.driver.prepare.transaction.Transaction`):

- ``mig-mode``: switch a GPU's MIG mode. Hopper and newer switch at once; Ampere keeps the change pending until
  a GPU reset, which the driver does only when no GPU instance exists and no other claim uses the GPU.
- ``gpu-instance``: create a GPU instance at exactly the allocated profile and placement.
- ``compute-instance``: create its default compute instance (spanning the whole GPU instance).

Undo destroys compute instance, then GPU instance, treating "not found" as already done; the drift check finds
them by profile and placement, as their undo does. MIG mode policy: prepare
switches the mode as the allocation needs it; unprepare leaves it as it is (the next claim that needs the other
mode switches it), and only a failed prepare's rollback restores the mode it found. On Ampere that spares a GPU
reset per claim.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from dradriver.driver.prepare.checkpoint import Action, ClaimRecord
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.errors import DeviceError
from dradriver.gpu.errors import GpuError, NotFound, NotSupported
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import GpuDevice, MigPartition
from dradriver.gpu.models import MigDevice
from dradriver.gpu.products import RESETLESS_MIG_ARCHITECTURES

log = logging.getLogger(__name__)

STEP_MIG_MODE = "mig-mode"
STEP_GPU_INSTANCE = "gpu-instance"
STEP_COMPUTE_INSTANCE = "compute-instance"
CREATE_GPU_INSTANCE = "nvmlDeviceCreateGpuInstanceWithPlacement"
CREATE_COMPUTE_INSTANCE = "nvmlGpuInstanceCreateComputeInstance"


def needs_reset_for_mig_mode(gpu: GpuDevice) -> bool:
    return gpu.info.architecture not in RESETLESS_MIG_ARCHITECTURES


class MigSteps:
    """The MIG steps on one node's GPUs. The caller holds the GPU's lock around every call."""

    def __init__(self, gpulib: GpuLib) -> None:
        self.gpulib = gpulib

    def kinds(self) -> list[StepKind]:
        """The MIG step kinds: their changes are below, their undos and drift checks further down."""
        return [
            StepKind(STEP_MIG_MODE, self.undo_mig_mode),
            StepKind(STEP_GPU_INSTANCE, self.undo_gpu_instance, self.instance_drift),
            StepKind(STEP_COMPUTE_INSTANCE, self.undo_compute_instance, self.instance_drift),
        ]

    # --- prepare ------------------------------------------------------------------------------------------

    def ensure_mig_mode(
        self, txn: Transaction, gpu: GpuDevice, enabled: bool, users: Callable[[], list[str]]
    ) -> bool | None:
        """Put ``gpu`` in MIG mode (``enabled``) or out of it; returns the previous mode if it was switched.

        ``users()`` names the other claims with devices on this GPU (asked only when a reset is needed): a switch
        that needs a GPU reset is refused while there are any (the reset would kill their work)."""
        current = self.gpulib.mig_mode(gpu.uuid).current
        if current == enabled:
            return None
        reset = needs_reset_for_mig_mode(gpu)
        others = users() if reset else []
        if others:
            raise DeviceError(
                f"GPU {gpu.name} ({gpu.info.architecture}) must be {'put in' if enabled else 'taken out of'} MIG "
                f"mode, which needs a GPU reset, but claims {', '.join(others)} use it; the claim is retried after "
                "they are unprepared"
            )
        if not enabled:
            instances = self.gpulib.gpu_instances(gpu.uuid)
            if instances:
                raise DeviceError(
                    f"GPU {gpu.name} still has GPU instances {', '.join(str(i.id) for i in instances)}, so it cannot "
                    "leave MIG mode to run as a whole GPU; destroy them (nvidia-smi mig -dci; nvidia-smi mig -dgi) "
                    "if no claim owns them"
                )
        params = {"gpuUUID": gpu.uuid, "gpu": gpu.name, "enabled": enabled, "previous": current, "reset": reset}
        txn.run(STEP_MIG_MODE, gpu.name, params, self._switch)
        log.info("switched MIG mode claim=%s gpu=%s enabled=%s reset=%s", txn.record.uid, gpu.name, enabled, reset)
        return current

    def _switch(self, params: dict[str, Any]) -> dict[str, Any]:
        self._set_mode(params["gpuUUID"], bool(params["enabled"]), bool(params["reset"]))
        return {}

    def _set_mode(self, gpu_uuid: str, enabled: bool, reset: bool) -> None:
        state = self.gpulib.set_mig_mode(gpu_uuid, enabled)
        if state.current != enabled and reset:
            self.gpulib.reset_gpu(gpu_uuid)
            state = self.gpulib.mig_mode(gpu_uuid)
        if state.current != enabled:
            raise DeviceError(
                f"MIG mode of {gpu_uuid} is still {'on' if state.current else 'off'} after switching it "
                f"(pending: {'on' if state.pending else 'off'}); reset the GPU (nvidia-smi -r) or reboot the node"
            )

    def expect_carve(self, txn: Transaction, partition: MigPartition) -> None:
        """Declare :meth:`carve`'s steps, so their intents are written with the claim's PrepareStarted record."""
        txn.expect(STEP_GPU_INSTANCE, partition.name, _placement(partition))
        txn.expect(STEP_COMPUTE_INSTANCE, partition.name, _placement(partition))

    def carve(self, txn: Transaction, partition: MigPartition) -> MigDevice:
        """Create the partition's GPU instance and default compute instance; read back the MIG device."""
        gpu = partition.parent
        gi = txn.run(STEP_GPU_INSTANCE, partition.name, _placement(partition), self._create_gpu_instance)[
            "gpuInstanceId"
        ]
        ci = txn.run(
            STEP_COMPUTE_INSTANCE,
            partition.name,
            {**_placement(partition), "gpuInstanceId": gi},
            self._create_compute_instance,
        )["computeInstanceId"]
        return self.gpulib.mig_device(gpu.uuid, gi, ci)

    def _create_gpu_instance(self, params: dict[str, Any]) -> dict[str, Any]:
        gpu_uuid, profile_id, start = params["gpuUUID"], int(params["profileId"]), int(params["start"])
        try:
            created = self.gpulib.create_gpu_instance(gpu_uuid, profile_id, start)
        except GpuError as err:
            if err.call != CREATE_GPU_INSTANCE:
                # The instance was created and reading it back failed: it is ours, so it must not stay.
                gi_id = self._instance_at(gpu_uuid, profile_id, start)
                if gi_id is not None:
                    self._destroy_gpu_instance(gpu_uuid, gi_id)
            raise
        return {"gpuInstanceId": created.id}

    def _create_compute_instance(self, params: dict[str, Any]) -> dict[str, Any]:
        gpu_uuid, gi_id = params["gpuUUID"], int(params["gpuInstanceId"])
        try:
            created = self.gpulib.create_compute_instance(gpu_uuid, gi_id)
        except GpuError as err:
            if err.call != CREATE_COMPUTE_INSTANCE:
                for gi in self.gpulib.gpu_instances(gpu_uuid):
                    for ci in gi.compute_instances if gi.id == gi_id else ():
                        self.gpulib.destroy_compute_instance(gpu_uuid, gi_id, ci.id)
            raise
        return {"computeInstanceId": created.id}

    # --- undo ---------------------------------------------------------------------------------------------

    def undo_mig_mode(self, record: ClaimRecord, action: Action) -> None:
        params = action.params
        gpu_uuid, previous = params["gpuUUID"], bool(params["previous"])
        if self.gpulib.mig_mode(gpu_uuid).current == previous:
            return
        if self.gpulib.gpu_instances(gpu_uuid):
            # Another claim carved partitions meanwhile: the GPU stays in MIG mode for them.
            log.info("leaving MIG mode as it is: the GPU has instances claim=%s gpu=%s", record.uid, params["gpu"])
            return
        self._set_mode(gpu_uuid, previous, bool(params.get("reset", False)))
        log.info("restored MIG mode claim=%s gpu=%s enabled=%s", record.uid, params["gpu"], previous)

    def undo_gpu_instance(self, record: ClaimRecord, action: Action) -> None:
        params = action.params
        gpu_uuid = params["gpuUUID"]
        try:
            # The instance at exactly this profile and placement is the claim's, if it exists: no other claim may
            # hold that placement. A recorded id alone is not trusted: after a crash mid-unprepare the id may
            # have been given to another claim's instance elsewhere on the GPU.
            gi_id = self._instance_at(gpu_uuid, int(params["profileId"]), int(params["start"]))
            if gi_id is None:
                return
            self._destroy_gpu_instance(gpu_uuid, gi_id)
        except (NotFound, NotSupported):
            return  # gone already, or MIG mode was switched off out of band: nothing is left to destroy
        log.info("destroyed GPU instance claim=%s device=%s gi=%s", record.uid, action.device, gi_id)

    def _instance_at(self, gpu_uuid: str, profile_id: int, start: int) -> int | None:
        for gi in self.gpulib.gpu_instances(gpu_uuid):
            if gi.profile_id == profile_id and gi.placement.start == start:
                return gi.id
        return None

    def _destroy_gpu_instance(self, gpu_uuid: str, gi_id: int) -> None:
        # Compute instances first: NVML refuses to destroy a GPU instance that still has any.
        for gi in self.gpulib.gpu_instances(gpu_uuid):
            if gi.id == gi_id:
                for ci in gi.compute_instances:
                    with contextlib.suppress(NotFound):
                        self.gpulib.destroy_compute_instance(gpu_uuid, gi_id, ci.id)
        self.gpulib.destroy_gpu_instance(gpu_uuid, gi_id)

    def undo_compute_instance(self, record: ClaimRecord, action: Action) -> None:
        params = action.params
        ci_id = params.get("computeInstanceId")
        if ci_id is None:
            return  # intent only: undoing the GPU instance destroys whatever compute instance it has
        try:
            if "profileId" in params and self._instance_at(
                params["gpuUUID"], int(params["profileId"]), int(params["start"])
            ) != int(params["gpuInstanceId"]):
                return  # the GPU instance is gone (its id may belong to another claim now)
            self.gpulib.destroy_compute_instance(params["gpuUUID"], int(params["gpuInstanceId"]), int(ci_id))
        except (NotFound, NotSupported):
            return
        log.info("destroyed compute instance claim=%s device=%s ci=%s", record.uid, action.device, ci_id)

    # --- drift ------------------------------------------------------------------------------------------------

    def instance_drift(self, record: ClaimRecord, action: Action) -> str | None:
        """A recorded GPU instance (found by profile and placement), or its compute instance, that is gone."""
        params = action.params
        profile, start = int(params["profileId"]), int(params["start"])
        what = f"MIG {action.step} (profile {profile} at start {start}) of {params['gpuUUID']} missing"
        for gi in self.gpulib.gpu_instances(str(params["gpuUUID"])):
            if gi.profile_id == profile and gi.placement.start == start:
                if action.step == STEP_GPU_INSTANCE:
                    return None
                wanted = int(params["computeInstanceId"])
                there = gi.id == int(params["gpuInstanceId"]) and any(ci.id == wanted for ci in gi.compute_instances)
                return None if there else what
        return what

    def destroy_orphan(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy a GPU instance no claim owns (start-up reconciliation in dynamic mode)."""
        try:
            self._destroy_gpu_instance(gpu_uuid, gi_id)
        except (NotFound, NotSupported):
            return


def _placement(partition: MigPartition) -> dict[str, Any]:
    """What identifies a partition's GPU instance on the hardware: its undo finds it by these."""
    return {
        "gpuUUID": partition.parent.uuid,
        "profileId": partition.profile.id,
        "profile": partition.profile.name,
        "start": partition.placement.start,
    }
