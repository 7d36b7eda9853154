"""The memory-slice map of a MIG-capable GPU: which slices each GPU instance covers and which claim owns it.

Shown by ``dradriver inventory`` and ``dradriver sim show`` so an admin sees fragmentation at a glance::

    memory slices  0 1 2 3 4 5 6 7
                   A A A A B . . .
      A  GI 1  3g.40gb  slices 0-3  claim default/train (UID 6f1…)
      B  GI 5  1g.10gb  slice 4     not owned by a claim
"""

from __future__ import annotations

import logging
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dradriver.driver.prepare.checkpoint import FILE_NAME, ClaimRecord, CorruptCheckpoint, read_records

log = logging.getLogger(__name__)

MEMORY_SLICES = 8


@dataclass(frozen=True)
class InstanceCell:
    """One GPU instance as the map shows it."""

    gpu_instance_id: int
    profile: str
    start: int
    size: int


def owners_from_checkpoint(state_dir: Path | None) -> dict[tuple[str, int], str]:
    """(GPU UUID, GPU instance id) → the owning claim, read from the checkpoint without locking it (the running
    driver owns the file); empty when there is none or it cannot be read."""
    if state_dir is None:
        return {}
    try:
        records = read_records(state_dir / FILE_NAME)
    except (OSError, CorruptCheckpoint) as err:
        log.warning("cannot read the checkpoint for the slice map path=%s error=%s", state_dir / FILE_NAME, err)
        return {}
    return owners(records)


def owners(records: Iterable[ClaimRecord]) -> dict[tuple[str, int], str]:
    found: dict[tuple[str, int], str] = {}
    for record in records:
        for device in record.devices:
            if device.gpu_instance_id is not None:
                found[(device.gpu_uuid, device.gpu_instance_id)] = str(record)
    return found


def render(gpu_uuid: str, instances: Sequence[InstanceCell], owned_by: Mapping[tuple[str, int], str]) -> list[str]:
    """The map's lines for one GPU: the slice row, then one legend line per GPU instance."""
    if not instances:
        return [
            "memory slices  " + " ".join(str(i) for i in range(MEMORY_SLICES)),
            "               " + " ".join("." for _ in range(MEMORY_SLICES)) + "  (no GPU instances)",
        ]
    cells = ["."] * MEMORY_SLICES
    legend = []
    for letter, gi in zip(string.ascii_uppercase, sorted(instances, key=lambda i: i.start), strict=False):
        for position in range(gi.start, min(gi.start + gi.size, MEMORY_SLICES)):
            cells[position] = letter
        span = f"slice {gi.start}" if gi.size == 1 else f"slices {gi.start}-{gi.start + gi.size - 1}"
        owner = owned_by.get((gpu_uuid, gi.gpu_instance_id))
        legend.append(
            f"  {letter}  GI {gi.gpu_instance_id:<2} {gi.profile:<11} {span:<11} "
            + (f"claim {owner}" if owner else "not owned by a claim")
        )
    return [
        "memory slices  " + " ".join(str(i) for i in range(MEMORY_SLICES)),
        "               " + " ".join(cells),
        *legend,
    ]
