"""The allocator over a fleet, as `explain` asks it node by node: each node's search reads its own pools
(SlicesByNode) and gives the answer it gives over the whole slice set; a request for more devices than a node has
is refused without trying every subset."""

import copy

import pytest

from dradriver.allocator import SlicesByNode, Unsatisfiable, allocate, explain_claim
from dradriver.allocator.errors import AllocationError
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


def test_the_early_stop_never_turns_a_search_that_gave_up_into_a_fit(classes):
    """24 GPUs and a firstAvailable claim of 25, else 1: trying every subset of 24 takes 2^24 placements, past the
    search's budget, so the search gives up as it always did (as the scheduler's filter times out) rather than
    stop early and fit the second subrequest."""
    gpus = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(24)]
    spec = {"driver": "gpu.dradriver.dev", "nodeName": "node-a", "devices": gpus,
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}}  # fmt: skip
    slices = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}]
    first_available = {"name": "gpus", "firstAvailable": [
        {"name": "all", "deviceClassName": "gpu.dradriver.dev", "count": 25},
        {"name": "one", "deviceClassName": "gpu.dradriver.dev", "count": 1},
    ]}  # fmt: skip
    search = Search(AllocationInputs(claim(first_available), slices=slices, classes=classes, node="node-a",
                                     max_attempts=100_000))  # fmt: skip
    with pytest.raises(AllocationError, match="gave up"):
        search.run()
    # Within the budget the early stop still answers at once: every subset of 4 GPUs is 15 placements at most.
    four = [{**slices[0], "spec": {**spec, "devices": gpus[:4]}}]
    small = Search(AllocationInputs(claim(first_available), slices=four, classes=classes, node="node-a",
                                    max_attempts=100_000))  # fmt: skip
    assert small.run()
    assert small.attempts <= 8
