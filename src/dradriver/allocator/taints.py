"""Device taints and request tolerations, as the scheduler's allocator applies them."""

from __future__ import annotations

from typing import Any

from dradriver.allocator.model import Device, Request


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    key = toleration.get("key")
    if key and key != taint.get("key"):
        return False
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def blocking_taint(device: Device, request: Request) -> dict[str, Any] | None:
    """The first NoSchedule/NoExecute taint of ``device`` that ``request`` does not tolerate."""
    for taint in device.raw.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
            tolerates(t, taint) for t in request.tolerations
        ):
            return dict(taint)
    return None
