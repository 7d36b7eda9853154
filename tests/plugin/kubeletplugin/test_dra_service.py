"""ClaimProcessor: every requested claim gets an answer, and one claim's problem stays that claim's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from support.kubelet_plugin_fakes import CDI_VENDOR, DRIVER, FakeClaimSource, FakeHandler, make_claim

from dradriver.errors import ClaimError
from dradriver.plugin.handler import (
    AllocatedClaim,
    AllocatedDevice,
    ClaimRef,
    DeviceConfig,
    PreparedDevice,
    PrepareResult,
)
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor


@pytest.fixture
def processor(claims: FakeClaimSource, handler: FakeHandler) -> ClaimProcessor:
    return ClaimProcessor(driver_name=DRIVER, handler=handler, claim_source=claims, locks=ClaimLocks())


def ref(name: str, uid: str | None = None, namespace: str = "default") -> ClaimRef:
    return ClaimRef(namespace=namespace, name=name, uid=uid if uid is not None else f"uid-{name}")


def test_prepare_returns_the_handlers_devices(processor: ClaimProcessor, claims: FakeClaimSource) -> None:
    claims.add(make_claim("a", "uid-a"))
    result = processor.prepare([ref("a")])
    assert result == {
        "uid-a": PrepareResult(
            devices=(
                PreparedDevice(
                    pool="node-a", device="gpu-0", requests=("gpu",), cdi_device_ids=(f"{CDI_VENDOR}=uid-a-gpu-0",)
                ),
            )
        )
    }


def test_prepare_hands_the_handler_the_typed_claim_with_its_reference(
    processor: ClaimProcessor, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    seen: list[Any] = []
    original = handler.prepare_resource_claims

    def spy(batch: Any) -> Any:
        seen.extend(batch)
        return original(batch)

    handler.prepare_resource_claims = spy  # type: ignore[method-assign]
    claim = make_claim("a", "uid-a")
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {"kind": "X"}}},
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {}}},
    ]
    claims.add(claim)
    processor.prepare([ref("a")])
    assert seen == [
        AllocatedClaim(
            ref=ref("a"),
            devices=(AllocatedDevice(request="gpu", pool="node-a", device="gpu-0"),),
            config=(DeviceConfig(source="FromClaim", requests=("gpu",), parameters={"kind": "X"}),),
        )
    ]


def test_subrequest_suffixes_are_stripped_from_request_names(
    processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    claims.add(
        make_claim(
            "a", "uid-a", results=[{"request": "gpu/large", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]
        )
    )
    [device] = processor.prepare([ref("a")])["uid-a"].devices
    assert device.requests == ("gpu",)


def test_share_id_is_passed_through(processor: ClaimProcessor, claims: FakeClaimSource) -> None:
    share = "4f0a51b3-6c1f-4d0e-9c8e-2b7f3f7b9a10"
    claims.add(
        make_claim(
            "a",
            "uid-a",
            results=[{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": share}],
        )
    )
    [device] = processor.prepare([ref("a")])["uid-a"].devices
    assert device.share_id == share


@pytest.mark.parametrize(
    "case",
    [
        (ref("a", uid=""), make_claim("a", "uid-a"), "empty uid"),
        (ref("", uid="uid-x"), None, "empty name"),
        (ref("a", namespace=""), make_claim("a", "uid-a"), "empty namespace"),
        (ref("missing"), None, "cannot get claim default/missing (UID uid-missing) from the API server"),
        (
            ref("a", uid="uid-old"),
            make_claim("a", "uid-new"),
            "claim default/a was replaced: UID in the API server is uid-new, the kubelet asked for uid-old",
        ),
        (ref("a"), make_claim("a", "uid-a", allocated=False), "is not allocated"),
        (
            ref("a"),
            make_claim(
                "a", "uid-a", results=[{"request": "gpu", "driver": "other.example.com", "pool": "p", "device": "d"}]
            ),
            "has no devices allocated by driver gpu.example.com",
        ),
        (
            ref("a"),
            {"metadata": {"uid": "uid-a"}, "status": {"allocation": {"devices": {"results": "x"}}}},
            "results is missing or not a list",
        ),
        (
            ref("a"),
            {
                "metadata": {"uid": "uid-a"},
                "status": {"allocation": {"devices": {"results": [{"driver": DRIVER, "device": "d"}]}}},
            },
            "lacks request, pool",
        ),
    ],
    ids=[
        "empty-uid",
        "empty-name",
        "empty-namespace",
        "unknown-claim",
        "uid-mismatch",
        "not-allocated",
        "other-driver",
        "malformed-results",
        "malformed-result",
    ],
)
def test_bad_claims_get_an_error_and_do_not_affect_a_good_one(
    processor: ClaimProcessor,
    claims: FakeClaimSource,
    handler: FakeHandler,
    case: tuple[ClaimRef, dict[str, Any] | None, str],
) -> None:
    claim_ref, stored, expected = case
    if stored is not None:
        stored.setdefault("metadata", {}).update(name=claim_ref.name or "a", namespace="default")
        claims.add(stored)
    claims.add(make_claim("good", "uid-good"))
    result = processor.prepare([claim_ref, ref("good")])
    assert set(result) == {claim_ref.uid, "uid-good"}
    assert expected in (result[claim_ref.uid].error or "")
    assert result["uid-good"].error is None and result["uid-good"].devices
    assert handler.prepare_batches == [["uid-good"]]


def test_a_failed_get_fails_only_that_claim(processor: ClaimProcessor, claims: FakeClaimSource) -> None:
    claims.add(make_claim("a", "uid-a"))
    claims.add(make_claim("b", "uid-b"))
    claims.errors["a"] = ConnectionError("apiserver unreachable")
    result = processor.prepare([ref("a"), ref("b")])
    assert result["uid-a"].error == (
        "cannot get claim default/a (UID uid-a) from the API server: ConnectionError: apiserver unreachable"
    )
    assert result["uid-b"].error is None


def test_a_handler_exception_becomes_only_the_faulty_claims_error(
    processor: ClaimProcessor, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    for name in ("a", "b", "c"):
        claims.add(make_claim(name, f"uid-{name}"))
    handler.raise_for = {"uid-b"}
    result = processor.prepare([ref("a"), ref("b"), ref("c")])
    assert result["uid-b"].error == "prepare failed: RuntimeError: simulated driver failure for ['uid-b']"
    assert result["uid-a"].devices and result["uid-c"].devices
    # The batch raised, so the layer retried claim by claim.
    assert handler.prepare_batches == [["uid-a", "uid-b", "uid-c"], ["uid-a"], ["uid-b"], ["uid-c"]]


def test_our_own_errors_reach_the_kubelet_without_a_type_prefix(
    processor: ClaimProcessor, claims: FakeClaimSource
) -> None:
    class Failing(FakeHandler):
        def prepare_resource_claims(self, claims: Any) -> Any:
            raise ClaimError("claim default/a: opaque config field sharing.strategy is unknown")

    failing = ClaimProcessor(driver_name=DRIVER, handler=Failing(), claim_source=claims, locks=ClaimLocks())
    claims.add(make_claim("a", "uid-a"))
    error = failing.prepare([ref("a")])["uid-a"].error
    assert error == "prepare failed: claim default/a: opaque config field sharing.strategy is unknown"


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ({}, "driver returned no prepare result for claim UID uid-a"),
        ({"uid-a": PrepareResult(devices=(PreparedDevice(pool="", device="d"),))}, "without pool or device"),
        ({"uid-a": PrepareResult(devices=(PreparedDevice(pool="p", device="d"),), error="boom")}, "boom"),
    ],
)
def test_handler_results_the_types_cannot_rule_out_become_claim_errors(
    claims: FakeClaimSource, returned: Mapping[str, PrepareResult], expected: str
) -> None:
    """A missing claim, an empty pool or device name, an error beside devices: values, not types (the handler's
    types are checked statically, so the layer does not check them again at run time)."""

    class Odd(FakeHandler):
        def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
            return returned

    odd = ClaimProcessor(driver_name=DRIVER, handler=Odd(), claim_source=claims, locks=ClaimLocks())
    claims.add(make_claim("a", "uid-a"))
    result = odd.prepare([ref("a")])["uid-a"]
    assert expected in (result.error or "") and not result.devices


def test_a_uid_sent_twice_is_handled_once(
    processor: ClaimProcessor, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    claims.add(make_claim("a", "uid-a"))
    assert list(processor.prepare([ref("a"), ref("a")])) == ["uid-a"]
    assert handler.prepare_batches == [["uid-a"]]


def test_a_huge_batch_is_answered_completely(processor: ClaimProcessor, claims: FakeClaimSource) -> None:
    refs = []
    for i in range(5000):
        if i % 2 == 0:
            claims.add(make_claim(f"c{i}", f"uid-{i}"))
        refs.append(ref(f"c{i}", uid=f"uid-{i}"))
    result = processor.prepare(refs)
    assert len(result) == 5000
    assert all((result[f"uid-{i}"].error is None) == (i % 2 == 0) for i in range(5000))


def test_unprepare_answers_every_claim(processor: ClaimProcessor, handler: FakeHandler) -> None:
    handler.unprepare_errors = {"uid-b": "cannot remove CDI spec for claim default/b"}
    handler.raise_for = {"uid-c"}
    result = processor.unprepare([ref("a"), ref("b"), ref("c"), ref("d", uid="")])
    assert result["uid-a"] is None
    assert result["uid-b"] == "cannot remove CDI spec for claim default/b"
    assert result["uid-c"] == "unprepare failed: RuntimeError: simulated driver failure for ['uid-c']"
    assert "empty uid" in (result[""] or "")
    # Unprepare never asks the API server: the claim may be gone already.
    assert [r.uid for r in handler.unprepare_batches[0]] == ["uid-a", "uid-b", "uid-c"]


def test_unprepare_answers_a_claim_the_handler_left_out_with_an_error(claims: FakeClaimSource) -> None:
    class Forgetful(FakeHandler):
        def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
            return {}

    forgetful = ClaimProcessor(driver_name=DRIVER, handler=Forgetful(), claim_source=claims, locks=ClaimLocks())
    assert forgetful.unprepare([ref("a")])["uid-a"] == "driver returned no unprepare result for claim UID uid-a"


def test_fit_for_kubelet_shortens_errors_to_fit_the_limit() -> None:
    from dradriver.api.generated import dra_v1_pb2
    from dradriver.plugin.kubeletplugin.dra_service import fit_for_kubelet

    response = dra_v1_pb2.NodePrepareResourcesResponse()
    for i in range(100):
        response.claims[f"uid-{i}"].error = f"claim {i} failed: " + "x" * 1000
    response.claims["ok"].devices.add(pool_name="p", device_name="d")
    fit_for_kubelet(response, limit=20_000)
    assert response.ByteSize() <= 20_000
    assert response.claims["uid-7"].error.startswith("claim 7 failed: ")
    assert response.claims["uid-7"].error.endswith("(truncated: the response to the kubelet was too large)")
    assert len(response.claims["ok"].devices) == 1


def test_once_closed_no_call_reaches_the_handler_and_each_claim_says_why(
    processor: ClaimProcessor, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    claims.add(make_claim("a", "uid-a"))
    assert processor.close(timeout=1.0)
    prepared = processor.prepare([ref("a")])
    assert "shutting down and did not prepare claim default/a" in (prepared["uid-a"].error or "")
    unprepared = processor.unprepare([ref("a")])
    assert "shutting down and did not unprepare claim default/a" in (unprepared["uid-a"] or "")
    assert handler.prepare_batches == [] and handler.unprepare_batches == []
    processor.open()
    assert processor.prepare([ref("a")])["uid-a"].error is None
