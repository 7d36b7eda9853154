"""One allocation attempt: the state the scheduler's search keeps, and what it found.

``Search`` is read by the allocator (``allocate``) and by ``explain`` (``diagnose``); what it knows about a
device it answers with data (``Selection``, ``CounterShortfall``, ``Placement``), never with prose that a
reader must take apart.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NotRequired, Required, TypedDict

from dradriver.allocator.capacity import CapacityLedger, consumed_capacity, parse_consumed
from dradriver.allocator.constraints import Constraint, parse_constraints
from dradriver.allocator.counters import CounterLedger, CounterShortfall
from dradriver.allocator.errors import AllocationError
from dradriver.allocator.model import (
    MAX_RESULTS,
    Device,
    DeviceID,
    Pool,
    Request,
    RequestGroup,
    claim_name,
    claim_spec,
    parse_requests,
)
from dradriver.allocator.pools import all_devices, gather_pools
from dradriver.allocator.taints import blocking_taint
from dradriver.cel import CelEvaluationError

ShareIDs = Callable[[str, str, DeviceID], str]
"""Makes the ``shareID`` of a result: (claim uid, or namespace/name without one; request; device) -> UUID."""

_SHARE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "share.dradriver.dev")

# How many device placements one search may try before it gives up, as the scheduler's filter timeout would
# (a plain claim over 200,000 MIG devices needs a fraction of this).
MAX_SEARCH_ATTEMPTS = 1_000_000


def stable_share_id(claim: str, request: str, device: DeviceID) -> str:
    """A lowercase RFC-4122 UUID (version 5) that is the same for the same claim, request and device.

    The scheduler draws a random one; a simulation gives stable output instead. One request never holds a
    device twice, so the IDs of one claim differ.
    """
    return str(uuid.uuid5(_SHARE_NAMESPACE, "/".join((claim, request, *device))))


class AllocationOptions(TypedDict, total=False):
    """What ``allocate`` and ``explain_claim`` take besides the claim; ``AllocationInputs`` says what each is."""

    slices: Required[list[dict[str, Any]]]
    classes: Required[list[dict[str, Any]]]
    allocated: NotRequired[list[dict[str, Any]] | None]
    node: NotRequired[str | None]
    node_labels: NotRequired[dict[str, str] | None]
    share_ids: NotRequired[ShareIDs | None]
    max_attempts: NotRequired[int]


@dataclass(frozen=True)
class AllocationInputs:
    """Everything one allocation of ``claim`` (a v1 ResourceClaim or ResourceClaimTemplate) reads.

    ``slices`` and ``classes`` are v1 ResourceSlices and DeviceClasses; ``allocated`` are claims whose
    ``status.allocation`` already holds devices (those devices, and their shared counters, are taken: a result
    with a ``shareID`` takes its ``consumedCapacity`` from a multi-allocatable device, any other result takes
    the whole device); ``node`` restricts allocation to devices available on that node (None: every slice),
    with ``node_labels`` for slices that select nodes by label. Results on multi-allocatable devices get a
    ``shareID`` from ``share_ids`` (default: ``stable_share_id``). ``max_attempts`` bounds the search (device
    placements tried), as the scheduler's filter timeout does.
    """

    claim: dict[str, Any]
    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    allocated: list[dict[str, Any]] | None = None
    node: str | None = None
    node_labels: dict[str, str] | None = None
    share_ids: ShareIDs | None = None
    max_attempts: int = MAX_SEARCH_ATTEMPTS


@dataclass(frozen=True)
class Selection:
    """What a request's selectors said about one device: the position of the first false one, or None."""

    first_false: int | None

    @property
    def matched(self) -> bool:
        return self.first_false is None

    def passes(self, position: int) -> bool:
        """Whether the device got past the selector at ``position``."""
        return self.first_false is None or self.first_false > position


@dataclass(frozen=True)
class Placement:
    """One device the search has placed for one request."""

    request: Request
    device: Device


class Search:
    """The state of one allocation attempt over ``inputs``; also what ``explain.diagnose`` reads."""

    def __init__(self, inputs: AllocationInputs) -> None:
        self.inputs = inputs
        self.claim = inputs.claim
        self.max_attempts = inputs.max_attempts
        self.attempts = 0
        # Per request (by id), whether its search may stop where too few devices are left (_search_ends).
        self.stop_early: dict[int, bool] = {}
        self.share_ids: ShareIDs = inputs.share_ids or stable_share_id
        self.claim_name = claim_name(inputs.claim)
        self.node = inputs.node
        self.spec = claim_spec(inputs.claim)
        self.pools: list[Pool] = gather_pools(inputs.slices, inputs.node, inputs.node_labels)
        self.classes = {str((c.get("metadata") or {}).get("name")): c for c in inputs.classes}
        self.groups: list[RequestGroup] = parse_requests(inputs.claim, self.classes)
        self.constraints: list[Constraint] = parse_constraints(self.spec)
        self.in_use: set[DeviceID] = set()
        self.capacity = CapacityLedger()
        taken = self._take_allocated(inputs.allocated or [])
        self.ledger = CounterLedger(self.pools, taken)
        self._selections: dict[tuple[int, int], Selection] = {}  # by (id(request), id(device))
        self.all_lists: dict[int, list[Device]] = {}
        self.allocating: set[DeviceID] = set()
        self.results: list[Placement] = []
        self.chosen: dict[int, Request] = {}
        self.disabled_constraints: set[int] = set()
        # Every usable device in the scheduler's order; a request's n-th device is only sought after its
        # (n-1)-th: orders of the same set end in the same state (constraints and counters are monotonic),
        # so this finds the same first solution while exploring combinations instead of permutations.
        self.order = [d for pool in self.pools if not (pool.incomplete or pool.invalid) for d in pool.devices]
        self.position = {id(d): i for i, d in enumerate(self.order)}

    def _take_allocated(self, allocated: list[dict[str, Any]]) -> list[Device]:
        """Mark what other claims hold: whole devices in use, shares of multi-allocatable devices as used
        capacity. Returns the devices whose shared counters they take (each once)."""
        index = all_devices(self.inputs.slices) if allocated else {}
        taken: list[Device] = []
        for other in allocated:
            results = (((other.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            for position, result in enumerate(results or []):
                if result.get("adminAccess"):
                    continue  # admin access does not make a device unavailable to others
                device_id = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
                if result.get("shareID"):
                    # One share of a multi-allocatable device: it stays available, minus its capacity;
                    # its shared counters are taken once, however many shares there are.
                    where = f"claim {claim_name(other)}: status.allocation.devices.results[{position}]"
                    first = device_id not in self.capacity.shares
                    self.capacity.add_allocated(device_id, parse_consumed(result.get("consumedCapacity"), where))
                    if first and device_id not in self.in_use and device_id in index:
                        taken.append(index[device_id])
                    continue
                if device_id not in self.in_use and device_id not in self.capacity.shares and device_id in index:
                    taken.append(index[device_id])
                self.in_use.add(device_id)
        return taken

    def fresh(self) -> Search:
        """A new search over the same inputs (for what-if questions)."""
        return Search(self.inputs)

    # Selection ------------------------------------------------------------------------------------------

    def selectable(self, request: Request, device: Device) -> bool:
        """Class and request selectors, in order; a runtime error aborts allocation as in the scheduler."""
        key = (id(request), id(device))
        known = self._selections.get(key)
        if known is not None:
            return known.matched
        failed = None
        for position, ref in enumerate(request.selectors):
            try:
                matched = ref.selector.matches(device.raw, driver=device.driver)
            except CelEvaluationError as err:
                raise AllocationError(
                    f"{_owner(ref.label, self.claim_name)} on device {device.label}: CEL runtime error: {err}"
                ) from err
            if not matched:
                failed = position
                break
        selection = self._selections[key] = Selection(failed)
        return selection.matched

    def known_selection(self, request: Request, device: Device) -> Selection | None:
        """What the selectors said about ``device`` if this search has evaluated them (None: not yet)."""
        return self._selections.get((id(request), id(device)))

    def prepare(self) -> None:
        """What the scheduler checks before searching: All-mode device lists and the result size limit."""
        minimum = 0
        for group in self.groups:
            needs = []
            for request in group.alternatives:
                if request.all_devices:
                    devices = []
                    for pool in self.pools:
                        if pool.incomplete:
                            raise AllocationError(
                                f"claim {self.claim_name}, request {request.full_name}: asks "
                                f"for all devices, but resource pool {pool.label} is "
                                f"currently being updated"
                            )
                        if pool.invalid:
                            raise AllocationError(
                                f"claim {self.claim_name}, request {request.full_name}: asks "
                                f"for all devices, but resource pool {pool.label} is "
                                f"currently invalid ({pool.invalid})"
                            )
                        devices += [
                            d for d in pool.devices if self.selectable(request, d) and self.capacity_fits(request, d)
                        ]
                    self.all_lists[id(request)] = devices
                    needs.append(len(devices))
                else:
                    needs.append(request.count)
            minimum += min(needs) if needs else 0
        if minimum > MAX_RESULTS:
            raise AllocationError(
                f"claim {self.claim_name}: number of requested devices {minimum} exceeds the "
                f"claim limit of {MAX_RESULTS}"
            )

    # Search ---------------------------------------------------------------------------------------------

    def run(self) -> bool:
        self.prepare()
        return self._group(0)

    def _group(self, index: int) -> bool:
        if index >= len(self.groups):
            return True
        for request in self.groups[index].alternatives:
            if self._fill(index, request, 0):
                self.chosen[index] = request
                return True
        return False

    def _needed(self, request: Request) -> int:
        return len(self.all_lists[id(request)]) if request.all_devices else request.count

    def _fill(self, group: int, request: Request, picked: int) -> bool:
        needed = self._needed(request)
        if request.all_devices and needed == 0:
            return False
        if picked >= needed:
            return self._group(group + 1)
        start = self.position[id(self.results[-1].device)] + 1 if picked else 0
        if len(self.results) + needed - picked > MAX_RESULTS:
            return False
        if not request.all_devices and picked == 0:
            self.stop_early[id(request)] = self._search_ends(request)
        if not request.all_devices and self._too_few_left(request, start, needed - picked):
            # No combination from here fits. Without this a request for more devices than a node has tries every
            # subset of them (2^n) before it says so.
            return False
        if request.all_devices:
            device = self.all_lists[id(request)][picked]
            if not self.try_add(request, device, must=True):
                return False
            if self._fill(group, request, picked + 1):
                return True
            self.remove_last()
            return False
        for device in self.order[start:]:
            if device.id in self.allocating:
                continue
            if not request.admin_access and device.id in self.in_use:
                continue
            if not self.selectable(request, device):
                continue
            if not self.try_add(request, device, must=False):
                continue
            if self._fill(group, request, picked + 1):
                return True
            self.remove_last()
            if self._too_few_left(request, self.position[id(device)] + 1, needed - picked):
                return False  # what is left after this device cannot fill the request either
        return False

    def _search_ends(self, request: Request) -> bool:
        """Whether trying every subset of ``request``'s candidate devices (at most 2^c - 1 placements for c of
        them) would end within the attempt budget: only then may its search stop early where too few devices are
        left, without changing its answer. Past the budget the search gave up, as the scheduler's filter times
        out, and must still give up, or a firstAvailable claim would fit on its next subrequest where the
        scheduler would not get there. Decided once per start of the request's search, not per branch: branches
        that each end within the budget can still add up past it. Selectors are not evaluated to count (a device
        the search never reaches must not raise its runtime error), so c may be more than the candidates: the
        bound only errs towards searching on. Devices its selectors have already refused are not counted (the
        search never places them), nor, for a request picked part-way, are its own picks taken for others'."""
        own = {id(placed.device) for placed in self.results if placed.request is request}
        candidates = sum(
            1
            for device in self.order
            if (id(device) in own or device.id not in self.allocating)
            and (request.admin_access or device.id not in self.in_use)
            and self._may_match(request, device)
        )
        return candidates < 63 and self.attempts + (1 << candidates) - 1 <= self.max_attempts

    def _may_match(self, request: Request, device: Device) -> bool:
        known = self._selections.get((id(request), id(device)))
        return known is None or known.matched

    def _too_few_left(self, request: Request, start: int, wanted: int) -> bool:
        """Whether ``request``'s search, wanting ``wanted`` more devices from ``start`` in the order, may stop: fewer
        devices are left than that, or fewer that its selectors have matched where they have judged every device
        left (none is judged here, so no runtime error is raised early). Only where trying every subset would end
        within the budget (``_search_ends``, asked again here: what the selectors have said since the request's
        search began can show that it would); the current attempt count only makes that bound stricter."""
        if len(self.order) - start >= wanted and not self._judged_too_few(request, start, wanted):
            return False
        if not self.stop_early[id(request)]:
            self.stop_early[id(request)] = self._search_ends(request)
        return self.stop_early[id(request)]

    def _judged_too_few(self, request: Request, start: int, wanted: int) -> bool:
        """Whether the devices from ``start`` that the search would try are all judged by ``request``'s selectors
        and fewer than ``wanted`` of them matched."""
        matched = 0
        for device in itertools.islice(self.order, start, None):
            if device.id in self.allocating or (not request.admin_access and device.id in self.in_use):
                continue
            known = self._selections.get((id(request), id(device)))
            if known is None:
                return False
            matched += known.matched
            if matched >= wanted:
                return False
        return True

    def capacity_fits(self, request: Request, device: Device) -> bool:
        """Whether ``device`` has the capacity ``request`` consumes left (always, for plain requests)."""
        if not (device.multi or request.capacity_requests):
            return True
        return self.capacity.shortfall(request, device) is None

    def counter_shortfall(self, device: Device) -> CounterShortfall | None:
        """Which shared counter ``device`` would run out of; None while a share of it already holds them."""
        if device.multi and self.capacity.shares.get(device.id):
            return None
        return self.ledger.shortfall(device)

    def try_add(self, request: Request, device: Device, *, must: bool) -> bool:
        self.attempts += 1
        if self.attempts > self.max_attempts:
            # Constraints over many alike devices make the search combinatorial; the scheduler bounds it with
            # its filter timeout (DRASchedulerFilterTimeout) and fails the claim, and so do we.
            raise AllocationError(
                f"claim {self.claim_name}: the allocation search gave up after {self.max_attempts:,} device "
                "attempts, as the scheduler would time out; narrow the selectors or loosen the constraints "
                "(distinctAttribute/matchAttribute over many alike devices search every combination)"
            )
        if device.id in self.allocating or (not request.admin_access and device.id in self.in_use):
            return False
        if not self.capacity_fits(request, device):
            return False
        takes_counters = not (device.multi and self.capacity.shares.get(device.id))
        if takes_counters and self.ledger.shortfall(device) is not None:
            return False
        if blocking_taint(device, request) is not None:
            return False
        added: list[Constraint] = []
        for constraint in self.constraints:
            if constraint.index in self.disabled_constraints or not constraint.applies(request.name, request.parent):
                continue
            if not constraint.add(device):
                for undo in added:
                    undo.remove()
                if must:
                    raise AllocationError(
                        f"claim {self.claim_name}, request {request.full_name}: cannot add "
                        f"device {device.label} because a claim constraint would not be "
                        f"satisfied ({constraint.label})"
                    )
                return False
            added.append(constraint)
        if takes_counters:
            self.ledger.take(device)
        if device.multi:
            self.capacity.take(request, device)
        else:
            self.allocating.add(device.id)
        self.results.append(Placement(request, device))
        return True

    def remove_last(self) -> None:
        placed = self.results.pop()
        request, device = placed.request, placed.device
        for constraint in self.constraints:
            if constraint.index not in self.disabled_constraints and constraint.applies(request.name, request.parent):
                constraint.remove()
        if device.multi:
            self.capacity.give_back(request, device)
            if not self.capacity.shares.get(device.id):
                self.ledger.give_back(device)
        else:
            self.ledger.give_back(device)
            self.allocating.discard(device.id)

    # Result ---------------------------------------------------------------------------------------------

    def allocation(self) -> dict[str, Any]:
        """``status.allocation`` for the solution found."""
        results = []
        for placed in self.results:
            request, device = placed.request, placed.device
            entry: dict[str, Any] = {
                "request": request.full_name,
                "driver": device.driver,
                "pool": device.pool.name,
                "device": device.name,
            }
            if request.admin_access:
                entry["adminAccess"] = True
            if request.tolerations:
                entry["tolerations"] = request.tolerations
            if device.multi:
                entry["shareID"] = self.share_ids(self._claim_key(), request.full_name, device.id)
                consumed = consumed_capacity(self.capacity.demand(request, device))
                if consumed:
                    entry["consumedCapacity"] = consumed
            results.append(entry)
        devices: dict[str, Any] = {"results": results}
        config = self._config()
        if config:
            devices["config"] = config
        allocation: dict[str, Any] = {"devices": devices}
        selector = self._node_selector()
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation

    def _claim_key(self) -> str:
        uid = (self.claim.get("metadata") or {}).get("uid")
        return str(uid) if uid else self.claim_name

    def _config(self) -> list[dict[str, Any]]:
        config: list[dict[str, Any]] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for index, _group in enumerate(self.groups):
            request = self.chosen[index]
            known = class_ranges.get(request.class_name)
            if known is not None:
                for i in range(*known):
                    config[i]["requests"].append(request.full_name)
                continue
            start = len(config)
            for entry in (request.class_obj.get("spec") or {}).get("config") or []:
                config.append(
                    {
                        "source": "FromClass",
                        "requests": [request.full_name],
                        **{k: v for k, v in entry.items() if k != "requests"},
                    }
                )
            class_ranges[request.class_name] = (start, len(config))
        for entry in (self.spec.get("devices") or {}).get("config") or []:
            wanted = list(entry.get("requests") or [])
            body = {k: v for k, v in entry.items() if k != "requests"}
            chosen_names = {r.parent or r.name for r in self.chosen.values()} | {
                r.full_name for r in self.chosen.values()
            }
            if not wanted or any(name in chosen_names for name in wanted):
                config.append({"source": "FromClaim", "requests": wanted, **body})
        for entry in config:
            # A config that names every request (a firstAvailable one by itself or its chosen subrequest)
            # applies to all, which the scheduler writes as no requests.
            named = set(entry["requests"])
            if not named or all(
                group.name in named or self.chosen[index].full_name in named for index, group in enumerate(self.groups)
            ):
                entry.pop("requests")
        return config

    def _node_selector(self) -> dict[str, Any] | None:
        match_fields: list[dict[str, Any]] = []
        match_expressions: list[dict[str, Any]] = []
        for placed in self.results:
            spec = placed.device.slice.get("spec") or {}
            source = placed.device.raw if spec.get("perDeviceNodeSelection") else spec
            if source.get("nodeName"):
                return {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [source["nodeName"]]}]}
                    ]
                }
            terms = (source.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
            if len(terms) == 1:
                for requirement in terms[0].get("matchFields") or []:
                    if requirement not in match_fields:
                        match_fields.append(requirement)
                for requirement in terms[0].get("matchExpressions") or []:
                    if requirement not in match_expressions:
                        match_expressions.append(requirement)
        term: dict[str, Any] = {}
        if match_fields:
            term["matchFields"] = match_fields
        if match_expressions:
            term["matchExpressions"] = match_expressions
        return {"nodeSelectorTerms": [term]} if term else None


def _owner(label: str, claim: str) -> str:
    return label if label.startswith("class ") else f"claim {claim}: {label}"
