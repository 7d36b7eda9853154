"""The allocator over a fleet, as `explain` asks it node by node: each node's search reads its own pools
(SlicesByNode) and gives the answer it gives over the whole slice set (whole GPUs, MIG partitions on shared
counters, consumable capacity, pools and devices that select their nodes; firstAvailable, All and adminAccess
claims); a request for more devices than a node has is refused without trying every subset, also where the node
has too many devices to bound that at once (dynamic MIG)."""

import copy

import pytest

from dradriver.allocator import SlicesByNode, Unsatisfiable, allocate, explain_claim
from dradriver.allocator.errors import AllocationError
from dradriver.allocator.search import AllocationInputs, Search
from tests.allocator.test_allocator import allocated_claim, claim, exact, first_available


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


NODES = ("node-a", "node-b", "node-c")
A = 'device.attributes["gpu.dradriver.dev"]'
GPU0, GPU1, GPU2 = "gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-47-00-0"
GPU_CLASS, MIG_CLASS = "gpu.dradriver.dev", "mig.dradriver.dev"


def fleet_of(one_node):
    """``one_node``'s slices (node-a, node-m or node-s) on each of NODES, one pool per node."""
    return [s for node in NODES for s in on_node(one_node, node)]


def assert_each_node_answers_as_over_the_fleet(claim_obj, fleet, classes, *, allocated, fits):
    """Each of NODES explains ``claim_obj`` over its own slices (SlicesByNode) exactly as over the whole
    ``fleet``, and it fits on the nodes ``fits`` names: the nodes must differ, or the check proves little."""
    index = SlicesByNode(fleet)
    fitted = set()
    for node in NODES:
        options = {"classes": classes, "allocated": allocated, "node": node}
        whole = explain_claim(claim_obj, slices=fleet, **options)
        own = explain_claim(claim_obj, slices=index.for_node(node), **options)
        assert own.to_dict() == whole.to_dict(), node
        assert whole.error is None, (node, whole.error)
        if whole.fits:
            fitted.add(node)
    assert fitted == set(fits)


@pytest.mark.parametrize(
    ("requests", "fits"),
    [
        ([exact(count=2)], NODES),
        ([exact(count=8)], ("node-a", "node-c")),
        ([exact(count=9)], ()),
        ([exact(selectors=[f'{A}.productName == "nothing"'])], ()),
        # node-b, with two GPUs taken, falls back to the second subrequest; the others take the first.
        ([first_available("gpu", ("eight", GPU_CLASS, 8, ()), ("one", GPU_CLASS, 1, ()))], NODES),
        ([exact(allocationMode="All")], ("node-a", "node-c")),
        ([exact(count=8, adminAccess=True)], NODES),
    ],
    ids=["two", "whole-node", "more-than-a-node", "no-match", "first-available", "all-mode", "admin-access"],
)
def test_each_node_answers_over_its_own_slices_as_over_the_fleets(whole_gpus, classes, requests, fits):
    taken = [allocated_claim(GPU0, GPU1, pool="node-b")]
    assert_each_node_answers_as_over_the_fleet(claim(*requests), fleet_of(whole_gpus), classes, allocated=taken,
                                               fits=fits)  # fmt: skip


def mig(profile, count=None):
    return exact(cls=MIG_CLASS, count=count, selectors=[f'{A}.profile == "{profile}"'])


@pytest.mark.parametrize(
    ("requests", "fits"),
    [
        # A partition on each of node-b's GPUs uses counters a whole GPU needs.
        ([exact(count=1)], ("node-a", "node-c")),
        ([first_available("gpu", ("whole", GPU_CLASS, 2, ()), ("part", MIG_CLASS, 2, ()))], NODES),
        ([mig("1g.10gb", count=14)], ("node-a", "node-c")),
        ([mig("1g.10gb", count=12)], NODES),
        ([mig("3g.40gb", count=2), mig("1g.10gb", count=2)], NODES),
    ],
    ids=["whole-gpu", "first-available", "every-1g", "what-is-left", "mixed"],
)
def test_shared_counters_answer_over_a_nodes_own_slices_as_over_the_fleets(mig_node, classes, requests, fits):
    taken = [allocated_claim(f"{GPU0}-mig-1g10gb-0", f"{GPU1}-mig-1g10gb-0", pool="node-b")]
    assert_each_node_answers_as_over_the_fleet(claim(*requests), fleet_of(mig_node), classes, allocated=taken,
                                               fits=fits)  # fmt: skip


def memory(amount, *, name="gpu", count=None, selector=f'{A}.uuid == "GPU-node-s-0002"'):
    """A request for ``amount`` of a shared GPU's memory (by default of the one with no requestPolicy)."""
    body = {"deviceClassName": GPU_CLASS, "capacity": {"requests": {"memory": amount}}}
    if selector:
        body["selectors"] = [{"cel": {"expression": selector}}]
    if count is not None:
        body["count"] = count
    return {"name": name, "exactly": body}


@pytest.mark.parametrize(
    ("requests", "fits"),
    [
        ([memory("5Gi")], NODES),
        ([memory("6Gi")], ("node-a", "node-c")),
        ([memory("50Gi", name="a"), memory("30Gi", name="b")], ("node-a", "node-c")),
        ([memory("10Gi", count=3, selector=None)], NODES),
    ],
    ids=["what-is-left", "more-than-is-left", "two-requests-share", "three-devices"],
)
def test_consumable_capacity_answers_over_a_nodes_own_slices_as_over_the_fleets(shared_gpus, classes, requests,
                                                                                fits):  # fmt: skip
    result = {"request": "r", "driver": GPU_CLASS, "pool": "node-b", "device": GPU2,
              "shareID": "0b6f9e34-8d41-4c1e-a1f5-0d7f3c2b9e11", "consumedCapacity": {"memory": "75Gi"}}  # fmt: skip
    taken = [{"metadata": {"name": "other", "namespace": "default", "uid": "uid-other"},
              "status": {"allocation": {"devices": {"results": [result]}}}}]  # fmt: skip
    assert_each_node_answers_as_over_the_fleet(claim(*requests), fleet_of(shared_gpus), classes, allocated=taken,
                                               fits=fits)  # fmt: skip


def on_node_c_by_name():
    """A nodeSelector that picks node-c by its name (matchFields metadata.name)."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-c"]}]}]}


def test_a_pool_chosen_by_node_selector_fields_serves_that_node_alone(whole_gpus, classes):
    extra = named_slice("extra", "extra-c")
    extra["spec"]["nodeSelector"] = on_node_c_by_name()
    fleet = [*fleet_of(whole_gpus), extra]
    assert_each_node_answers_as_over_the_fleet(claim(exact(count=9)), fleet, classes, allocated=[],
                                               fits=("node-c",))  # fmt: skip


def test_devices_that_select_their_own_nodes_serve_those_nodes(whole_gpus, classes):
    """A slice with perDeviceNodeSelection: one device on node-a by name, one on node-c by a selector, one on
    every node; ten GPUs fit where two of them add to a node's eight."""
    per_device = named_slice("per-device", "per-device")
    per_device["spec"]["perDeviceNodeSelection"] = True
    gpu = {"attributes": {"type": {"string": "gpu"}}}
    per_device["spec"]["devices"] = [
        {"name": "for-a", "nodeName": "node-a", **gpu},
        {"name": "for-c", "nodeSelector": on_node_c_by_name(), **gpu},
        {"name": "for-all", "allNodes": True, **gpu},
    ]
    fleet = [*fleet_of(whole_gpus), per_device]
    assert_each_node_answers_as_over_the_fleet(claim(exact(count=10)), fleet, classes, allocated=[],
                                               fits=("node-a", "node-c"))  # fmt: skip
    assert_each_node_answers_as_over_the_fleet(claim(exact(count=9)), fleet, classes, allocated=[], fits=NODES)


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


@pytest.fixture(scope="module")
def dgx_h100_dynamic_mig():
    """A DGX H100 as `dradriver run` publishes it with dynamic MIG: 8 whole GPUs and every MIG placement (208
    devices) on shared counters."""
    from support.sim_slices import published_slices

    return published_slices("hgx-h100-80gb", "dynamic", node="node-m")


def test_more_gpus_than_a_mig_node_has_is_refused_without_trying_every_subset(dgx_h100_dynamic_mig, classes):
    """208 devices are too many to bound trying every subset, so the search cannot stop early at once; once the
    class's selector has refused the MIG placements, the 8 GPUs left bound it, and the search stops early."""
    slices = dgx_h100_dynamic_mig
    search = Search(AllocationInputs(claim(exact(count=9)), slices=slices, classes=classes, node="node-m"))
    assert len(search.order) > 63
    assert not search.run()
    # Trying every subset of the eight GPUs was 255 placements; the first branch places the eight, and no more.
    assert search.attempts <= 8
    with pytest.raises(Unsatisfiable):
        allocate(claim(exact(count=9)), slices=slices, classes=classes, node="node-m")
