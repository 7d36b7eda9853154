"""The CDI spec step of a prepare: the claim's spec file, its undo and its drift check.

``cdi-spec`` writes one CDI device per allocated device (device nodes, the device's own environment, the mounts of
the claim's MPS daemon) and records the CDI ids and what the claim reports about each device. Undo removes the
file. The spec is an output, never read back: its drift is only "the file is gone", which start-up reads as an
unprepare cut short, or a changed or cleaned CDI directory (see :mod:`dradriver.driver.prepare.reconcile`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dradriver.driver.prepare.checkpoint import Action, ClaimRecord
from dradriver.driver.prepare.device_status import device_metadata_attributes, device_status_data
from dradriver.driver.prepare.sharing import CONFIG_FIELD, sharing_status
from dradriver.driver.prepare.transaction import StepKind, Transaction
from dradriver.gpu.inventory import GpuDevice, MigPartition
from dradriver.gpu.models import DeviceNode
from dradriver.nvidia_install.cdi import CdiDevice, CdiWriter, ClaimSpec, cdi_device

STEP_CDI_SPEC = "cdi-spec"


@dataclass(frozen=True)
class ReadyDevice:
    """A device ready for a container: what the CDI spec step needs. A partition carries its MIG device now."""

    device: GpuDevice | MigPartition
    device_nodes: tuple[DeviceNode, ...]
    admin_access: bool
    env: tuple[str, ...] = ()  # sharing: e.g. the claim's MPS pipe directory
    mounts: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.device.name


class CdiSpecStep:
    """The CDI spec step over one CDI directory."""

    def __init__(self, cdi: CdiWriter) -> None:
        self.cdi = cdi

    def kinds(self) -> list[StepKind]:
        return [StepKind(STEP_CDI_SPEC, self.undo, self.drift)]

    def expect(self, txn: Transaction) -> None:
        txn.expect(STEP_CDI_SPEC, "", {})

    def apply(self, txn: Transaction, ready: Sequence[ReadyDevice]) -> None:
        """Write the claim's spec, one CDI device per allocated device, and record ids and device status."""
        spec = build_claim_spec(txn.record.uid, ready)
        ids = txn.run(STEP_CDI_SPEC, "", {}, lambda _p: {"cdiDeviceIds": self.cdi.write(spec)})["cdiDeviceIds"]
        for record, cdi_id, device in zip(txn.record.devices, ids, ready, strict=True):
            record.cdi_device_ids = [cdi_id]
            # What the claim reports about its devices is recorded too, so a repeated prepare returns it as is.
            record.status_data = device_status_data(
                device.device, admin_access=device.admin_access, sharing=sharing_status(record.extra.get(CONFIG_FIELD))
            )
            record.metadata = device_metadata_attributes(device.device)

    def undo(self, record: ClaimRecord, _action: Action) -> None:
        self.cdi.remove(record.uid)

    def drift(self, record: ClaimRecord, _action: Action) -> str | None:
        path = self.cdi.spec_path(record.uid)
        return None if path.is_file() else f"CDI spec {path} missing"

    def spec_missing(self, record: ClaimRecord) -> bool:
        """Whether the claim wrote a CDI spec that is not in the CDI directory now."""
        return any(a.step == STEP_CDI_SPEC and a.done and self.drift(record, a) is not None for a in record.actions)


def build_claim_spec(claim_uid: str, devices: Sequence[ReadyDevice]) -> ClaimSpec:
    """The claim's CDI spec: per device its nodes and its own environment (admin-access ones marked)."""
    return ClaimSpec(
        claim_uid=claim_uid,
        devices=tuple(_cdi_device(d) for d in devices),
    )


def _cdi_device(ready: ReadyDevice) -> CdiDevice:
    base = cdi_device(ready.device, ready.device_nodes, admin_access=ready.admin_access)
    return replace(base, env=base.env + ready.env, mounts=ready.mounts)
