"""Allocation scenarios: what the scheduler's structured allocator would decide."""

import copy

import pytest

from dradriver.allocator import AllocationError, Unsatisfiable, allocate, explain_claim

A = 'device.attributes["gpu.dradriver.dev"]'


def claim(*requests, constraints=None, config=None, kind="ResourceClaim"):
    devices = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    spec = {"devices": devices}
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "test", "namespace": "default", "uid": "uid-test"},
        "spec": spec,
    }


def exact(name="gpu", cls="gpu.dradriver.dev", count=None, selectors=(), **extra):
    body = {"deviceClassName": cls, **extra}
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def first_available(name, *subs):
    return {
        "name": name,
        "firstAvailable": [
            {
                "name": sub_name,
                "deviceClassName": cls,
                **({"count": count} if count else {}),
                **({"selectors": [{"cel": {"expression": s}} for s in selectors]} if selectors else {}),
            }
            for sub_name, cls, count, selectors in subs
        ],
    }


def devices(allocation):
    return [r["device"] for r in allocation["devices"]["results"]]


def allocated_claim(*device_names, pool="node-a", admin=False):
    results = [
        {
            "request": "r",
            "driver": "gpu.dradriver.dev",
            "pool": pool,
            "device": d,
            **({"adminAccess": True} if admin else {}),
        }
        for d in device_names
    ]
    return {
        "metadata": {"name": "other", "namespace": "default", "uid": "uid-other"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


MIG = 'device.attributes["gpu.dradriver.dev"].profile == "{}"'


# -- counts ---------------------------------------------------------------------------------------------


def test_single_gpu_takes_the_first_device(whole_gpus, classes):
    allocation = allocate(claim(exact()), slices=whole_gpus, classes=classes, node="node-a")
    assert devices(allocation) == ["gpu-0000-07-00-0"]
    assert allocation["devices"]["results"][0] == {
        "request": "gpu",
        "driver": "gpu.dradriver.dev",
        "pool": "node-a",
        "device": "gpu-0000-07-00-0",
    }


def test_count_takes_devices_in_slice_order(whole_gpus, classes):
    allocation = allocate(claim(exact(count=3)), slices=whole_gpus, classes=classes, node="node-a")
    assert devices(allocation) == ["gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-47-00-0"]


def test_all_eight_gpus_fit(whole_gpus, classes):
    assert len(devices(allocate(claim(exact(count=8)), slices=whole_gpus, classes=classes))) == 8


def test_nine_gpus_do_not_fit_and_the_message_counts_devices(whole_gpus, classes):
    with pytest.raises(Unsatisfiable) as info:
        allocate(claim(exact(count=9)), slices=whole_gpus, classes=classes, node="node-a")
    assert "wants 9" in str(info.value)
    assert "8 class gpu.dradriver.dev selector #0" in str(info.value)


def test_result_includes_a_node_selector_for_node_local_slices(whole_gpus, classes):
    allocation = allocate(claim(exact()), slices=whole_gpus, classes=classes, node="node-a")
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]


def test_other_nodes_devices_are_not_used(whole_gpus, classes):
    with pytest.raises(Unsatisfiable, match="no ResourceSlice offers devices on node node-b"):
        allocate(claim(exact()), slices=whole_gpus, classes=classes, node="node-b")


def test_template_is_allocated_like_a_claim(whole_gpus, classes):
    allocation = allocate(claim(exact(), kind="ResourceClaimTemplate"), slices=whole_gpus, classes=classes)
    assert devices(allocation) == ["gpu-0000-07-00-0"]


def test_two_requests_get_distinct_devices(whole_gpus, classes):
    allocation = allocate(claim(exact("a"), exact("b")), slices=whole_gpus, classes=classes)
    assert [r["request"] for r in allocation["devices"]["results"]] == ["a", "b"]
    assert len(set(devices(allocation))) == 2


# -- selectors ------------------------------------------------------------------------------------------


def test_request_selector_narrows_class_selector(whole_gpus, classes):
    allocation = allocate(
        claim(exact(selectors=[f'{A}.uuid == "GPU-node-a-0005"'])), slices=whole_gpus, classes=classes
    )
    assert devices(allocation) == ["gpu-0000-90-00-0"]


def test_product_name_mismatch_is_unsatisfiable_with_a_closest_value(whole_gpus, classes):
    with pytest.raises(Unsatisfiable) as info:
        allocate(
            claim(exact(selectors=[f'{A}.productName == "NVIDIA A100-SXM4-40GB"'])),
            slices=whole_gpus,
            classes=classes,
        )
    assert 'closest to "NVIDIA A100-SXM4-40GB": "NVIDIA A100-SXM4-80GB"' in str(info.value)


def test_memory_capacity_selector(whole_gpus, classes):
    fits = claim(exact(selectors=['device.capacity["gpu.dradriver.dev"].memory.compareTo(quantity("80Gi")) >= 0']))
    too_big = claim(exact(selectors=['device.capacity["gpu.dradriver.dev"].memory.isGreaterThan(quantity("80Gi"))']))
    assert devices(allocate(fits, slices=whole_gpus, classes=classes))
    with pytest.raises(Unsatisfiable, match=r"no device passes request gpu selector #0 \(device\.capacity"):
        allocate(too_big, slices=whole_gpus, classes=classes)


def test_runtime_error_on_a_reached_device_aborts_allocation(whole_gpus, classes):
    with pytest.raises(AllocationError, match="CEL runtime error"):
        allocate(claim(exact(selectors=[f'{A}.model == "x"'])), slices=whole_gpus, classes=classes)


def test_runtime_error_guarded_by_in_is_not_an_error(whole_gpus, classes):
    with pytest.raises(Unsatisfiable, match=r'no device passes request gpu selector #0 \("model" in'):
        allocate(
            claim(exact(selectors=[f'"model" in {A} && {A}.model == "x"'])),
            slices=whole_gpus,
            classes=classes,
        )


def test_runtime_error_on_a_device_never_reached_is_ignored(whole_gpus, classes):
    # The first device matches, so the search never evaluates the failing branch on later devices.
    expression = f'{A}.uuid == "GPU-node-a-0000" || {A}.model == "x"'
    assert devices(allocate(claim(exact(selectors=[expression])), slices=whole_gpus, classes=classes)) == [
        "gpu-0000-07-00-0"
    ]


def test_unknown_device_class_is_an_error(whole_gpus, classes):
    with pytest.raises(AllocationError, match=r"device class nvidia\.com not found"):
        allocate(claim(exact(cls="nvidia.com")), slices=whole_gpus, classes=classes)


def test_selector_that_does_not_compile_is_an_error(whole_gpus, classes):
    with pytest.raises(AllocationError, match="CEL compile error"):
        allocate(claim(exact(selectors=["device.nope"])), slices=whole_gpus, classes=classes)


# -- allocationMode All -------------------------------------------------------------------------------------


def test_all_mode_takes_every_matching_device(whole_gpus, classes):
    allocation = allocate(claim(exact(allocationMode="All")), slices=whole_gpus, classes=classes, node="node-a")
    assert len(devices(allocation)) == 8


def test_all_mode_with_one_device_taken_is_unsatisfiable(whole_gpus, classes):
    with pytest.raises(Unsatisfiable, match=r"8 devices -> 8 class gpu\.dradriver\.dev selector #0 -> 7 not allocated"):
        allocate(
            claim(exact(allocationMode="All")),
            slices=whole_gpus,
            classes=classes,
            allocated=[allocated_claim("gpu-0000-07-00-0")],
        )


def test_all_mode_over_an_incomplete_pool_is_an_error(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    slices[0]["spec"]["pool"]["resourceSliceCount"] = 2
    with pytest.raises(AllocationError, match="currently being updated"):
        allocate(claim(exact(allocationMode="All")), slices=slices, classes=classes)


def test_all_mode_without_matching_devices_is_unsatisfiable(whole_gpus, classes):
    with pytest.raises(Unsatisfiable, match=r"no device passes request gpu selector #0 \(.*architecture"):
        allocate(
            claim(exact(allocationMode="All", selectors=[f'{A}.architecture == "Hopper"'])),
            slices=whole_gpus,
            classes=classes,
        )


def test_all_mode_violating_a_constraint_is_an_error(mig_node, classes):
    with pytest.raises(AllocationError, match="constraint"):
        allocate(
            claim(
                exact(cls="mig.dradriver.dev", allocationMode="All", selectors=[MIG.format("7g.80gb")]),
                constraints=[{"matchAttribute": "gpu.dradriver.dev/parentUUID"}],
            ),
            slices=mig_node,
            classes=classes,
        )


def test_exact_count_from_an_incomplete_pool_is_not_used(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    slices[0]["spec"]["pool"]["resourceSliceCount"] = 2
    with pytest.raises(Unsatisfiable, match="incomplete"):
        allocate(claim(exact()), slices=slices, classes=classes)


def test_only_the_newest_pool_generation_counts(whole_gpus, classes):
    old = copy.deepcopy(whole_gpus[0])
    new = copy.deepcopy(whole_gpus[0])
    new["metadata"]["name"] = "newer"
    new["spec"]["pool"]["generation"] = 2
    new["spec"]["devices"] = new["spec"]["devices"][5:]
    allocation = allocate(claim(exact()), slices=[old, new], classes=classes)
    assert devices(allocation) == ["gpu-0000-90-00-0"]


def test_slices_of_a_pool_are_searched_in_name_order(whole_gpus, classes):
    # The scheduler sorts a pool's slices by name before it searches them, whatever order they come in.
    first = copy.deepcopy(whole_gpus[0])
    second = copy.deepcopy(whole_gpus[0])
    first["metadata"]["name"] = "node-a-b"
    first["spec"]["devices"] = first["spec"]["devices"][:4]
    second["metadata"]["name"] = "node-a-a"
    second["spec"]["devices"] = second["spec"]["devices"][4:]
    for s in (first, second):
        s["spec"]["pool"]["resourceSliceCount"] = 2
    allocation = allocate(claim(exact()), slices=[first, second], classes=classes)
    assert devices(allocation) == ["gpu-0000-87-00-0"]


def test_a_device_consuming_an_unknown_counter_set_makes_its_pool_invalid(mig_node, classes):
    # The scheduler does not allocate from a pool whose devices consume counters no counter set defines.
    slices = copy.deepcopy(mig_node)
    for s in slices:
        for device in s["spec"].get("devices") or []:
            for consumption in device.get("consumesCounters") or []:
                consumption["counterSet"] = "no-such-set"
    with pytest.raises(Unsatisfiable, match="counter set no-such-set not found"):
        allocate(claim(exact(cls="mig.dradriver.dev")), slices=slices, classes=classes)


def test_a_device_consuming_an_unknown_counter_makes_its_pool_invalid(mig_node, classes):
    slices = copy.deepcopy(mig_node)
    for s in slices:
        for device in s["spec"].get("devices") or []:
            for consumption in device.get("consumesCounters") or []:
                consumption["counters"] = {"no-such-counter": {"value": "1"}}
    with pytest.raises(Unsatisfiable, match="counter no-such-counter not found in counter set"):
        allocate(claim(exact(cls="mig.dradriver.dev")), slices=slices, classes=classes)


def test_too_many_results_is_an_error(whole_gpus, classes):
    with pytest.raises(AllocationError, match="exceeds the claim limit"):
        allocate(claim(exact(count=33)), slices=whole_gpus, classes=classes)


# -- firstAvailable -----------------------------------------------------------------------------------------


def test_first_available_prefers_the_first_sub_request(mig_node, classes):
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", None, ()),
        ("part", "mig.dradriver.dev", None, (MIG.format("3g.40gb"),)),
    )
    allocation = allocate(claim(request), slices=mig_node, classes=classes)
    assert allocation["devices"]["results"][0]["request"] == "gpu/whole"


def test_first_available_falls_back_to_mig_when_gpus_are_taken(mig_node, classes):
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", None, ()),
        ("part", "mig.dradriver.dev", None, (MIG.format("3g.40gb"),)),
    )
    # A partition on each GPU uses counters a whole GPU needs, so only partitions remain.
    taken = allocated_claim("gpu-0000-07-00-0-mig-1g10gb-0", "gpu-0000-0f-00-0-mig-1g10gb-0", pool="node-m")
    allocation = allocate(claim(request), slices=mig_node, classes=classes, allocated=[taken])
    assert allocation["devices"]["results"][0]["request"] == "gpu/part"
    assert devices(allocation) == ["gpu-0000-07-00-0-mig-3g40gb-4"]


def test_first_available_with_every_alternative_taken_is_unsatisfiable(mig_node, classes):
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", None, ()),
        ("part", "mig.dradriver.dev", None, (MIG.format("3g.40gb"),)),
    )
    taken = allocated_claim("gpu-0000-07-00-0", "gpu-0000-0f-00-0", pool="node-m")
    with pytest.raises(Unsatisfiable, match="2 matching devices are allocated to other claims"):
        allocate(claim(request), slices=mig_node, classes=classes, allocated=[taken])


def test_first_available_uses_mig_when_more_gpus_are_asked_than_exist(mig_node, classes):
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", 3, ()),
        ("part", "mig.dradriver.dev", 3, (MIG.format("1g.10gb"),)),
    )
    allocation = allocate(claim(request), slices=mig_node, classes=classes)
    assert {r["request"] for r in allocation["devices"]["results"]} == {"gpu/part"}


def test_config_of_the_chosen_sub_request_class_is_attached(mig_node, classes):
    classes = copy.deepcopy(classes)
    for cls in classes:
        cls["spec"]["config"] = [
            {"opaque": {"driver": "gpu.dradriver.dev", "parameters": {"kind": cls["metadata"]["name"]}}}
        ]
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", 3, ()),
        ("part", "mig.dradriver.dev", None, (MIG.format("1g.10gb"),)),
    )
    claim_config = [{"requests": ["gpu"], "opaque": {"driver": "gpu.dradriver.dev", "parameters": {"a": 1}}}]
    allocation = allocate(claim(request, config=claim_config), slices=mig_node, classes=classes)
    config = allocation["devices"]["config"]
    assert config[0]["source"] == "FromClass"
    assert config[0]["opaque"]["parameters"] == {"kind": "mig.dradriver.dev"}
    assert config[1]["source"] == "FromClaim"


def test_claim_config_keeps_its_requests_unless_it_covers_every_request(mig_node, classes):
    # The scheduler drops a config's requests only when every request of the claim is named (or its chosen
    # subrequest is); counting entries would make a config for gpu/whole and gpu/part apply to "other" too.
    request = first_available(
        "gpu",
        ("whole", "gpu.dradriver.dev", None, ()),
        ("part", "mig.dradriver.dev", None, (MIG.format("1g.10gb"),)),
    )
    opaque = {"driver": "gpu.dradriver.dev", "parameters": {"a": 1}}
    claim_config = [
        {"requests": ["gpu/whole", "gpu/part"], "opaque": opaque},
        {"requests": ["gpu/whole", "other"], "opaque": opaque},
    ]
    other = exact(name="other", cls="mig.dradriver.dev", selectors=(MIG.format("1g.10gb"),))
    allocation = allocate(claim(request, other, config=claim_config), slices=mig_node, classes=classes)
    config = allocation["devices"]["config"]
    assert [c["source"] for c in config] == ["FromClaim", "FromClaim"]
    assert config[0]["requests"] == ["gpu/whole", "gpu/part"]
    assert "requests" not in config[1]  # gpu/whole was chosen and other is named: it covers every request


# -- constraints ------------------------------------------------------------------------------------------


def test_match_attribute_on_nvlink_domain(whole_gpus, classes):
    allocation = allocate(
        claim(exact(count=2), constraints=[{"matchAttribute": "gpu.dradriver.dev/nvlinkDomain"}]),
        slices=whole_gpus,
        classes=classes,
    )
    assert len(devices(allocation)) == 2


def test_match_attribute_across_nvlink_pairs_backtracks(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    for i, device in enumerate(slices[0]["spec"]["devices"]):
        device["attributes"]["nvlinkDomain"] = {"string": f"pair-{i // 2}"}
    taken = allocated_claim("gpu-0000-0f-00-0")  # breaks pair 0
    allocation = allocate(
        claim(exact(count=2), constraints=[{"matchAttribute": "gpu.dradriver.dev/nvlinkDomain"}]),
        slices=slices,
        classes=classes,
        allocated=[taken],
    )
    assert devices(allocation) == ["gpu-0000-47-00-0", "gpu-0000-4e-00-0"]


def test_match_attribute_that_cannot_be_met_is_explained(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    for i, device in enumerate(slices[0]["spec"]["devices"]):
        device["attributes"]["nvlinkDomain"] = {"string": f"pair-{i // 2}"}
    with pytest.raises(Unsatisfiable) as info:
        allocate(
            claim(exact(count=3), constraints=[{"matchAttribute": "gpu.dradriver.dev/nvlinkDomain"}]),
            slices=slices,
            classes=classes,
        )
    assert "matchAttribute gpu.dradriver.dev/nvlinkDomain" in str(info.value)
    assert '"pair-0" on 2 devices' in str(info.value)


def test_match_attribute_on_pcie_root(whole_gpus, classes):
    allocation = allocate(
        claim(exact(count=2), constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
        slices=whole_gpus,
        classes=classes,
        allocated=[allocated_claim("gpu-0000-07-00-0")],
    )
    assert devices(allocation) == ["gpu-0000-47-00-0", "gpu-0000-4e-00-0"]


def test_constraint_scoped_to_listed_requests(whole_gpus, classes):
    constraint = {"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/numaNode"}
    allocation = allocate(
        claim(exact("a", count=2), exact("b", count=2), exact("c"), constraints=[constraint]),
        slices=whole_gpus,
        classes=classes,
        allocated=[allocated_claim("gpu-0000-07-00-0")],
    )
    # a and b need four devices on one NUMA node: only node 1 still has four; c is unconstrained.
    assert devices(allocation) == [
        "gpu-0000-87-00-0",
        "gpu-0000-90-00-0",
        "gpu-0000-b7-00-0",
        "gpu-0000-bd-00-0",
        "gpu-0000-0f-00-0",
    ]


def test_distinct_attribute(whole_gpus, classes):
    allocation = allocate(
        claim(exact(count=2), constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}]),
        slices=whole_gpus,
        classes=classes,
    )
    assert devices(allocation) == ["gpu-0000-07-00-0", "gpu-0000-47-00-0"]


# -- MIG and shared counters ------------------------------------------------------------------------------


def test_seven_1g10gb_partitions_fit_on_one_gpu(mig_node, classes):
    allocation = allocate(
        claim(
            exact(cls="mig.dradriver.dev", count=7, selectors=[MIG.format("1g.10gb")]),
            constraints=[{"matchAttribute": "gpu.dradriver.dev/parentUUID"}],
        ),
        slices=mig_node,
        classes=classes,
    )
    assert len(devices(allocation)) == 7
    assert all(d.startswith("gpu-0000-07-00-0-mig-1g10gb") for d in devices(allocation))


def test_eight_1g10gb_partitions_do_not_fit_on_one_gpu(mig_node, classes):
    with pytest.raises(Unsatisfiable, match="parentUUID"):
        allocate(
            claim(
                exact(cls="mig.dradriver.dev", count=8, selectors=[MIG.format("1g.10gb")]),
                constraints=[{"matchAttribute": "gpu.dradriver.dev/parentUUID"}],
            ),
            slices=mig_node,
            classes=classes,
        )


def test_overlapping_partitions_are_never_allocated_together(mig_node, classes):
    allocation = allocate(
        claim(
            exact(cls="mig.dradriver.dev", count=2, selectors=[MIG.format("4g.40gb")]),
            exact("small", cls="mig.dradriver.dev", selectors=[MIG.format("3g.40gb")]),
        ),
        slices=mig_node,
        classes=classes,
    )
    assert devices(allocation) == [
        "gpu-0000-07-00-0-mig-4g40gb-0",
        "gpu-0000-0f-00-0-mig-4g40gb-0",
        "gpu-0000-07-00-0-mig-3g40gb-4",
    ]


def test_partitions_of_an_allocated_gpu_are_unavailable(mig_node, classes):
    taken = allocated_claim("gpu-0000-07-00-0", pool="node-m")
    allocation = allocate(
        claim(exact(cls="mig.dradriver.dev", selectors=[MIG.format("1g.10gb")])),
        slices=mig_node,
        classes=classes,
        allocated=[taken],
    )
    assert devices(allocation) == ["gpu-0000-0f-00-0-mig-1g10gb-0"]


def test_whole_gpu_is_unavailable_while_a_partition_is_allocated(mig_node, classes):
    taken = allocated_claim("gpu-0000-07-00-0-mig-1g10gb-3", pool="node-m")
    allocation = allocate(claim(exact()), slices=mig_node, classes=classes, allocated=[taken])
    assert devices(allocation) == ["gpu-0000-0f-00-0"]


def test_counter_shortage_is_explained(mig_node, classes):
    taken = allocated_claim("gpu-0000-07-00-0", "gpu-0000-0f-00-0", pool="node-m")
    with pytest.raises(Unsatisfiable, match="shared counters"):
        allocate(
            claim(exact(cls="mig.dradriver.dev", selectors=[MIG.format("1g.10gb")])),
            slices=mig_node,
            classes=classes,
            allocated=[taken],
        )


def test_one_me_partition_per_gpu(mig_node, classes):
    allocation = allocate(
        claim(exact(cls="mig.dradriver.dev", count=2, selectors=[MIG.format("1g.10gb+me")])),
        slices=mig_node,
        classes=classes,
    )
    assert [d.split("-mig-")[0] for d in devices(allocation)] == ["gpu-0000-07-00-0", "gpu-0000-0f-00-0"]


# -- other claims, admin access, taints ---------------------------------------------------------------------


def test_devices_of_other_claims_are_skipped(whole_gpus, classes):
    allocation = allocate(
        claim(exact()), slices=whole_gpus, classes=classes, allocated=[allocated_claim("gpu-0000-07-00-0")]
    )
    assert devices(allocation) == ["gpu-0000-0f-00-0"]


def test_admin_access_may_use_allocated_devices(whole_gpus, classes):
    allocation = allocate(
        claim(exact(adminAccess=True)),
        slices=whole_gpus,
        classes=classes,
        allocated=[allocated_claim("gpu-0000-07-00-0")],
    )
    assert devices(allocation) == ["gpu-0000-07-00-0"]
    assert allocation["devices"]["results"][0]["adminAccess"] is True


def test_admin_access_allocations_do_not_block_others(whole_gpus, classes):
    allocation = allocate(
        claim(exact()),
        slices=whole_gpus,
        classes=classes,
        allocated=[allocated_claim("gpu-0000-07-00-0", admin=True)],
    )
    assert devices(allocation) == ["gpu-0000-07-00-0"]


def test_tainted_device_needs_a_toleration(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    for device in slices[0]["spec"]["devices"]:
        device["taints"] = [{"key": "dradriver.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
    with pytest.raises(Unsatisfiable, match=r"dradriver\.dev/unhealthy=xid-79:NoSchedule"):
        allocate(claim(exact()), slices=slices, classes=classes)
    tolerant = exact(tolerations=[{"key": "dradriver.dev/unhealthy", "operator": "Exists"}])
    allocation = allocate(claim(tolerant), slices=slices, classes=classes)
    assert allocation["devices"]["results"][0]["tolerations"][0]["operator"] == "Exists"


def test_taint_with_effect_none_does_not_block(whole_gpus, classes):
    slices = copy.deepcopy(whole_gpus)
    slices[0]["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "None"}]
    assert devices(allocate(claim(exact()), slices=slices, classes=classes)) == ["gpu-0000-07-00-0"]


# -- explain ------------------------------------------------------------------------------------------------


def test_explain_lists_matching_devices_and_the_allocation(whole_gpus, classes):
    report = explain_claim(claim(exact(count=2)), slices=whole_gpus, classes=classes, node="node-a")
    assert report.fits
    assert len(report.requests[0].matched) == 8
    assert report.requests[0].allocated == [
        "gpu.dradriver.dev/node-a/gpu-0000-07-00-0",
        "gpu.dradriver.dev/node-a/gpu-0000-0f-00-0",
    ]


def test_explain_reports_guard_hint_for_missing_attributes(whole_gpus, classes):
    report = explain_claim(claim(exact(selectors=[f'{A}.model == "x"'])), slices=whole_gpus, classes=classes)
    assert report.error and "CEL runtime error" in report.error
    assert any('"model" in device.attributes["gpu.dradriver.dev"]' in h for h in report.requests[0].hints)


@pytest.mark.parametrize("count", ["abc", [1], -1, 0, 1.5, True])
def test_a_count_that_is_not_a_positive_integer_is_an_error(whole_gpus, classes, count):
    # The API server requires count > 0 (an integer); an odd value must not crash or allocate nothing.
    with pytest.raises(AllocationError, match=r"request gpu: count"):
        allocate(claim(exact(count=count)), slices=whole_gpus, classes=classes, node="node-a")


def test_a_combinatorial_search_gives_up_with_an_error_as_the_scheduler_would(classes):
    # 64 alike GPUs on 4 PCIe roots; 5 with distinct roots cannot exist, and proving it means trying every
    # combination: the scheduler's filter timeout would fail the claim, and the search stops likewise.
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci000{i % 4}:00"},
            },
        }
        for i in range(64)
    ]
    slices = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {
                "driver": "gpu.dradriver.dev",
                "nodeName": "node-x",
                "devices": devices,
                "pool": {"name": "node-x", "generation": 1, "resourceSliceCount": 1},
            },
        }
    ]
    with pytest.raises(AllocationError, match="gave up after"):
        allocate(
            claim(exact(count=5), constraints=[{"distinctAttribute": "resource.kubernetes.io/pcieRoot"}]),
            slices=slices,
            classes=classes,
            max_attempts=20_000,
        )
