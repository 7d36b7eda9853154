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


def _selects(selector: dict[str, Any], driver: str, pool: str, device: str) -> bool:
    """A DeviceTaintRule's ``spec.deviceSelector``: every field that is set must match (unset: any)."""
    wanted = {"driver": driver, "pool": pool, "device": device}
    return all(not selector.get(field) or selector[field] == value for field, value in wanted.items())


def with_taint_rules(slices: list[dict[str, Any]], rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``slices`` with the taint of every DeviceTaintRule added to the devices its selector picks, as the
    scheduler sees them (the rules' taints are not written into the slices; a rule with no selector picks
    every device). Slices without a picked device are returned as they are; the others are copies."""
    if not rules:
        return slices
    result = []
    for obj in slices:
        spec = obj.get("spec") or {}
        driver, pool = str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))
        devices = []
        changed = False
        for device in spec.get("devices") or []:
            taints = [
                dict(rule["spec"]["taint"])
                for rule in rules
                if isinstance((rule.get("spec") or {}).get("taint"), dict)
                and _selects(rule["spec"].get("deviceSelector") or {}, driver, pool, str(device.get("name", "")))
            ]
            if taints:
                changed = True
                devices.append({**device, "taints": [*(device.get("taints") or []), *taints]})
            else:
                devices.append(device)
        result.append({**obj, "spec": {**spec, "devices": devices}} if changed else obj)
    return result
