"""What ``explain`` reports about a claim: per request, the funnel of filters and the hints, as plain data.

Its own module so that ``Unsatisfiable`` (errors.py) can carry a report without errors.py importing the
diagnosis that fills it in (explain.py), which raises those errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Stage:
    """One filter: how many devices reached it and how many passed."""

    label: str
    entered: int
    passed: int
    errors: int = 0
    error: str | None = None


@dataclass
class RequestReport:
    request: str
    device_class: str
    wanted: str
    stages: list[Stage] = field(default_factory=list)
    matched: list[str] = field(default_factory=list)  # devices that pass every filter
    rejected: dict[str, str] = field(default_factory=dict)  # device → the first filter that rejected it
    allocated: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


@dataclass
class ClaimReport:
    claim: str
    node: str | None
    fits: bool = False
    allocation: dict[str, Any] | None = None
    error: str | None = None
    requests: list[RequestReport] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)

    def summary(self) -> str:
        where = f" on node {self.node}" if self.node else ""
        if self.fits:
            head = f"claim {self.claim} fits{where}"
        elif self.error:
            head = f"claim {self.claim} cannot be allocated{where}: {self.error}"
        else:
            head = f"claim {self.claim} does not fit{where}"
        lines = [head]
        for request in self.requests:
            funnel = " -> ".join(
                f"{s.passed} {s.label}" + (f" ({s.errors} errors)" if s.errors else "") for s in request.stages
            )
            lines.append(
                f"  request {request.request} (class {request.device_class}, wants {request.wanted}): {funnel}"
            )
            lines += [f"    {hint}" for hint in request.hints]
        lines += [f"  {line}" for line in self.explanation]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
