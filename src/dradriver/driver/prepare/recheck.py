"""Staying honest while running: the checkpoint re-checked against the API server every ``--claim-recheck-interval``.

The kubelet unprepares a claim when its pod goes; a claim deleted while the kubelet was away (restarted, its node
partitioned, its state directory wiped) is never unprepared by it, and its devices (a MIG instance, an MPS daemon,
a compute mode) would stay taken until the driver restarts. NVIDIA's driver looks for such claims every ten
minutes; so does this one, by the same rule start-up reconciliation uses: a claim the API server no longer has
(or has under another UID: it was deleted and re-created) is unprepared. A claim the API server cannot answer for
is kept, and looked at again next time. A claim it has gets its pods noted from its reservedFor, so the allocation
series names them also for claims prepared before the driver kept them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from dradriver.driver.prepare.checkpoint import ClaimState
from dradriver.driver.prepare.state import GpuDriver
from dradriver.errors import DradriverError
from dradriver.plugin.handler import ClaimConsumer, ClaimRef

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 600.0

#: Holds a claim's lifecycle lock (the plugin layer's, shared with the kubelet's calls) for a ``with`` block.
HoldClaim = Callable[[str], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class ClaimLookup:
    """What the API server says of a claim: whether it still has it (None: it cannot say now) and, if it does, whom
    the claim is reserved for."""

    exists: bool | None
    consumers: tuple[ClaimConsumer, ...] = ()


def recheck_claims(
    driver: GpuDriver,
    lookup: Callable[[ClaimRef], ClaimLookup],
    *,
    hold: HoldClaim = lambda _uid: contextlib.nullcontext(),
) -> list[ClaimRef]:
    """Unprepare every prepared claim the API server no longer has, and note the pods of those it has (a record
    written before reservedFor was kept, or a pod that changed); returns the claims unprepared (the caller counts them).

    Each claim is looked up without a lock (a GET can be slow) and changed holding its lock, after reading its
    record again: the kubelet may have unprepared it meanwhile, and a prepare in flight is waited for."""
    gone: list[ClaimRef] = []
    for record in driver.checkpoint.records():
        ref = ClaimRef(namespace=record.namespace, name=record.name, uid=record.uid)
        if record.state is ClaimState.PREPARE_STARTED:
            continue  # a prepare in flight
        found = lookup(ref)
        if found.exists is True and found.consumers and list(found.consumers) != record.reserved_for:
            with hold(ref.uid):
                driver.note_consumers(ref.uid, found.consumers)
        if found.exists is not False:
            continue  # a claim that exists, or one the API server cannot answer for now
        with hold(ref.uid):
            if driver.checkpoint.get(ref.uid) is None:
                continue
            log.warning("claim re-check: unpreparing a claim the API server no longer has claim=%s", record)
            try:
                driver.unprepare(ref)
            except DradriverError as err:
                log.error("claim re-check: unprepare failed; trying again next time claim=%s error=%s", record, err)
                continue
        gone.append(ref)
    return gone
