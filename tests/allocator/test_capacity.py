"""Consumable capacity: devices with allowMultipleAllocations shared by requests and claims within their
capacity, requestPolicy rounding, shareID and consumedCapacity in results, and the explanations."""

import copy
import re
import uuid

import pytest

from dradriver.allocator import AllocationError, Unsatisfiable, allocate, explain_claim, stable_share_id

A = 'device.attributes["gpu.dradriver.dev"]'
GPU0, GPU1, GPU2, GPU3 = "gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-47-00-0", "gpu-0000-4e-00-0"
RANGE = f'{A}.uuid == "GPU-node-s-0000"'  # memory: default 10Gi, validRange 10Gi..40Gi step 10Gi
VALUES = f'{A}.uuid == "GPU-node-s-0001"'  # memory: default 20Gi, validValues 10/20/40/80Gi
FREE = f'{A}.uuid == "GPU-node-s-0002"'  # memory: no requestPolicy
EXCLUSIVE = f'{A}.uuid == "GPU-node-s-0003"'
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def request(name="gpu", memory=None, selector=None, count=None, **capacity):
    body = {"deviceClassName": "gpu.dradriver.dev"}
    wanted = dict(capacity)
    if memory is not None:
        wanted["memory"] = memory
    if wanted:
        body["capacity"] = {"requests": wanted}
    if selector:
        body["selectors"] = [{"cel": {"expression": selector}}]
    if count is not None:
        body["count"] = count
    return {"name": name, "exactly": body}


def claim(*requests, name="test", constraints=None):
    devices = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def allocated(claim_obj, allocation):
    done = copy.deepcopy(claim_obj)
    done["status"] = {"allocation": allocation}
    return done


def results(allocation):
    return allocation["devices"]["results"]


def only(allocation):
    (result,) = results(allocation)
    return result


# -- sharing --------------------------------------------------------------------------------------------


def test_two_claims_share_one_device_within_its_memory(shared_gpus, classes):
    first = claim(request(memory="30Gi", selector=FREE), name="first")
    one = allocate(first, slices=shared_gpus, classes=classes, node="node-s")
    second = claim(request(memory="40Gi", selector=FREE), name="second")
    two = allocate(second, slices=shared_gpus, classes=classes, allocated=[allocated(first, one)])
    assert only(one)["device"] == only(two)["device"] == GPU2
    assert only(one)["consumedCapacity"] == {"memory": "30Gi"}
    assert only(two)["consumedCapacity"] == {"memory": "40Gi"}
    assert only(one)["shareID"] != only(two)["shareID"]


def test_a_third_claim_that_does_not_fit_in_what_is_left_is_unsatisfiable(shared_gpus, classes):
    others = []
    for name, memory in (("a", "30Gi"), ("b", "40Gi")):
        other = claim(request(memory=memory, selector=FREE), name=name)
        others.append(allocated(other, allocate(other, slices=shared_gpus, classes=classes, allocated=others)))
    third = claim(request(memory="20Gi", selector=FREE), name="c")
    with pytest.raises(Unsatisfiable) as info:
        allocate(third, slices=shared_gpus, classes=classes, allocated=others, node="node-s")
    assert f"capacity memory: 20Gi requested, 10Gi left of 80Gi on gpu.dradriver.dev/node-s/{GPU2}" in str(info.value)
    # 10Gi is exactly what is left
    fits = claim(request(memory="10Gi", selector=FREE), name="d")
    assert only(allocate(fits, slices=shared_gpus, classes=classes, allocated=others))["device"] == GPU2


def test_consumed_capacity_of_allocated_claims_is_counted(shared_gpus, classes):
    other = {
        "metadata": {"name": "other", "namespace": "default", "uid": "uid-other"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": "gpu.dradriver.dev",
                            "pool": "node-s",
                            "device": GPU2,
                            "shareID": "0b6f9e34-8d41-4c1e-a1f5-0d7f3c2b9e11",
                            "consumedCapacity": {"memory": "75Gi"},
                        }
                    ]
                }
            }
        },
    }
    small = claim(request(memory="5Gi", selector=FREE))
    assert only(allocate(small, slices=shared_gpus, classes=classes, allocated=[other]))["device"] == GPU2
    with pytest.raises(Unsatisfiable, match="6Gi requested, 5Gi left of 80Gi"):
        allocate(claim(request(memory="6Gi", selector=FREE)), slices=shared_gpus, classes=classes, allocated=[other])


def test_a_result_without_share_id_takes_the_whole_shareable_device(shared_gpus, classes):
    exclusive = {
        "metadata": {"name": "other", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": "gpu.dradriver.dev", "pool": "node-s", "device": GPU2}]
                }
            }
        },
    }
    report = explain_claim(
        claim(request(memory="1Gi", selector=FREE)), slices=shared_gpus, classes=classes, allocated=[exclusive]
    )
    assert not report.fits
    assert report.requests[0].rejected[f"gpu.dradriver.dev/node-s/{GPU2}"] == "allocated to another claim"


def test_requests_of_one_claim_share_a_device_but_their_sum_must_fit(shared_gpus, classes):
    both = claim(request("a", memory="50Gi", selector=FREE), request("b", memory="30Gi", selector=FREE))
    allocation = allocate(both, slices=shared_gpus, classes=classes)
    assert [r["device"] for r in results(allocation)] == [GPU2, GPU2]
    assert len({r["shareID"] for r in results(allocation)}) == 2

    too_much = claim(request("a", memory="50Gi", selector=FREE), request("b", memory="31Gi", selector=FREE))
    report = explain_claim(too_much, slices=shared_gpus, classes=classes)
    assert not report.fits
    assert [r.matched for r in report.requests] == [[f"gpu.dradriver.dev/node-s/{GPU2}"]] * 2
    assert "capacity of a shared (allowMultipleAllocations) device" in report.summary()


def test_one_request_never_gets_the_same_device_twice(shared_gpus, classes):
    with pytest.raises(Unsatisfiable, match="only 1 of the 2 wanted devices pass every filter"):
        allocate(claim(request(memory="10Gi", selector=FREE, count=2)), slices=shared_gpus, classes=classes)
    allocation = allocate(claim(request(memory="10Gi", count=3)), slices=shared_gpus, classes=classes)
    assert [r["device"] for r in results(allocation)] == [GPU0, GPU1, GPU2]


# -- requestPolicy --------------------------------------------------------------------------------------


def test_request_without_an_amount_consumes_the_policy_default_or_everything(shared_gpus, classes):
    ranged = allocate(claim(request(selector=RANGE)), slices=shared_gpus, classes=classes)
    assert only(ranged)["consumedCapacity"] == {"memory": "10Gi", "multiprocessors": "0"}
    valued = allocate(claim(request(selector=VALUES)), slices=shared_gpus, classes=classes)
    assert only(valued)["consumedCapacity"] == {"memory": "20Gi", "multiprocessors": "0"}
    whole = allocate(claim(request(selector=FREE)), slices=shared_gpus, classes=classes)
    assert only(whole)["consumedCapacity"] == {"memory": "80Gi"}


def test_valid_values_round_up_to_the_next_valid_value(shared_gpus, classes):
    allocation = allocate(claim(request(memory="25Gi", selector=VALUES)), slices=shared_gpus, classes=classes)
    assert only(allocation)["consumedCapacity"]["memory"] == "40Gi"
    exact = allocate(claim(request(memory="10Gi", selector=VALUES)), slices=shared_gpus, classes=classes)
    assert only(exact)["consumedCapacity"]["memory"] == "10Gi"


def test_valid_range_rounds_up_to_min_plus_whole_steps(shared_gpus, classes):
    for asked, consumed in (("25Gi", "30Gi"), ("5Gi", "10Gi"), ("40Gi", "40Gi"), ("10737418241", "20Gi")):
        allocation = allocate(claim(request(memory=asked, selector=RANGE)), slices=shared_gpus, classes=classes)
        assert only(allocation)["consumedCapacity"]["memory"] == consumed, asked


def test_rounded_amounts_are_what_fills_the_device(shared_gpus, classes):
    others = []
    for name in ("a", "b"):  # 25Gi each, rounded to 30Gi: 60Gi of 80Gi taken
        other = claim(request(memory="25Gi", selector=RANGE), name=name)
        others.append(allocated(other, allocate(other, slices=shared_gpus, classes=classes, allocated=others)))
    with pytest.raises(Unsatisfiable, match=r"25Gi requested \(30Gi after requestPolicy rounding\), 20Gi left"):
        allocate(claim(request(memory="25Gi", selector=RANGE)), slices=shared_gpus, classes=classes, allocated=others)


def test_amounts_above_the_policy_maximum_do_not_match(shared_gpus, classes):
    with pytest.raises(
        Unsatisfiable, match=re.escape("50Gi requested, but requestPolicy.validRange allows at most 40Gi")
    ):
        allocate(claim(request(memory="50Gi", selector=RANGE)), slices=shared_gpus, classes=classes)
    with pytest.raises(Unsatisfiable, match=re.escape("requestPolicy.validValues are 10Gi, 20Gi, 40Gi, 80Gi")):
        allocate(claim(request(memory="81Gi", selector=VALUES)), slices=shared_gpus, classes=classes)
    rounded = "45Gi requested (50Gi after requestPolicy rounding), but requestPolicy.validRange allows at most 40Gi"
    with pytest.raises(Unsatisfiable, match=re.escape(rounded)):
        allocate(claim(request(memory="45Gi", selector=RANGE)), slices=shared_gpus, classes=classes)
    # without a selector, the first device that allows 50Gi is taken instead
    allocation = allocate(claim(request(memory="50Gi")), slices=shared_gpus, classes=classes)
    assert only(allocation)["device"] == GPU1
    assert only(allocation)["consumedCapacity"]["memory"] == "80Gi"


def test_a_request_for_a_capacity_the_device_lacks_does_not_match(shared_gpus, classes):
    asked = request(selector=FREE, **{"gpu.dradriver.dev/bandwidth": "10G"})
    with pytest.raises(Unsatisfiable, match=re.escape("asks for capacity gpu.dradriver.dev/bandwidth, which device")):
        allocate(claim(asked), slices=shared_gpus, classes=classes)


def test_exclusive_devices_only_check_that_the_amount_fits(shared_gpus, classes):
    allocation = allocate(claim(request(memory="80Gi", selector=EXCLUSIVE)), slices=shared_gpus, classes=classes)
    assert only(allocation) == {
        "request": "gpu",
        "driver": "gpu.dradriver.dev",
        "pool": "node-s",
        "device": GPU3,
    }
    with pytest.raises(Unsatisfiable, match="capacity memory: 81Gi requested, 80Gi left of 80Gi"):
        allocate(claim(request(memory="81Gi", selector=EXCLUSIVE)), slices=shared_gpus, classes=classes)


def test_invalid_capacity_request_is_an_error_naming_the_field(shared_gpus, classes):
    with pytest.raises(AllocationError, match=r"request gpu: capacity.requests\[memory\]: .*40Gi"):
        allocate(claim(request(memory="lots")), slices=shared_gpus, classes=classes)


# -- results --------------------------------------------------------------------------------------------


def test_share_id_is_a_stable_lowercase_uuid_and_can_be_injected(shared_gpus, classes):
    wanted = claim(request(memory="10Gi", selector=FREE))
    first = only(allocate(wanted, slices=shared_gpus, classes=classes))
    again = only(allocate(wanted, slices=shared_gpus, classes=classes))
    assert UUID.match(first["shareID"])
    assert first["shareID"] == again["shareID"]
    assert first["shareID"] == stable_share_id("uid-test", "gpu", ("gpu.dradriver.dev", "node-s", GPU2))

    seen = []

    def share_ids(claim_key, request_name, device):
        seen.append((claim_key, request_name, device))
        return str(uuid.UUID(int=len(seen)))

    injected = only(allocate(wanted, slices=shared_gpus, classes=classes, share_ids=share_ids))
    assert injected["shareID"] == "00000000-0000-0000-0000-000000000001"
    assert seen == [("uid-test", "gpu", ("gpu.dradriver.dev", "node-s", GPU2))]


# -- constraints ----------------------------------------------------------------------------------------


def test_distinct_attribute_spreads_requests_over_shared_devices(shared_gpus, classes):
    two = (request("a", memory="10Gi"), request("b", memory="10Gi"))
    together = allocate(claim(*two), slices=shared_gpus, classes=classes)
    assert [r["device"] for r in results(together)] == [GPU0, GPU0]
    spread = allocate(
        claim(*two, constraints=[{"distinctAttribute": "gpu.dradriver.dev/uuid"}]),
        slices=shared_gpus,
        classes=classes,
    )
    assert [r["device"] for r in results(spread)] == [GPU0, GPU1]
    same_root = allocate(
        claim(*two, constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
        slices=shared_gpus,
        classes=classes,
    )
    assert [r["device"] for r in results(same_root)] == [GPU0, GPU0]


def test_distinct_attribute_cannot_be_met_by_one_shared_device(shared_gpus, classes):
    pinned = (request("a", memory="10Gi", selector=FREE), request("b", memory="10Gi", selector=FREE))
    report = explain_claim(
        claim(*pinned, constraints=[{"distinctAttribute": "gpu.dradriver.dev/uuid"}]),
        slices=shared_gpus,
        classes=classes,
    )
    assert not report.fits
    assert any("distinctAttribute gpu.dradriver.dev/uuid" in line for line in report.explanation)


# -- shared counters ------------------------------------------------------------------------------------


def _counter_slice():
    counters = [{"counterSet": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "spec": {
                "driver": "gpu.dradriver.dev",
                "nodeName": "node-c",
                "pool": {"name": "node-c", "generation": 1, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
                "devices": [
                    {
                        "name": "shared",
                        "allowMultipleAllocations": True,
                        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "shared"}},
                        "capacity": {"memory": {"value": "80Gi"}},
                        "consumesCounters": counters,
                    },
                    {
                        "name": "whole",
                        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "whole"}},
                        "consumesCounters": counters,
                    },
                ],
            },
        }
    ]


def test_shares_of_a_device_take_its_shared_counters_once(classes):
    slices = _counter_slice()
    three = claim(*(request(f"r{i}", memory="20Gi", selector=f'{A}.uuid == "shared"') for i in range(3)))
    allocation = allocate(three, slices=slices, classes=classes)
    assert [r["device"] for r in results(allocation)] == ["shared"] * 3
    with pytest.raises(Unsatisfiable, match="shared counters"):
        allocate(
            claim(request(selector=f'{A}.uuid == "whole"')),
            slices=slices,
            classes=classes,
            allocated=[allocated(three, allocation)],
        )


# -- explanations ---------------------------------------------------------------------------------------


def test_explain_shows_a_capacity_stage_and_names_the_capacity(shared_gpus, classes):
    other = claim(request(memory="60Gi", selector=FREE), name="other")
    taken = allocated(other, allocate(other, slices=shared_gpus, classes=classes))
    report = explain_claim(
        claim(request(memory="30Gi", selector=FREE)), slices=shared_gpus, classes=classes, allocated=[taken]
    )
    assert not report.fits
    stages = [(s.label, s.entered, s.passed) for s in report.requests[0].stages]
    assert ("capacity available", 1, 0) in stages
    reason = f"capacity memory: 30Gi requested, 20Gi left of 80Gi on gpu.dradriver.dev/node-s/{GPU2}"
    assert report.requests[0].rejected[f"gpu.dradriver.dev/node-s/{GPU2}"] == reason
    assert reason in report.summary()


def test_explain_of_a_fitting_claim_shows_share_id_and_consumed_capacity(shared_gpus, classes):
    report = explain_claim(claim(request(memory="30Gi")), slices=shared_gpus, classes=classes)
    assert report.fits
    assert report.allocation is not None
    assert only(report.allocation)["consumedCapacity"] == {"memory": "30Gi", "multiprocessors": "0"}
    assert report.requests[0].allocated == [f"gpu.dradriver.dev/node-s/{GPU0}"]
    assert [s.label for s in report.requests[0].stages][-1] == "capacity available"


def test_all_mode_takes_every_device_with_enough_capacity(shared_gpus, classes):
    every = {
        "name": "all",
        "exactly": {
            "deviceClassName": "gpu.dradriver.dev",
            "allocationMode": "All",
            "capacity": {"requests": {"memory": "50Gi"}},
        },
    }
    allocation = allocate(claim(every), slices=shared_gpus, classes=classes)
    assert [r["device"] for r in results(allocation)] == [GPU1, GPU2, GPU3]


def test_invalid_consumed_capacity_of_an_allocated_claim_is_an_error_naming_it(shared_gpus, classes):
    other = claim(request(memory="10Gi", selector=FREE), name="other")
    done = allocated(other, allocate(other, slices=shared_gpus, classes=classes))
    done["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"memory": "ten"}
    with pytest.raises(AllocationError, match=r"claim default/other: .*results\[0\]\.consumedCapacity\[memory\]"):
        allocate(claim(request(memory="10Gi")), slices=shared_gpus, classes=classes, allocated=[done])
