"""The in-memory cluster behaves like the API server where the plugin layer can tell."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.plugin.cluster import ConflictError, InvalidObjectError, NotFoundError, WatchStream
from dradriver.plugin.cluster.memory import MemoryCluster, generate_name

DRIVER = "gpu.dradriver.dev"


def a_slice(node: str = "node-1", device: str = "gpu-0") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{DRIVER}-{node}-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device}],
        },
    }


def test_generated_names_are_cut_to_leave_room_for_the_suffix() -> None:
    name = generate_name("x" * 80)
    assert len(name) == 63 and name.startswith("x" * 58)


def test_create_update_and_delete_follow_optimistic_concurrency() -> None:
    cluster = MemoryCluster()
    stored = cluster.create_resource_slice(a_slice())
    meta = stored["metadata"]
    assert meta["name"].startswith(f"00000-{DRIVER}-node-1-") and meta["uid"]
    stored["spec"]["devices"].append({"name": "gpu-1"})
    updated = cluster.update_resource_slice(stored)
    assert int(updated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    with pytest.raises(ConflictError, match="the object has been modified"):
        cluster.update_resource_slice(stored)
    with pytest.raises(ConflictError, match="precondition failed"):
        cluster.delete_resource_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
    cluster.delete_resource_slice(
        meta["name"], uid=meta["uid"], resource_version=updated["metadata"]["resourceVersion"]
    )
    with pytest.raises(NotFoundError, match=r"ResourceSlice 00000-gpu\.dradriver\.dev-node-1-"):
        cluster.delete_resource_slice(meta["name"], uid=meta["uid"], resource_version="0")


def test_invalid_slices_are_rejected_naming_the_device() -> None:
    with pytest.raises(InvalidObjectError, match="GPU_0"):
        MemoryCluster().create_resource_slice(a_slice(device="GPU_0"))


def test_list_filters_by_driver_and_node() -> None:
    cluster = MemoryCluster()
    cluster.create_resource_slice(a_slice("node-1"))
    cluster.create_resource_slice(a_slice("node-2"))
    items, rv = cluster.list_resource_slices(driver=DRIVER, node_name="node-2")
    assert [i["spec"]["nodeName"] for i in items] == ["node-2"] and rv == "2"


def test_watch_replays_events_after_a_version_then_streams_until_closed() -> None:
    cluster = MemoryCluster()
    first = cluster.create_resource_slice(a_slice())
    _, rv = cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    cluster.create_resource_slice(a_slice(device="gpu-1"))
    stream = cluster.watch_resource_slices(driver=DRIVER, node_name="node-1", resource_version=rv, timeout_seconds=1)
    assert isinstance(stream, WatchStream)
    assert next(stream).type == "ADDED"
    cluster.create_resource_slice(a_slice("node-2"))  # not ours: not delivered
    cluster.delete_slice_by_name(first["metadata"]["name"])
    event = next(stream)
    assert (event.type, event.object["metadata"]["name"]) == ("DELETED", first["metadata"]["name"])
    stream.close()
    assert list(stream) == []


def test_claims_and_nodes() -> None:
    cluster = MemoryCluster()
    node = cluster.add_node("node-1", uid="uid-1")
    assert cluster.get_node("node-1")["metadata"]["uid"] == node["metadata"]["uid"] == "uid-1"
    cluster.add_resource_claim({"metadata": {"name": "c", "namespace": "ns"}, "spec": {}})
    claim = cluster.get_resource_claim("ns", "c")
    claim["status"] = {"allocation": {"changed": True}, "devices": [{"driver": "d", "pool": "p", "device": "x"}]}
    # Only status.devices is written, as the real adapter writes it.
    assert cluster.update_resource_claim_status(claim)["status"] == {
        "devices": [{"driver": "d", "pool": "p", "device": "x"}]
    }
    with pytest.raises(ConflictError, match="update ResourceClaim ns/c status: the object has been modified"):
        cluster.update_resource_claim_status(claim)
    with pytest.raises(NotFoundError, match="ResourceClaim ns/missing"):
        cluster.get_resource_claim("ns", "missing")


def test_patch_node_merges_labels_and_annotations_as_the_api_server_does() -> None:
    cluster = MemoryCluster()
    before = cluster.add_node("node-1")
    cluster.patch_node("node-1", {"metadata": {"labels": {"team": "a", "nvidia.com/gpu.count": "8"}}})
    patched = cluster.patch_node(
        "node-1", {"metadata": {"labels": {"nvidia.com/gpu.count": None}, "annotations": {"a/b": "x"}}}
    )
    assert patched["metadata"]["labels"] == {"team": "a"}
    assert patched["metadata"]["annotations"] == {"a/b": "x"}
    assert patched["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert cluster.list_nodes() == [patched]
    with pytest.raises(NotFoundError, match="Node node-2"):
        cluster.patch_node("node-2", {"metadata": {"labels": {}}})
