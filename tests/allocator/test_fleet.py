"""The allocator over a fleet, as `explain` asks it node by node: each node's search reads its own pools
(SlicesByNode) and gives the answer it gives over the whole slice set; a request for more devices than a node has
is refused without trying every subset."""

import copy

import pytest

from dradriver.allocator import SlicesByNode, Unsatisfiable, allocate, explain_claim
from dradriver.allocator.search import AllocationInputs, Search
from tests.allocator.test_allocator import allocated_claim, claim, exact


def on_node(slices, node):
    """``slices`` (one node's, named node-a) as node ``node``'s."""
    renamed = copy.deepcopy(slices)
    for obj in renamed:
        obj["metadata"]["name"] = f"{node}-{obj['metadata']['name']}"
        obj["spec"]["nodeName"] = obj["spec"]["pool"]["name"] = node
    return renamed


def named_slice(name, pool, *, generation=1, node=None, all_nodes=False, driver="gpu.dradriver.dev"):
    spec = {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": f"dev-{name}", "attributes": {"type": {"string": "gpu"}}}]}  # fmt: skip
    if node:
        spec["nodeName"] = node
    if all_nodes:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def names(slices):
    return [s["metadata"]["name"] for s in slices]


def test_a_node_gets_its_pools_and_those_that_name_no_node_whole_and_in_order():
    slices = [
        named_slice("a", "pool-a", node="node-a"),
        named_slice("net", "fabric", all_nodes=True, driver="net.example.com"),
        named_slice("b", "pool-b", node="node-b"),
        # One pool over two nodes: its stale generation on node-c must come with its newer one, so that the
        # newest generation is decided as over every slice.
        named_slice("span-old", "span", generation=1, node="node-c"),
        named_slice("span-new", "span", generation=2, node="node-a"),
    ]
    index = SlicesByNode(slices)
    assert names(index.for_node("node-a")) == ["a", "net", "span-old", "span-new"]
    assert names(index.for_node("node-b")) == ["net", "b"]
    assert names(index.for_node("node-c")) == ["net", "span-old", "span-new"]
    assert names(index.for_node("node-z")) == ["net"]
    assert index.for_node(None) is slices


@pytest.mark.parametrize(
    "requests",
    [
        [exact(count=2)],
        [exact(count=8)],
        [exact(count=9)],
        [exact(selectors=['device.attributes["gpu.dradriver.dev"].productName == "nothing"'])],
    ],
    ids=["two", "whole-node", "more-than-a-node", "no-match"],
)
def test_each_node_answers_over_its_own_slices_as_over_the_fleets(whole_gpus, classes, requests):
    fleet = [s for node in ("node-a", "node-b", "node-c") for s in on_node(whole_gpus, node)]
    allocated = [allocated_claim("gpu-0", "gpu-1", pool="node-b")]
    index = SlicesByNode(fleet)
    for node in ("node-a", "node-b", "node-c"):
        whole = explain_claim(claim(*requests), slices=fleet, classes=classes, allocated=allocated, node=node)
        own = explain_claim(claim(*requests), slices=index.for_node(node), classes=classes, allocated=allocated,
                            node=node)  # fmt: skip
        assert own.to_dict() == whole.to_dict(), node


def test_more_devices_than_the_node_has_is_refused_without_trying_every_subset(whole_gpus, classes):
    search = Search(AllocationInputs(claim(exact(count=9)), slices=whole_gpus, classes=classes, node="node-a"))
    assert not search.run()
    # Eight GPUs: a search that tried every subset before giving up placed a device 255 times.
    assert search.attempts <= 8
    with pytest.raises(Unsatisfiable):
        allocate(claim(exact(count=9)), slices=whole_gpus, classes=classes, node="node-a")
