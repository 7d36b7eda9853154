"""One claim explained: allocated offline on each candidate node (the first that fits, else the closest), and
that outcome as JSON or as text. Shared by ``dradriver explain`` on files (explain.py) and on a pod's claims read
from the cluster (explain_cluster.py), with the exit statuses both return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from dradriver.allocator import AllocationError, ClaimReport, SlicesByNode, explain_claim
from dradriver.cli.explain_input import Document

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_INVALID = 0, 1, 2
MAX_NODES_SHOWN = 10


@dataclass
class ClaimOutcome:
    """What explain found for one claim: the node shown and its report (or the error the scheduler would stop
    with), and a one-line verdict for each other node tried."""

    document: Document
    node: str | None = None
    report: ClaimReport | None = None
    other_nodes: dict[str, str] = field(default_factory=dict)  # node → one-line verdict
    error: str | None = None
    #: For a claim that does not fit on a simulated node: the other settings of the node under which it would.
    would_fit_with: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.report is not None and self.report.fits


def nodes_of(slices: list[dict[str, Any]]) -> list[str | None]:
    """The nodes the slices name: ``nodeName`` and ``metadata.name`` node-selector fields, of slices and of
    devices with per-device node selection. None (no node restriction) only when no slice names a node:
    the scheduler allocates every claim for one node, so devices of two named nodes must never mix."""
    nodes: set[str] = set()
    for obj in slices:
        spec = obj.get("spec") or {}
        sources = (spec.get("devices") or []) if spec.get("perDeviceNodeSelection") else [spec]
        for source in sources:
            if source.get("nodeName"):
                nodes.add(str(source["nodeName"]))
            for term in (source.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
                for requirement in term.get("matchFields") or []:
                    if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In":
                        nodes.update(str(v) for v in requirement.get("values") or [])
    return list(sorted(nodes)) or [None]


def explain_document(
    doc: Document,
    *,
    slices: list[dict[str, Any]],
    classes: list[dict[str, Any]],
    allocated: list[dict[str, Any]],
    node: str | None,
) -> ClaimOutcome:
    """Explain one claim on ``node``, or on every node of the slices (the first that fits is shown)."""
    outcome = ClaimOutcome(doc)
    candidates: list[str | None] = [node] if node else nodes_of(slices)
    # Over every node, each node's search reads its own pools, not the fleet's: N slices read in all, not N².
    # A node given by the user is searched over every slice: one search, whose hints can name the other nodes.
    by_node = SlicesByNode(slices) if len(candidates) > 1 else None
    best: tuple[int, str | None, ClaimReport] | None = None
    for candidate in candidates:
        own = by_node.for_node(candidate) if by_node else slices
        try:
            report = explain_claim(doc.obj, slices=own, classes=classes, allocated=allocated, node=candidate)
        except AllocationError as err:
            outcome.error = str(err)
            return outcome
        score = sum(len(r.matched) for r in report.requests) + (10**9 if report.fits else 0)
        if best is None or score > best[0]:
            best = (score, candidate, report)
        if candidate is not None:
            outcome.other_nodes[candidate] = _one_line(report)
        if report.fits:
            break
    assert best is not None
    _, outcome.node, outcome.report = best
    if outcome.node is not None:
        outcome.other_nodes.pop(outcome.node, None)
    return outcome


def _one_line(report: ClaimReport) -> str:
    if report.fits:
        return "fits"
    if report.error:
        return f"error: {report.error}"
    for request in report.requests:
        if request.hints:
            return f"does not fit: request {request.request}: {request.hints[0]}"
    return "does not fit: " + (report.explanation[0] if report.explanation else "no combination of devices fits")


def outcome_dict(outcome: ClaimOutcome) -> dict[str, Any]:
    """The outcome as ``-o json`` prints it."""
    return {
        "source": outcome.document.source,
        "kind": outcome.document.kind,
        "name": outcome.document.name,
        "fits": outcome.fits,
        "node": outcome.node,
        "error": outcome.error,
        "report": outcome.report.to_dict() if outcome.report else None,
        "otherNodes": outcome.other_nodes,
        "wouldFitWith": outcome.would_fit_with,
    }


def _devices(labels: list[str]) -> str:
    names = [label.rsplit("/", 1)[-1] for label in labels]
    shown = ", ".join(names[:6])
    return shown + (f", … ({len(names)} in all)" if len(names) > 6 else "")


def render_outcome(outcome: ClaimOutcome) -> str:
    """The outcome as text: the verdict, each request's funnel and hints, the allocation, the other nodes."""
    doc = outcome.document
    head = f"{doc.kind} {doc.name} ({doc.source})"
    if outcome.error:
        return f"{head}: ERROR (the scheduler would fail with an error)\n  {outcome.error}\n"
    report = outcome.report
    assert report is not None
    where = f" on node {outcome.node}" if outcome.node else ""
    verdict = "fits" if report.fits else "cannot be allocated" if report.error else "does NOT fit"
    lines = [f"{head}: {verdict}{where}"]
    if report.error:
        lines.append(f"  error: {report.error}")
    for request in report.requests:
        lines.append(f"  request {request.request} (class {request.device_class}, wants {request.wanted}):")
        for stage in request.stages:
            errors = f", {stage.errors} failed with an error" if stage.errors else ""
            lines.append(f"    {stage.passed:>6} {stage.label}{errors}")
        if request.matched:
            lines.append(f"    matched every filter: {_devices(request.matched)}")
        if request.allocated:
            lines.append(f"    allocated: {_devices(request.allocated)}")
        lines += [f"    why: {hint}" for hint in request.hints if not report.fits or "fail" in hint]
    lines += [f"  why: {line}" for line in report.explanation]
    lines += [f"  would fit with: {how}" for how in outcome.would_fit_with]
    if report.allocation:
        text = yaml.safe_dump({"allocation": report.allocation}, sort_keys=False).rstrip()
        lines += ["  status:"] + [f"    {line}" for line in text.splitlines()]
    shown = list(outcome.other_nodes.items())[:MAX_NODES_SHOWN]
    if shown:
        lines.append("  other nodes:")
        lines += [f"    {node}: {verdict_line}" for node, verdict_line in shown]
        if len(outcome.other_nodes) > MAX_NODES_SHOWN:
            lines.append(f"    … {len(outcome.other_nodes) - MAX_NODES_SHOWN} more")
    return "\n".join(lines) + "\n"
