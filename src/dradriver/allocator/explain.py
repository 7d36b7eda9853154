"""Why a claim fits or not: per request, a funnel of filters over the node's devices, and hints.

``diagnose`` looks at every device (the search itself stops at the first solution), so it also answers
"which devices would match" and "what would make it fit".
"""

from __future__ import annotations

import difflib
import functools
from collections import Counter
from typing import Any

from dradriver.allocator.constraints import Constraint, lookup_attribute
from dradriver.allocator.errors import AllocationError
from dradriver.allocator.model import Device, Request, SelectorRef
from dradriver.allocator.report import ClaimReport, RequestReport, Stage
from dradriver.allocator.search import Search
from dradriver.allocator.taints import blocking_taint
from dradriver.cel import CelEvaluationError
from dradriver.cel import ast as cel_ast

MAX_LISTED = 8


def _wanted(request: Request) -> str:
    return "all matching devices" if request.all_devices else str(request.count)


def _expression_literals(ref: SelectorRef) -> list[str]:
    return [
        str(n.value) for n in cel_ast.walk(ref.selector.tree) if isinstance(n, cel_ast.Const) and n.type == "string"
    ]


def _value_text(value: tuple[str, Any] | None) -> str:
    if value is None:
        return "(missing)"
    kind, raw = value
    return f'"{raw}"' if kind in ("string", "version") else str(raw).lower() if kind == "bool" else str(raw)


def _selector_hint(ref: SelectorRef, devices: list[Device]) -> str:
    reads = [r for r in ref.selector.reads if r[0] in ("attribute", "capacity")]
    parts = []
    literals = _expression_literals(ref)
    for kind, domain, name in reads[:3]:
        qualified = f"{domain}/{name}"
        if kind == "attribute":
            values = Counter(_value_text(lookup_attribute(d, qualified)) for d in devices)
        else:
            values = Counter(_capacity_text(d, domain, name) for d in devices)
        shown = ", ".join(f"{v} ({n})" for v, n in values.most_common(4))
        part = f"{qualified} is {shown}"
        candidates = tuple(v.strip('"') for v in values if v != "(missing)")
        for literal in literals:
            close = _closest(literal, candidates)
            if close and close != literal:
                part += f'; closest to "{literal}": "{close}"'
        parts.append(part)
    where = f"among the {len(devices)} devices that reached it, " if parts else ""
    return f"no device passes {ref.label} ({ref.selector.expression}); {where}{'; '.join(parts)}".rstrip("; ")


@functools.lru_cache(maxsize=4096)
def _closest(literal: str, candidates: tuple[str, ...]) -> str | None:
    """The candidate closest to ``literal`` (difflib, cutoff 0.5), or None. Remembered: over a fleet every node of
    a kind asks the same question, and difflib's answer was about half of each such node's diagnosis."""
    close = difflib.get_close_matches(literal, candidates, n=1, cutoff=0.5)
    return close[0] if close else None


def _capacity_text(device: Device, domain: str, name: str) -> str:
    capacity = device.raw.get("capacity") or {}
    raw = capacity.get(f"{domain}/{name}") or (capacity.get(name) if domain == device.driver else None)
    if raw is None:
        return "(missing)"
    return str(raw.get("value") if isinstance(raw, dict) else raw)


def _guard_hint(ref: SelectorRef, missing: Counter[str], count: int, message: str, devices: list[Device]) -> str:
    if missing:
        attribute, _ = missing.most_common(1)[0]
        domain, _, name = attribute.rpartition("/")
        known = _names_in_domain(devices, domain)
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        if close:  # a typo more often than a device that lacks it
            return (
                f'{count} devices make {ref.label} fail: {message}; did you mean "{close[0]}"? '
                "(the scheduler aborts on such errors)"
            )
        return (
            f"{count} devices make {ref.label} fail: {message}; guard it with "
            f'"{name}" in device.attributes["{domain}"] && ... (the scheduler aborts on such errors)'
        )
    return f"{count} devices make {ref.label} fail: {message} (the scheduler aborts on such errors)"


def _names_in_domain(devices: list[Device], domain: str) -> set[str]:
    """The attribute and capacity names the devices have in ``domain`` (bare names count in their driver's)."""
    names: set[str] = set()
    for device in devices:
        for key in [*(device.raw.get("attributes") or {}), *(device.raw.get("capacity") or {})]:
            key_domain, _, key_name = str(key).rpartition("/")
            if (key_domain or device.driver) == domain:
                names.add(key_name)
    return names


def _no_devices_hint(search: Search) -> str:
    """Why the funnel is empty from the start: usually a mistyped node name."""
    if search.node is None:
        return "no ResourceSlice offers any device"
    nodes = sorted({str(s["spec"]["nodeName"]) for s in search.inputs.slices if (s.get("spec") or {}).get("nodeName")})
    known = f" (nodes with devices: {', '.join(nodes)})" if nodes else ""
    return f"no ResourceSlice offers devices on node {search.node}{known}; check the node name"


def request_report(search: Search, request: Request) -> RequestReport:
    """The funnel of one request: each filter a step, over the devices the previous one let through."""
    funnel = _Funnel(search, request)
    funnel.complete_pools()
    for position, ref in enumerate(request.selectors):
        funnel.selector(position, ref)
    funnel.not_in_use()
    funnel.capacity_left()
    funnel.taints_tolerated()
    funnel.counters_available()
    return funnel.finish()


class _Funnel:
    """The devices that survive each filter so far, and the report the filters write into."""

    def __init__(self, search: Search, request: Request) -> None:
        self.search = search
        self.request = request
        self.report = RequestReport(request.full_name, request.class_name, _wanted(request))
        self.devices = [d for pool in search.pools for d in pool.devices]
        self.survivors = list(self.devices)
        where = f"devices on node {search.node}" if search.node else "devices"
        self.report.stages.append(Stage(where, len(self.devices), len(self.devices)))
        if not self.devices:
            self.report.hints.append(_no_devices_hint(search))

    def reject(self, device: Device, reason: str) -> None:
        self.report.rejected[device.label] = reason

    def complete_pools(self) -> None:
        """The scheduler allocates nothing from a pool that is being published or is invalid."""
        kept = []
        for device in self.survivors:
            pool = device.pool
            if pool.invalid:
                self.reject(device, f"pool {pool.label} is invalid ({pool.invalid})")
            elif pool.incomplete:
                self.reject(
                    device, f"pool {pool.label} is incomplete ({len(pool.slices)} of {pool.slice_count} slices)"
                )
            else:
                kept.append(device)
        if len(kept) != len(self.survivors):
            self.report.stages.append(Stage("in complete pools", len(self.survivors), len(kept)))
            pools = {d.pool.label: d.pool for d in self.survivors}
            invalid = sorted(f"{label} ({pool.invalid})" for label, pool in pools.items() if pool.invalid)
            incomplete = sorted(label for label, pool in pools.items() if pool.incomplete and not pool.invalid)
            if incomplete:
                self.report.hints.append(
                    f"pools {', '.join(incomplete)} are incomplete; the scheduler waits "
                    f"for the driver to finish publishing them"
                )
            if invalid:
                self.report.hints.append(
                    f"pools {', '.join(invalid)} are invalid; the scheduler allocates nothing from them "
                    f"until the driver republishes them correctly"
                )
        self.survivors = kept

    def selector(self, position: int, ref: SelectorRef) -> None:
        """One class or request selector; reuses what the search already evaluated."""
        entering, passed, missing = self.survivors, [], Counter[str]()
        stage = Stage(ref.label, len(entering), 0)
        for device in entering:
            known = self.search.known_selection(self.request, device)
            if known is not None:
                ok = known.passes(position)
            else:
                try:
                    ok = ref.selector.matches(device.raw, driver=device.driver)
                except CelEvaluationError as err:
                    stage.errors += 1
                    stage.error = stage.error or str(err)
                    if err.missing_attribute:
                        missing[err.missing_attribute] += 1
                    self.reject(device, f"{ref.label} failed: {err}")
                    continue
            if ok:
                passed.append(device)
            else:
                self.reject(device, f"{ref.label} is false")
        stage.passed = len(passed)
        self.report.stages.append(stage)
        if stage.errors:
            self.report.hints.append(_guard_hint(ref, missing, stage.errors, stage.error or "", entering))
        if not passed and entering and stage.errors < len(entering):
            rejected = self.report.rejected
            falsified = [d for d in entering if d.label not in rejected or "is false" in rejected[d.label]]
            self.report.hints.append(_selector_hint(ref, falsified))
        self.survivors = passed

    def not_in_use(self) -> None:
        """Devices other claims hold; admin access may use them anyway."""
        if self.request.admin_access:
            return
        survivors, in_use = self.survivors, self.search.in_use
        free = [d for d in survivors if d.id not in in_use]
        for device in survivors:
            if device.id in in_use:
                self.reject(device, "allocated to another claim")
        self.report.stages.append(Stage("not allocated to other claims", len(survivors), len(free)))
        if len(free) < len(survivors) and len(free) < max(self.request.count, 1):
            self.report.hints.append(f"{len(survivors) - len(free)} matching devices are allocated to other claims")
        self.survivors = free

    def capacity_left(self) -> None:
        """Devices with the capacity the request consumes left; a stage only where capacity is in play."""
        request, survivors = self.request, self.survivors
        if not request.capacity_requests and not any(d.multi for d in survivors):
            return
        fitting = []
        short: list[str] = []
        for device in survivors:
            metered = device.multi or request.capacity_requests
            reason = self.search.capacity.shortfall(request, device) if metered else None
            if reason is None:
                fitting.append(device)
            else:
                short.append(reason)
                self.reject(device, reason)
        self.report.stages.append(Stage("capacity available", len(survivors), len(fitting)))
        if short:
            example = short[0] if len(short) == 1 else f"e.g. {short[0]}"
            self.report.hints.append(
                f"{len(short)} devices cannot provide the capacity this request consumes: {example}"
            )
        self.survivors = fitting

    def taints_tolerated(self) -> None:
        untainted = []
        taints: Counter[str] = Counter()
        for device in self.survivors:
            taint = blocking_taint(device, self.request)
            if taint is None:
                untainted.append(device)
            else:
                text = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
                taints[text] += 1
                self.reject(device, f"taint {text} not tolerated")
        if taints:
            self.report.stages.append(Stage("taints tolerated", len(self.survivors), len(untainted)))
            self.report.hints.append(
                "untolerated device taints: "
                + ", ".join(f"{t} ({n})" for t, n in taints.items())
                + "; add a matching toleration to the request if that is intended"
            )
        self.survivors = untainted

    def counters_available(self) -> None:
        """Shared counters (a GPU and its partitions) that other claims' devices already use."""
        fitting = []
        shortfalls: Counter[str] = Counter()
        for device in self.survivors:
            shortfall = self.search.counter_shortfall(device)
            if shortfall is None:
                fitting.append(device)
            else:
                shortfalls[shortfall.subject] += 1
                self.reject(device, f"shared counters exhausted by other claims: {shortfall}")
        if any(d.raw.get("consumesCounters") for d in self.survivors):
            self.report.stages.append(Stage("shared counters available", len(self.survivors), len(fitting)))
        if shortfalls:
            self.report.hints.append(
                f"{sum(shortfalls.values())} devices need shared counters that other claims' devices "
                f"already use (e.g. {shortfalls.most_common(1)[0][0]}): a partition cannot be "
                f"allocated while its parent GPU, or an overlapping partition, is; nor a GPU while its "
                f"passthrough (-vfio) device is, or the reverse"
            )
        self.survivors = fitting

    def finish(self) -> RequestReport:
        report, request, fitting = self.report, self.request, self.survivors
        report.matched = [d.label for d in fitting]
        if not request.all_devices and len(fitting) < request.count and fitting and not report.hints:
            report.hints.append(f"only {len(fitting)} of the {request.count} wanted devices pass every filter")
        return report


def diagnose(search: Search, *, what_if: bool = True) -> ClaimReport:
    """A report for every request (and firstAvailable alternative) of the search's claim.

    With ``what_if``, also explain a failure that no single request explains: a constraint, or devices
    that cannot be combined because they share counters.
    """
    report = ClaimReport(search.claim_name, search.node)
    for group in search.groups:
        for request in group.alternatives:
            report.requests.append(request_report(search, request))
    if not what_if:
        return report
    each_could = all(any(_enough(report, r) for r in group.alternatives) for group in search.groups)
    if each_could and search.groups:
        report.explanation += _combination_reasons(search)
    return report


def _enough(report: ClaimReport, request: Request) -> bool:
    entry = next(r for r in report.requests if r.request == request.full_name)
    return len(entry.matched) >= max(request.count, 1)


def _fits(search: Search) -> bool:
    try:
        return search.run()
    except AllocationError:
        return False


def _combination_reasons(search: Search) -> list[str]:
    if search.constraints:
        relaxed = search.fresh()
        relaxed.disabled_constraints = {c.index for c in search.constraints}
        if _fits(relaxed):
            reasons = []
            for constraint in search.constraints:
                trial = search.fresh()
                trial.disabled_constraints = {constraint.index}
                if _fits(trial) or len(search.constraints) == 1:
                    reasons.append(f"{constraint.label} cannot be met: " + _constraint_values(search, constraint))
            return reasons or ["the constraints together cannot be met by the devices that pass every filter"]
    return [
        "every request has enough matching devices on its own, but not together: they share counters "
        "(e.g. MIG partitions of one GPU, or a GPU and its partitions), the capacity of a shared "
        "(allowMultipleAllocations) device, or the same devices, so no combination fits; ask for fewer "
        "or smaller devices"
    ]


def _constraint_values(search: Search, constraint: Constraint) -> str:
    holders: dict[str, set[str]] = {}
    for group in search.groups:
        for request in group.alternatives:
            if not constraint.applies(request.name, request.parent):
                continue
            for pool in search.pools:
                for device in pool.devices:
                    if device.id in search.in_use or not _quiet_selectable(search, request, device):
                        continue
                    value = _value_text(lookup_attribute(device, constraint.attribute))
                    holders.setdefault(value, set()).add(device.label)
    values = Counter({value: len(labels) for value, labels in holders.items()})
    if not values:
        return "no matching device has that attribute"
    shown = ", ".join(f"{v} on {n} devices" for v, n in values.most_common(MAX_LISTED))
    return f"matching devices have {constraint.attribute} = {shown}"


def _quiet_selectable(search: Search, request: Request, device: Device) -> bool:
    try:
        return search.selectable(request, device)
    except AllocationError:
        return False
