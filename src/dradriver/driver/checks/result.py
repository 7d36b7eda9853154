"""What a check found: its status, what it saw and, when it did not pass, the fix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
OK: Final = "OK"
WARN: Final = "WARN"
FAIL: Final = "FAIL"
SKIP: Final = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``name`` as an admin reads it, ``detail`` what was seen, ``fix`` what to do (empty
    when there is nothing to do)."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def any_failed(results: Iterable[CheckResult]) -> bool:
    """Whether a check failed (warnings and skips do not count)."""
    return any(result.status == FAIL for result in results)
