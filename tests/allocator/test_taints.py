"""DeviceTaintRules applied to slices as the scheduler applies them (allocator/taints.py)."""

from __future__ import annotations

from typing import Any

from dradriver.allocator.taints import with_taint_rules

TAINT = {"key": "dradriver.dev/maintenance", "value": "true", "effect": "NoSchedule"}


def a_slice(pool: str, *names: str, driver: str = "gpu.dradriver.dev") -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": pool}, "devices": [{"name": n} for n in names]}}


def rule(**selector: str) -> dict[str, Any]:
    return {"spec": {"deviceSelector": selector, "taint": TAINT}}


def taints(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d.get("taints", []) for s in slices for d in s["spec"]["devices"]}


def test_a_rule_taints_only_the_devices_its_selector_picks() -> None:
    slices = [a_slice("node-a", "gpu-0", "gpu-1"), a_slice("node-b", "gpu-2")]
    result = taints(with_taint_rules(slices, [rule(pool="node-a", device="gpu-1")]))
    assert result == {"gpu-0": [], "gpu-1": [TAINT], "gpu-2": []}


def test_unset_selector_fields_match_anything_and_other_drivers_are_left_alone() -> None:
    slices = [a_slice("node-a", "gpu-0"), a_slice("node-a", "nic-0", driver="nic.example.com")]
    result = taints(with_taint_rules(slices, [rule(driver="gpu.dradriver.dev")]))
    assert result == {"gpu-0": [TAINT], "nic-0": []}


def test_a_devices_own_taints_are_kept_and_the_input_is_not_modified() -> None:
    own = {"key": "unhealthy", "effect": "NoExecute"}
    slices = [
        {"spec": {"driver": "gpu.dradriver.dev", "pool": {"name": "p"}, "devices": [{"name": "g", "taints": [own]}]}}
    ]
    result = with_taint_rules(slices, [rule()])
    assert taints(result) == {"g": [own, TAINT]}
    assert slices[0]["spec"]["devices"][0]["taints"] == [own]
