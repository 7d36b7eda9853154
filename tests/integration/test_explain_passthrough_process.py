"""The node `dradriver explain --sim-profile P --passthrough true` allocates from is the node `dradriver run
--gpu-backend sim --sim-profile P --passthrough true` publishes: the same devices (whole GPUs, MIG devices and
passthrough devices, with every attribute, capacity and counter they consume) and the same counter sets, in each
MIG mode and with Fabric Manager's partitions, read back from the API server stand-in the real process wrote to.
explain names its node after the profile, and a simulated GPU's UUID follows its node's name: run gets that name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import FakeApiServer

from dradriver.cli.explain_node import NodeSettings
from dradriver.gpu.backend import sim_profile_name
from integration.test_run_process import DRIVER, TIMEOUT, our_slices
from integration.test_vfio_process import start

NODES = [
    ("mixed", "none", ()),
    ("mixed", "static", ()),
    ("mixed", "dynamic", ()),
    ("hgx-h100-80gb", "none", ("--fabric-manager-partitions", "true")),
]


def contents(slices: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pool's devices and counter sets by name (where they sit among its slices may differ)."""
    devices: dict[str, Any] = {}
    counter_sets: dict[str, Any] = {}
    for spec in (s["spec"] for s in slices if s["spec"]["driver"] == DRIVER):
        devices.update({d["name"]: d for d in spec.get("devices") or ()})
        counter_sets.update({c["name"]: c for c in spec.get("sharedCounters") or ()})
    return devices, counter_sets


def differences(published: dict[str, Any], explained: dict[str, Any]) -> list[str]:
    """What differs, object by object and field by field (attributes one by one), for a readable failure."""
    found = []
    for name in sorted(published.keys() | explained.keys()):
        run, ours = published.get(name, {}), explained.get(name, {})
        fields = {f"attributes.{a}" for a in {**run.get("attributes", {}), **ours.get("attributes", {})}}
        fields |= {f for f in run.keys() | ours.keys() if f != "attributes"}
        for field in sorted(fields):
            parts = field.split(".", 1)
            one = run.get(parts[0], {}).get(parts[1]) if len(parts) == 2 else run.get(field)
            other = ours.get(parts[0], {}).get(parts[1]) if len(parts) == 2 else ours.get(field)
            if one != other:
                found.append(f"{name} {field}: run {json.dumps(one)}, explain {json.dumps(other)}")
    return found


@pytest.mark.parametrize(("profile", "mig_mode", "flags"), NODES, ids=[f"{p}-{m}" for p, m, _ in NODES])
def test_explain_s_node_is_what_run_publishes(
    root: Path, api: FakeApiServer, profile: str, mig_mode: str, flags: tuple[str, ...]
) -> None:
    settings = NodeSettings(mig_mode=mig_mode, passthrough=True, fabric_partitions=bool(flags))
    explained_devices, explained_sets = contents(settings.slices(profile, DRIVER))
    assert any(name.endswith("-vfio") for name in explained_devices)
    node = sim_profile_name(profile)
    api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    # --node-name comes after DriverProcess's own, so this one counts.
    driver = start(root, api, "--mig-mode", mig_mode, *flags, "--node-name", node, profile=profile)
    try:
        driver.wait_ready()
        # The publisher writes the pool's slices one by one: wait until every device is there, then compare.
        assert api.wait_until(lambda: contents(our_slices(api))[0].keys() == explained_devices.keys(), TIMEOUT), (
            driver.log
        )
        devices, counter_sets = contents(our_slices(api))
        found = differences(devices, explained_devices)
        if mig_mode == "dynamic":
            # Known, and not passthrough's: run destroys at start the MIG instances the profile comes with (no claim
            # owns them) and publishes their places without a UUID; explain's node keeps the UUIDs they had.
            found = [line for line in found if not ("-mig-" in line and " attributes.uuid: run null," in line)]
        assert found == []
        assert differences(counter_sets, explained_sets) == []
    finally:
        driver.stop()
