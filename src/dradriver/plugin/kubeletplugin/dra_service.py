"""The DRA node services (v1 and v1beta1): NodePrepareResources and NodeUnprepareResources.

:class:`ClaimProcessor` holds the behaviour shared by both versions: check the kubelet's claim references,
fetch and check each claim, serialise per claim UID, call the driver's handler and isolate failures so that
every requested UID gets an entry and one bad claim never affects another. The two servicers only translate
protobuf messages (v1beta1 has no ``share_id``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import grpc

from dradriver.api.generated import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from dradriver.errors import DradriverError
from dradriver.faults import fault_point
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DriverHandler, PrepareResult
from dradriver.plugin.kubeletplugin.claims import (
    ClaimLocks,
    ClaimSource,
    allocated_claim,
    base_request_name,
    claim_problem,
    ref_problem,
)
from dradriver.plugin.kubeletplugin.device_metadata import DeviceMetadataWriter

logger = logging.getLogger(__name__)

# The kubelet's gRPC client keeps gRPC's default 4 MiB limit on a response; stay below it with room to spare.
KUBELET_MAX_RESPONSE_BYTES = 4 * 1024 * 1024 - 64 * 1024
_TRUNCATED = "... (truncated: the response to the kubelet was too large)"

_Outcome = TypeVar("_Outcome")
_Item = TypeVar("_Item")


def describe_exception(err: BaseException) -> str:
    """An exception as a one-line message for the kubelet: ours as they are, others with their type."""
    if isinstance(err, DradriverError):
        return str(err)
    return f"{type(err).__name__}: {err}"


class ClaimProcessor:
    """Runs prepare/unprepare batches from the kubelet through a :class:`DriverHandler`."""

    def __init__(
        self,
        *,
        driver_name: str,
        handler: DriverHandler,
        claim_source: ClaimSource,
        locks: ClaimLocks,
        claim_status: ClaimStatusWriter | None = None,
        device_metadata: DeviceMetadataWriter | None = None,
    ) -> None:
        self.driver_name = driver_name
        self._handler = handler
        self._claims = claim_source
        self._locks = locks
        self._claim_status = claim_status
        self._device_metadata = device_metadata
        self._calls = 0
        self._closing = False
        self._idle = threading.Condition()

    def open(self) -> None:
        """Accept calls again after :meth:`close` (a plugin started anew)."""
        with self._idle:
            self._closing = False

    def close(self, timeout: float) -> bool:
        """Refuse calls that have not reached the handler yet, and wait up to ``timeout`` seconds for those in
        progress: gRPC gives up on a call after its stop grace, but the thread running it goes on, and must not
        prepare or write status after the plugin let go of its lock. False if calls were still running."""
        with self._idle:
            self._closing = True
            return self._idle.wait_for(lambda: self._calls == 0, timeout)

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        with self._idle:
            self._calls += 1
        try:
            yield
        finally:
            with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    @staticmethod
    def _refused(ref: ClaimRef, what: str) -> str:
        """The error for a claim whose call reaches the handler only once the plugin is stopping."""
        return (
            f"the driver is shutting down and did not {what} claim {ref.namespace}/{ref.name}; "
            "the kubelet retries with the driver's next instance"
        )

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare the referenced claims; the result has an entry for every distinct UID in ``refs``."""
        with self._counted():
            return self._prepare(refs)

    def _prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        fetched: dict[str, AllocatedClaim] = {}
        raw: dict[str, Mapping[str, Any]] = {}
        for ref in _distinct(refs):
            problem = ref_problem(ref) or self._fetch(ref, fetched, raw)
            if problem is not None:
                logger.warning(
                    "cannot prepare claim uid=%s claim=%s/%s error=%s", ref.uid, ref.namespace, ref.name, problem
                )
                results[ref.uid] = PrepareResult(error=problem)
        if fetched:
            # Fetching happens outside the lock, as in the Go helper: a slow API server must not block
            # unrelated claims' unprepare calls.
            with self._locks.hold(fetched.keys()):
                outcomes = self._run_isolated(
                    list(fetched.items()),
                    lambda batch: self._handler.prepare_resource_claims([claim for _, claim in batch]),
                    "prepare",
                    refs={uid: claim.ref for uid, claim in fetched.items()},
                )
                for uid, outcome in outcomes.items():
                    results[uid] = self._with_metadata(raw[uid], self._check_prepare_result(uid, outcome))
                # Queued under the claim's lock, so the clear of an unprepare that follows comes after it.
                for uid in outcomes:
                    if self._claim_status is not None and results[uid].error is None:
                        self._claim_status.prepared(fetched[uid].ref, results[uid].devices)
        return results

    def _with_metadata(self, claim: Mapping[str, Any], result: PrepareResult) -> PrepareResult:
        """Add the device metadata files of a prepared claim (when enabled); their failure fails the claim,
        since its containers could not start with a CDI id that resolves to nothing."""
        if self._device_metadata is None or result.error:
            return result
        try:
            return PrepareResult(devices=self._device_metadata.write(claim, result.devices))
        except DradriverError as err:
            logger.warning("device metadata failed claim uid=%s error=%s", claim["metadata"]["uid"], err)
            return PrepareResult(error=str(err))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str | None]:
        """Unprepare the referenced claims; map each distinct UID in ``refs`` to an error or None."""
        with self._counted():
            return self._unprepare(refs)

    def _unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str | None]:
        results: dict[str, str | None] = {}
        valid: list[tuple[str, ClaimRef]] = []
        for ref in _distinct(refs):
            problem = ref_problem(ref)
            if problem is not None:
                logger.warning("cannot unprepare claim uid=%s error=%s", ref.uid, problem)
                results[ref.uid] = problem
            else:
                valid.append((ref.uid, ref))
        if valid:
            with self._locks.hold([uid for uid, _ in valid]):
                outcomes = self._run_isolated(
                    valid,
                    lambda batch: self._handler.unprepare_resource_claims([ref for _, ref in batch]),
                    "unprepare",
                    refs=dict(valid),
                )
                if self._device_metadata is not None:
                    outcomes = {uid: self._remove_metadata(uid, outcome) for uid, outcome in outcomes.items()}
                refs_by_uid = dict(valid)
                for uid, outcome in outcomes.items():
                    results[uid] = outcome.message if isinstance(outcome, _Failure) else outcome or None
                    # Under the claim's lock too: a prepare that follows queues its write after this clear.
                    if self._claim_status is not None and results[uid] is None:
                        self._claim_status.unprepared(refs_by_uid[uid])
        return results

    def _remove_metadata(self, uid: str, outcome: str | _Failure | None) -> str | _Failure | None:
        if self._device_metadata is None or isinstance(outcome, _Failure) or outcome:
            return outcome
        try:
            self._device_metadata.remove(uid)
        except DradriverError as err:
            return _Failure(str(err))
        return outcome

    def _fetch(self, ref: ClaimRef, into: dict[str, AllocatedClaim], raw: dict[str, Mapping[str, Any]]) -> str | None:
        """GET and check the claim; the handler gets its typed view, the device metadata writer its JSON."""
        try:
            claim = self._claims.get_resource_claim(ref.namespace, ref.name)
            fault_point("claim-fetched")
        except Exception as err:
            return f"cannot get claim {ref} from the API server: {describe_exception(err)}"
        problem = claim_problem(claim, ref, self.driver_name)
        if problem is None:
            into[ref.uid] = allocated_claim(claim, ref, self.driver_name)
            raw[ref.uid] = claim
        return problem

    def _run_isolated(
        self,
        batch: list[tuple[str, _Item]],
        call: Callable[[list[tuple[str, _Item]]], Mapping[str, _Outcome]],
        what: str,
        *,
        refs: Mapping[str, ClaimRef],
    ) -> dict[str, _Outcome | _Failure]:
        """Call the handler on ``batch``; if it raises, call it claim by claim so that one claim's fault stays
        that claim's error. Every UID of ``batch`` gets an outcome; none reaches the handler once the plugin
        is stopping (``refs`` names the claims for that error)."""
        with self._idle:
            if self._closing:
                return {uid: _Failure(self._refused(refs[uid], what)) for uid, _ in batch}
        try:
            returned = call(batch)
        except Exception as err:
            if len(batch) == 1:
                uid = batch[0][0]
                logger.exception("driver failed to %s claim uid=%s", what, uid)
                return {uid: _Failure(f"{what} failed: {describe_exception(err)}")}
            logger.warning(
                "driver failed to %s a batch of %d claims, retrying one by one error=%s",
                what,
                len(batch),
                describe_exception(err),
            )
            outcomes: dict[str, _Outcome | _Failure] = {}
            for item in batch:
                outcomes.update(self._run_isolated([item], call, what, refs=refs))
            return outcomes
        outcomes = {}
        for uid, _ in batch:
            if uid in returned:
                outcomes[uid] = returned[uid]
            else:
                outcomes[uid] = _Failure(f"driver returned no {what} result for claim UID {uid}")
        extra = set(returned) - set(outcomes)
        if extra:
            logger.warning("driver returned %s results for claims it was not asked about uids=%s", what, sorted(extra))
        return outcomes

    def _check_prepare_result(self, uid: str, outcome: PrepareResult | _Failure) -> PrepareResult:
        """The kubelet's view of a handler's result. Its types are the handler's contract (checked statically);
        what they cannot rule out is checked here: an error beside devices, an empty pool or device name."""
        if isinstance(outcome, _Failure):
            return PrepareResult(error=outcome.message)
        if outcome.error:
            return PrepareResult(error=outcome.error)
        devices = []
        for device in outcome.devices:
            if not device.pool or not device.device:
                return PrepareResult(
                    error=f"driver returned a device without pool or device name for claim UID {uid}: {device}"
                )
            # The kubelet names requests by their base name (a firstAvailable "req/sub" is "req").
            devices.append(
                replace(device, requests=tuple(dict.fromkeys(base_request_name(r) for r in device.requests)))
            )
        return PrepareResult(devices=tuple(devices))


class _Failure:
    """A per-claim failure produced by the plugin layer itself (as opposed to a value from the handler)."""

    def __init__(self, message: str) -> None:
        self.message = message


def _distinct(refs: Iterable[ClaimRef]) -> list[ClaimRef]:
    """The first reference for each UID: the response map is keyed by UID, so a UID is handled once."""
    seen: dict[str, ClaimRef] = {}
    for ref in refs:
        seen.setdefault(ref.uid, ref)
    return list(seen.values())


class _ClaimsResponse(Protocol):
    """What all four DRA response messages share: a map from claim UID to an entry with ``error``."""

    @property
    def claims(self) -> Mapping[str, Any]: ...

    def ByteSize(self) -> int: ...


def fit_for_kubelet(response: _ClaimsResponse, limit: int = KUBELET_MAX_RESPONSE_BYTES) -> None:
    """Shorten per-claim error messages until ``response`` fits the kubelet's receive limit.

    A huge batch of failing claims could otherwise produce a response the kubelet rejects as a whole,
    failing every claim in it; a shortened message still names what went wrong first.
    """
    size = response.ByteSize()
    if size <= limit:
        return
    failed = [entry for entry in response.claims.values() if entry.error]
    if failed:
        error_bytes = sum(len(entry.error.encode()) for entry in failed)
        room = max(limit - (size - error_bytes), 0)
        keep = max(room // len(failed) - len(_TRUNCATED), 16)
        for entry in failed:
            if len(entry.error.encode()) > keep + len(_TRUNCATED):
                entry.error = entry.error[:keep] + _TRUNCATED
    if response.ByteSize() > limit:
        logger.error(
            "response for %d claims is %d bytes, over the kubelet's limit of %d; it will fail",
            len(response.claims),
            response.ByteSize(),
            limit,
        )


def _refs(claims: Iterable[dra_v1_pb2.Claim | dra_v1beta1_pb2.Claim]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


_Response = TypeVar("_Response", bound=_ClaimsResponse)


def _prepare(
    processor: ClaimProcessor,
    claims: Iterable[dra_v1_pb2.Claim | dra_v1beta1_pb2.Claim],
    response: _Response,
    *,
    share_ids: bool,
) -> _Response:
    """Fill either version's NodePrepareResourcesResponse (``share_ids``: the version has the field)."""
    for uid, result in processor.prepare(_refs(claims)).items():
        entry = response.claims[uid]
        if result.error:
            entry.error = result.error
            continue
        for device in result.devices:
            out = entry.devices.add(
                request_names=device.requests,
                pool_name=device.pool,
                device_name=device.device,
                cdi_device_ids=device.cdi_device_ids,
            )
            if share_ids and device.share_id is not None:
                out.share_id = device.share_id
    fit_for_kubelet(response)
    return response


def _unprepare(
    processor: ClaimProcessor, claims: Iterable[dra_v1_pb2.Claim | dra_v1beta1_pb2.Claim], response: _Response
) -> _Response:
    """Fill either version's NodeUnprepareResourcesResponse."""
    for uid, error in processor.unprepare(_refs(claims)).items():
        response.claims[uid].error = error or ""
    fit_for_kubelet(response)
    return response


class DRAPluginV1(dra_v1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` (kubelet 1.34 and later)."""

    def __init__(self, processor: ClaimProcessor) -> None:
        self._processor = processor

    def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        return _prepare(self._processor, request.claims, dra_v1_pb2.NodePrepareResourcesResponse(), share_ids=True)

    def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        return _unprepare(self._processor, request.claims, dra_v1_pb2.NodeUnprepareResourcesResponse())


class DRAPluginV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelet 1.32, 1.33): v1 without ``share_id``."""

    def __init__(self, processor: ClaimProcessor) -> None:
        self._processor = processor

    def NodePrepareResources(
        self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        return _prepare(
            self._processor, request.claims, dra_v1beta1_pb2.NodePrepareResourcesResponse(), share_ids=False
        )

    def NodeUnprepareResources(
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        return _unprepare(self._processor, request.claims, dra_v1beta1_pb2.NodeUnprepareResourcesResponse())


def add_dra_services(server: grpc.Server, processor: ClaimProcessor) -> None:
    """Serve both DRA versions on ``server``."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(processor), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DRAPluginV1beta1(processor), server)
