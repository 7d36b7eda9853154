"""Which pod holds which device: the prepared claims of the checkpoint joined with whom each claim is reserved for.

One :class:`Allocation` per prepared device and pod (a claim shared by two pods gives two). It is what the
``dradriver_device_allocation_info`` series, the status server's ``/allocations`` and ``dradriver top`` show; the
``uuid`` is the device's own (a MIG device's ``MIG-…``), ``gpu_uuid`` its GPU's, so either joins with DCGM
exporter's series (docs/observability.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from dradriver.driver.prepare.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from dradriver.driver.prepare.sharing import CONFIG_FIELD, SHARE_IDS_FIELD, wanted_settings


@dataclass(frozen=True)
class Allocation:
    """One prepared device held by one pod (``pod`` empty when the claim is reserved for no pod we know)."""

    namespace: str
    pod: str
    pod_uid: str
    claim: str
    claim_uid: str
    requests: tuple[str, ...]
    device: str  # the device name in our ResourceSlice
    uuid: str  # the device's UUID: GPU-… for a whole GPU, MIG-… for a MIG device
    gpu: str  # the (parent) GPU's device name
    gpu_uuid: str
    mig_profile: str  # e.g. 1g.10gb; empty for a whole GPU
    gpu_instance_id: int | None
    sharing: str  # see sharing_label

    def to_json(self) -> dict[str, Any]:
        """camelCase JSON, as the status server's /allocations answers."""
        raw = asdict(self)
        return {_camel(key): list(value) if isinstance(value, tuple) else value for key, value in raw.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.upper() if part in ("uid", "uuid", "id") else part.title() for part in rest)


def allocations(records: Iterable[ClaimRecord]) -> list[Allocation]:
    """The allocations of every completed prepare, sorted by GPU, device and pod."""
    out: list[Allocation] = []
    for record in records:
        if record.state is not ClaimState.PREPARE_COMPLETED or record.rollback_error is not None:
            continue
        pods = [(c.name, c.uid) for c in record.reserved_for if c.is_pod] or [("", "")]
        for device in record.devices:
            for pod, pod_uid in pods:
                out.append(_allocation(record, device, pod, pod_uid))
    return sorted(out, key=lambda a: (a.gpu, a.device, a.namespace, a.pod, a.claim))


def _allocation(record: ClaimRecord, device: DeviceRecord, pod: str, pod_uid: str) -> Allocation:
    attributes = device.metadata or {}
    return Allocation(
        namespace=record.namespace,
        pod=pod,
        pod_uid=pod_uid,
        claim=record.name,
        claim_uid=record.uid,
        requests=tuple(device.requests),
        device=device.name,
        uuid=device.mig_uuid or _string(attributes, "uuid") or device.gpu_uuid,
        gpu=device.gpu,
        gpu_uuid=device.gpu_uuid,
        mig_profile=_string(attributes, "profile") if device.kind == "mig" else "",
        gpu_instance_id=device.gpu_instance_id,
        sharing=sharing_label(device),
    )


def _string(attributes: dict[str, Any], name: str) -> str:
    value = attributes.get(name)
    return str(value.get("string", "")) if isinstance(value, dict) else ""


def sharing_label(device: DeviceRecord) -> str:
    """How a prepared device is held: admin-access (monitoring), consumable (a share of a multi-allocatable GPU,
    enforced with MPS), mps or time-slicing (its config's strategy), else exclusive."""
    if device.admin_access:
        return "admin-access"
    if device.extra.get(SHARE_IDS_FIELD):
        return "consumable"
    strategy = wanted_settings(device.extra.get(CONFIG_FIELD), device.kind).strategy
    return {"MPS": "mps", "TimeSlicing": "time-slicing"}.get(str(strategy), "exclusive")
