"""What allocation can end in besides a result."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dradriver.errors import ClaimError

if TYPE_CHECKING:
    from dradriver.allocator.report import ClaimReport


class AllocationError(ClaimError):
    """The scheduler would stop with an error rather than report "does not fit": a selector failing at run
    time on a device the search reaches, allocationMode All over an incomplete pool, an unknown class."""


class Unsatisfiable(ClaimError):
    """No allocation exists. ``report`` holds, per request, how many devices passed each filter."""

    def __init__(self, message: str, report: ClaimReport | None = None) -> None:
        super().__init__(message)
        self.report = report
