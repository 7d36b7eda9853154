"""A simulation of the scheduler's structured-parameters allocator for one claim.

It follows k8s.io/dynamic-resource-allocation/structured: requests in order (a firstAvailable request
tries its sub-requests in order), for each wanted device the first device in pool/slice/device order that
is not in use, matches the class and request selectors, has the capacity the request consumes left, has
its shared counters available, tolerates its taints and keeps the claim's constraints; on a dead end it
backtracks. The first full solution wins (``search.Search`` holds that state).

Devices with ``allowMultipleAllocations: true`` are never "in use": any number of requests and claims may
share one, as long as its capacities cover what they consume (``capacity``); each such result carries a
``shareID`` and its ``consumedCapacity``. One request never gets the same device twice.
"""

from __future__ import annotations

import logging
from typing import Any, Unpack

from dradriver.allocator.errors import AllocationError, Unsatisfiable
from dradriver.allocator.explain import diagnose
from dradriver.allocator.report import ClaimReport
from dradriver.allocator.search import AllocationInputs, AllocationOptions, Search

log = logging.getLogger(__name__)


def _search(claim: dict[str, Any], options: AllocationOptions) -> Search:
    return Search(AllocationInputs(claim, **options))


def allocate(claim: dict[str, Any], **options: Unpack[AllocationOptions]) -> dict[str, Any]:
    """Allocate devices for ``claim`` (a v1 ResourceClaim or ResourceClaimTemplate) as the scheduler would.

    ``options`` are keywords: ``slices`` and ``classes`` (required), ``allocated``, ``node``, ``node_labels``,
    ``share_ids`` and ``max_attempts``; ``search.AllocationInputs`` says what each means. Returns a
    ``status.allocation`` dict. Results on multi-allocatable devices carry a ``shareID`` and the
    ``consumedCapacity`` the request takes; past ``max_attempts`` device placements, AllocationError.

    Raises Unsatisfiable when no allocation exists (its message and ``report`` say, per request, how many
    devices passed each filter) and AllocationError when the scheduler would fail with an error instead.
    """
    search = _search(claim, options)
    if search.run():
        log.debug("allocated claim=%s node=%s devices=%d", search.claim_name, search.node, len(search.results))
        return search.allocation()
    report = diagnose(search)
    raise Unsatisfiable(report.summary(), report)


def explain_claim(claim: dict[str, Any], **options: Unpack[AllocationOptions]) -> ClaimReport:
    """Allocate ``claim`` and say why it fits or not: per request, how many devices passed each filter,
    which devices matched, what rejected the others, and what would make it fit.

    Takes the same keywords as ``allocate``. Never raises for an unsatisfiable claim or an allocation error;
    both are recorded in the report. Invalid input (an unknown DeviceClass, a selector that does not compile)
    raises AllocationError.
    """
    search = _search(claim, options)
    try:
        fits = search.run()
    except AllocationError as err:
        report = diagnose(search.fresh(), what_if=False)
        report.error = str(err)
        return report
    if not fits:
        return diagnose(search)
    allocation = search.allocation()
    chosen = {(placed.request.full_name, placed.device.label) for placed in search.results}
    while search.results:  # back to the state before the search; the selector results stay cached
        search.remove_last()
    report = diagnose(search, what_if=False)
    report.fits = True
    report.allocation = allocation
    for request_report in report.requests:
        request_report.allocated = [label for name, label in sorted(chosen) if name == request_report.request]
    return report
