"""Our API server stand-in (tests/support/apiserver.py) against the real one: the same ResourceSlices, valid
and invalid, must be accepted or refused alike, since every other test trusts the stand-in's verdicts."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.apiserver import FakeApiServer
from support.control_plane import ControlPlane
from support.kube_rest import ApiError, Credentials, Kube

NODE = "agreement-node"


def base() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "agreement-"},
        "spec": {
            "driver": "gpu.dradriver.dev",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"gpu.dradriver.dev/type": {"string": "gpu"}},
                    "capacity": {"gpu.dradriver.dev/memory": {"value": "80Gi"}},
                }
            ],
        },
    }


def edit(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = base()
    change(obj["spec"])
    return obj


def _counters_beside_devices(spec: dict[str, Any]) -> None:
    spec["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]


def _unknown_counter_set(spec: dict[str, Any]) -> None:
    spec["devices"][0]["consumesCounters"] = [{"counterSet": "nowhere", "counters": {"memory": {"value": "1Gi"}}}]


def _two_of_node_name_and_all_nodes(spec: dict[str, Any]) -> None:
    spec["allNodes"] = True


# Only "valid" is valid; each other case breaks one rule of the API server.
CASES: dict[str, dict[str, Any]] = {
    "valid": base(),
    "uppercase-device-name": edit(lambda s: s["devices"][0].update(name="GPU-0")),
    "duplicate-device-names": edit(lambda s: s["devices"].append(copy.deepcopy(s["devices"][0]))),
    "counters-beside-devices": edit(_counters_beside_devices),
    "unknown-counter-set": edit(_unknown_counter_set),
    "node-name-and-all-nodes": edit(_two_of_node_name_and_all_nodes),
    "attribute-with-two-values": edit(
        lambda s: s["devices"][0]["attributes"].update({"gpu.dradriver.dev/x": {"string": "a", "int": 1}})
    ),
    "taint-without-effect": edit(lambda s: s["devices"][0].update(taints=[{"key": "k", "value": "v"}])),
    "too-many-devices": edit(lambda s: s.update(devices=[{"name": f"gpu-{i}"} for i in range(129)])),
    "bad-driver-name": edit(lambda s: s.update(driver="Not_A_DNS_Name")),
}


@pytest.fixture(scope="module")
def stand_in(control_plane: ControlPlane) -> Iterator[Kube]:
    with FakeApiServer() as server:
        server.version = {"major": "1", "minor": "37", "gitVersion": "v1.37.2", "platform": "linux/amd64"}
        yield Kube(Credentials(server.url, control_plane.pki.ca_cert))


def verdict(kube: Kube, obj: dict[str, Any]) -> tuple[bool, str]:
    try:
        created = kube.create("resourceslices", copy.deepcopy(obj))
    except ApiError as exc:
        return False, str(exc)
    kube.delete("resourceslices", created["metadata"]["name"])
    return True, ""


@pytest.mark.parametrize("case", list(CASES))
def test_the_stand_in_accepts_and_refuses_slices_as_the_real_api_server_does(
    case: str, kube: Kube, stand_in: Kube
) -> None:
    real, real_reason = verdict(kube, CASES[case])
    ours, our_reason = verdict(stand_in, CASES[case])
    assert ours == real, (
        f"real server: {'accepted' if real else real_reason}; stand-in: {'accepted' if ours else our_reason}"
    )
