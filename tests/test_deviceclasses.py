"""Every DeviceClass we ship compiles with our CEL evaluator and selects devices on the simulated nodes (a
class that matches nothing would be a typo users only find when their pods stay Pending)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.sim_slices import DRIVER, published_slices

from dradriver.cel import compile_selector
from dradriver.sim.profiles import load_node_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted(p.stem for p in (ROOT / "src/dradriver/sim/data/nodes").glob("*.yaml"))
CLASSES = [
    d for p in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d
]


def simulated_devices() -> list[dict[str, Any]]:
    return [
        device
        for profile in PROFILES
        for mode in ("none", "dynamic")
        for s in published_slices(profile, mode)
        for device in s["spec"].get("devices", [])
    ]


def matches(device_class: dict[str, Any], device: dict[str, Any]) -> bool:
    selectors = [compile_selector(s["cel"]["expression"]) for s in device_class["spec"]["selectors"]]
    return all(s.matches(device, driver=DRIVER) for s in selectors)


def test_the_profiles_exist() -> None:
    assert {"dgx-a100-80gb", "hgx-h200", "mixed"} <= set(PROFILES)
    assert all(load_node_profile(p) for p in PROFILES)


@pytest.mark.parametrize("device_class", CLASSES, ids=[c["metadata"]["name"] for c in CLASSES])
def test_every_class_selects_devices_on_the_simulated_nodes(device_class: dict[str, Any]) -> None:
    devices = simulated_devices()
    chosen = [d for d in devices if matches(device_class, d)]
    assert chosen, f"DeviceClass {device_class['metadata']['name']} matches no simulated device"
    kinds = {d["attributes"]["type"]["string"] for d in chosen}
    name = device_class["metadata"]["name"]
    assert kinds == ({"gpu"} if name == "gpu.dradriver.dev" else {"mig"})
    if name.startswith("mig-"):
        profile = name.removeprefix("mig-").removesuffix(".dradriver.dev")
        assert {d["attributes"]["profile"]["string"] for d in chosen} == {profile}
        assert device_class["spec"]["extendedResourceName"] == f"nvidia.com/mig-{profile}"


def test_whole_gpus_bridge_the_device_plugin_resource_name() -> None:
    names = [c["spec"].get("extendedResourceName") for c in CLASSES]
    gpu = next(c for c in CLASSES if c["metadata"]["name"] == "gpu.dradriver.dev")
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert len([n for n in names if n]) == len({n for n in names if n}), "two classes claim one resource name"
