"""``dradriver explain --pod NS/NAME``: why is this pod Pending? Reads the cluster (GET and LIST only)."""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import quote

from dradriver.allocator.taints import with_taint_rules
from dradriver.cli.explain_input import Document
from dradriver.cli.explain_outcome import (
    EXIT_DOES_NOT_FIT,
    EXIT_FITS,
    EXIT_INVALID,
    ClaimOutcome,
    explain_document,
    outcome_dict,
    render_outcome,
)
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.errors import ConfigError
from dradriver.plugin.cluster import ClusterError, ForbiddenError, NotFoundError
from dradriver.plugin.cluster.kube import error_for_status, load_transport
from dradriver.quantity import parse_quantity

GROUP, VERSION = "resource.k8s.io", "v1"
API_VERSION = f"{GROUP}/{VERSION}"
# (connect, read) seconds per request: explain is interactive, a hung API server must not hang it.
REQUEST_TIMEOUT = (5.0, 60.0)
# Objects per LIST page, as kubectl asks for.
PAGE_SIZE = 500
RBAC_HINT = (
    "dradriver explain --pod needs get on pods, resourceclaims, resourceclaimtemplates and resourcequotas and list "
    "on events in the pod's namespace, and list on deviceclasses, resourceslices, resourceclaims and "
    "devicetaintrules cluster-wide"
)
# The resource-claim controller's event on a pod whose claim it could not create from a template: a ResourceQuota
# without room for the claim's devices, a webhook's refusal. Its message: "PodResourceClaim NAME: <error>".
CLAIM_CREATION_FAILED = "FailedResourceClaimCreation"
# What client-go's event recorder puts before a message once it has seen ten similar ones.
AGGREGATED = "(combined from similar events): "
# The quota admission plugin's refusal names the quota: "exceeded quota: NAME, requested: …".
EXCEEDED_QUOTA = re.compile(r"exceeded quota: ([^,\s]+)")
# … and what the claim asked of it: "requested: NAME=QUANTITY,NAME=QUANTITY, used: …".
REQUESTED = re.compile(r"requested: (\S+?), used: ")
# The statuses of a refused read: explain says so and goes on without what it would have read.
UNAUTHORIZED = (401, 403)


# A list's continue token in the page's raw JSON: the API server writes the list's metadata before its items.
_CONTINUE = re.compile(rb'"continue":"([^"\\]*)"')


def peek_continue(body: bytes) -> str:
    """The continue token in the metadata before a list page's items, read without parsing the page; "" where
    there is none or it cannot be told there (the parsed page then says)."""
    end = body.find(b'"items"')
    found = _CONTINUE.search(body, 0, end) if end > 0 else None
    return found.group(1).decode("ascii", "replace") if found else ""


class ClusterReader(Protocol):
    """The read-only cluster access ``--pod`` needs; every object is returned as its JSON dict.

    ``get_pod`` raises :class:`ConfigError` when the pod does not exist; the other getters return None."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_device_classes(self) -> list[dict[str, Any]]: ...

    def list_resource_slices(self) -> list[dict[str, Any]]: ...

    def list_claims(self) -> list[dict[str, Any]]: ...

    def list_device_taint_rules(self) -> list[dict[str, Any]]: ...

    def get_resource_quota(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_pod_events(self, namespace: str, pod_uid: str, reason: str) -> list[dict[str, Any]]:
        """Events about the pod with ``reason``; empty where the server serves none. Raises :class:`ClusterError`
        with status 401 or 403 where they may not be read (explain says so and goes on)."""
        ...


_KINDS = {
    "deviceclasses": "DeviceClass",
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "devicetaintrules": "DeviceTaintRule",
}


class KubernetesReader:
    """ClusterReader over the cluster adapters' transport (GET and LIST only).

    Bodies are read as raw JSON rather than through the client's models: those drop fields they do not
    know and reject values they do not expect, and explain must see what a newer API server sends."""

    def __init__(self, kubeconfig: str | None, context: str | None, *, page_size: int = PAGE_SIZE) -> None:
        self._api = load_transport(kubeconfig, context=context)
        self._page_size = page_size

    def close(self) -> None:
        """Release the connections."""
        self._api.close()

    def _request(self, path: str, what: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        return self._parse(self._fetch(path, what, query), what)

    def _fetch(self, path: str, what: str, query: list[tuple[str, str]] | None = None) -> bytes:
        """The body of a successful GET; an unreachable server is a ConfigError, a refusal a ClusterError."""
        host = self._api.endpoint.url
        try:
            response = self._api.request(
                "GET", path, query=query, headers={"Accept": "application/json"}, timeout=REQUEST_TIMEOUT
            )
            data: bytes = response.read()
        except OSError as exc:  # the transport's: unreachable, TLS, proxy, timeout, no HTTP
            raise ConfigError(
                f"cannot reach the API server at {host} to read {what}: {exc}; check --kubeconfig/--context"
            ) from exc
        if not 200 <= response.status <= 299:
            raise self._error(response.status, data, what)
        return data

    def _parse(self, data: bytes, what: str) -> dict[str, Any]:
        host = self._api.endpoint.url
        try:
            result = json.loads(data)
        except ValueError as exc:
            raise ConfigError(f"reading {what} from {host}: the answer is not JSON: {data[:200]!r}") from exc
        if not isinstance(result, dict):
            raise ConfigError(f"reading {what} from {host}: the answer is not a JSON object")
        return result

    @staticmethod
    def _error(status: int, body: bytes, what: str) -> ClusterError:
        error = error_for_status(status, body, what, "GET")
        if isinstance(error, ForbiddenError):
            return type(error)(f"{error}; {RBAC_HINT}", status=error.status, reason=error.reason)
        return error

    def _get(self, path: str, what: str) -> dict[str, Any] | None:
        try:
            return self._request(path, what)
        except NotFoundError:
            return None

    def _list(self, plural: str) -> list[dict[str, Any]]:
        """Every object of ``plural``, page by page. The next page is asked for while this one is parsed: the
        server encodes and sends it meanwhile (over a large fleet each takes about as long as the other). Its
        continue token is read from the page's first bytes, and checked against the parsed page: a token read
        wrongly costs the prefetch, never a page."""
        kind = _KINDS[plural]
        path, what = f"/apis/{GROUP}/{VERSION}/{plural}", f"{kind}s (all namespaces)"
        items: list[dict[str, Any]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain-list") as prefetch:
            body = self._fetch(path, what, self._page_query(""))
            while True:
                peeked = peek_continue(body)
                following = prefetch.submit(self._fetch, path, what, self._page_query(peeked)) if peeked else None
                page = self._parse(body, what)
                # Items of a list carry no apiVersion/kind of their own; the allocator wants whole objects.
                items += [{"apiVersion": API_VERSION, "kind": kind, **item} for item in page.get("items") or []]
                token = str((page.get("metadata") or {}).get("continue") or "")
                if following is not None and token != peeked:
                    wait([following])  # asked with a token the page does not give: its answer is not used
                    following = None
                if not token:
                    return items
                body = following.result() if following is not None else self._fetch(path, what, self._page_query(token))

    def _page_query(self, token: str) -> list[tuple[str, str]]:
        return [("limit", str(self._page_size))] + ([("continue", token)] if token else [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        pod = self._get(path, f"Pod {namespace}/{name}")
        if pod is None:
            raise ConfigError(f"pod {namespace}/{name} does not exist (check the namespace and name)")
        return pod

    def _get_namespaced(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{plural}/{quote(name)}"
        return self._get(path, f"{_KINDS[plural]} {namespace}/{name}")

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_namespaced("resourceclaims", namespace, name)

    def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_namespaced("resourceclaimtemplates", namespace, name)

    def list_device_classes(self) -> list[dict[str, Any]]:
        return self._list("deviceclasses")

    def list_resource_slices(self) -> list[dict[str, Any]]:
        return self._list("resourceslices")

    def list_claims(self) -> list[dict[str, Any]]:
        return self._list("resourceclaims")

    def get_resource_quota(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/api/v1/namespaces/{quote(namespace)}/resourcequotas/{quote(name)}"
        return self._get(path, f"ResourceQuota {namespace}/{name}")

    def list_pod_events(self, namespace: str, pod_uid: str, reason: str) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{quote(namespace)}/events"
        query = [("fieldSelector", f"involvedObject.uid={pod_uid},reason={reason}"), ("limit", str(self._page_size))]
        # Events only say why a claim was not created (which quota): from a server that serves none (a stand-in)
        # there is nothing to say; a refusal (401, 403) is the caller's to report.
        try:
            page = self._request(path, f"Events of pod {namespace} (uid {pod_uid})", query)
        except ClusterError as err:
            if err.status != 404:
                raise
            return []
        return [item for item in page.get("items") or [] if isinstance(item, dict)]

    def list_device_taint_rules(self) -> list[dict[str, Any]]:
        # resource.k8s.io/v1 serves DeviceTaintRules from 1.37; an older server has none there (a 404 for the path,
        # which names no object).
        try:
            return self._list("devicetaintrules")
        except ClusterError as err:
            if err.status != 404:
                raise
            return []


@dataclass
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims`` and what it resolved to.

    ``obj`` is the ResourceClaim (generated or named), or the ResourceClaimTemplate while the claim has
    not been generated yet; None, with ``error`` saying why, when neither exists."""

    name: str
    obj: dict[str, Any] | None
    error: str = ""


def pod_claims(reader: ClusterReader, pod: dict[str, Any]) -> list[PodClaim]:
    """Resolve every entry of the pod's ``spec.resourceClaims``, in order."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    statuses = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    found = []
    for index, entry in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
        name = str(entry.get("name"))
        field = f"spec.resourceClaims[{index}]"
        if entry.get("resourceClaimName"):
            claim_name = str(entry["resourceClaimName"])
            claim = reader.get_claim(namespace, claim_name)
            error = (
                ""
                if claim
                else f"ResourceClaim {namespace}/{claim_name} does not exist (named in "
                f"{field}.resourceClaimName; the pod stays Pending until it is created)"
            )
            found.append(PodClaim(name, claim, error))
        elif entry.get("resourceClaimTemplateName"):
            generated = statuses.get(name)
            claim = reader.get_claim(namespace, str(generated)) if generated else None
            if claim is not None:
                found.append(PodClaim(name, claim))
                continue
            template_name = str(entry["resourceClaimTemplateName"])
            template = reader.get_claim_template(namespace, template_name)
            error = (
                ""
                if template
                else f"ResourceClaimTemplate {namespace}/{template_name} does not exist (named in "
                f"{field}.resourceClaimTemplateName; no claim can be generated until it is created)"
            )
            found.append(PodClaim(name, template, error))
        else:
            found.append(PodClaim(name, None, f"{field} sets neither resourceClaimName nor resourceClaimTemplateName"))
    return found


@dataclass(frozen=True)
class CreationFailure:
    """Why the resource-claim controller could not create a pod claim's ResourceClaim from its template."""

    message: str
    quota: str  # the ResourceQuota that had no room for it, or "" when something else refused it
    time: str = ""  # when the event last saw the refusal (RFC 3339), "" where it says none
    quota_now: str = ""  # the quota as read now (QUOTA_FULL, QUOTA_HAS_ROOM, QUOTA_GONE, or why it is unknown)


# What the named ResourceQuota says now about the claim the controller could not create.
QUOTA_FULL, QUOTA_HAS_ROOM, QUOTA_GONE = "full", "has room", "gone"


@dataclass(frozen=True)
class CreationFailures:
    """The newest refusal of each pod claim (by its name in spec.resourceClaims), and why the pod's events could
    not be read ("" where they could)."""

    by_claim: dict[str, CreationFailure]
    unreadable: str = ""


def claim_creation_failures(reader: ClusterReader, pod: dict[str, Any]) -> CreationFailures:
    """The newest ``FailedResourceClaimCreation`` event of each pod claim, with its quota as it is now."""
    meta = pod.get("metadata") or {}
    if not meta.get("uid"):
        return CreationFailures({})
    namespace = str(meta.get("namespace") or "default")
    try:
        events = reader.list_pod_events(namespace, str(meta["uid"]), CLAIM_CREATION_FAILED)
    except ClusterError as err:
        if err.status not in UNAUTHORIZED:
            raise
        return CreationFailures({}, unreadable=str(err))
    failures: dict[str, CreationFailure] = {}
    for event in sorted(events, key=_event_time):
        message = str(event.get("message") or "").removeprefix(AGGREGATED)
        subject, _, error = message.partition(": ")
        if not subject.startswith("PodResourceClaim ") or not error:
            continue
        quota = EXCEEDED_QUOTA.search(error)
        failures[subject.removeprefix("PodResourceClaim ")] = CreationFailure(
            error, quota.group(1) if quota else "", _event_time(event)
        )
    return CreationFailures({name: _with_quota_now(reader, namespace, f) for name, f in failures.items()})


def _with_quota_now(reader: ClusterReader, namespace: str, failure: CreationFailure) -> CreationFailure:
    """``failure`` with what its quota says now: whether what the claim asked for fits in it."""
    if not failure.quota:
        return failure
    try:
        quota = reader.get_resource_quota(namespace, failure.quota)
    except ClusterError as err:
        if err.status not in (*UNAUTHORIZED, 404):  # a 404 here names no quota: a server that serves none
            raise
        return replace(failure, quota_now=f"cannot read it: {err}")
    if quota is None:
        return replace(failure, quota_now=QUOTA_GONE)
    requested = REQUESTED.search(failure.message)
    if requested is None:
        return replace(failure, quota_now="the refusal does not say what the claim asked for")
    return replace(failure, quota_now=QUOTA_HAS_ROOM if quota_has_room(quota, requested.group(1)) else QUOTA_FULL)


def quota_has_room(quota: dict[str, Any], requested: str) -> bool:
    """Whether ``requested`` ("NAME=QUANTITY,…", as the quota admission plugin names it) fits in what ``quota``'s
    status says is used of its hard limits: the figures admission checks a new claim against."""
    status = quota.get("status") or {}
    hard, used = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}, status.get("used") or {}
    for item in requested.split(","):
        name, _, amount = item.partition("=")
        wanted, limit = parse_quantity(amount), parse_quantity(hard.get(name))
        if wanted is None or limit is None:  # no limit on it (any more), or a figure we cannot read
            continue
        if (parse_quantity(used.get(name, 0)) or 0) + wanted > limit:
            return False
    return True


def _event_time(event: dict[str, Any]) -> str:
    # RFC 3339 in UTC: the strings sort as the times do.
    return str(event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
        "creationTimestamp") or "")  # fmt: skip


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node the scheduler may use for ``pod``, where the pod names one: ``spec.nodeName``, or a
    ``kubernetes.io/hostname`` node selector (taken as the node's name, as kubelets set it). Other node
    selectors and affinities are not evaluated: explain then considers every node."""
    spec = pod.get("spec") or {}
    pinned = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
    return str(pinned) if pinned else None


def explain_pod_with(reader: ClusterReader, pod_ref: str, output: str) -> int:
    """Explain every unallocated claim of pod ``NAMESPACE/NAME``; the explain exit status."""
    namespace, _, name = pod_ref.rpartition("/")
    if not name:
        raise ConfigError(f"--pod {pod_ref!r}: want NAMESPACE/NAME (NAME alone means namespace default)")
    namespace = namespace or "default"
    pod_ref = f"{namespace}/{name}"
    pod = reader.get_pod(namespace, name)
    claims = pod_claims(reader, pod)
    if not claims:
        print(f"pod {pod_ref} has no spec.resourceClaims: DRA is not why it is Pending")
        return EXIT_FITS
    errors = [f"pod {pod_ref} claim {c.name}: {c.error}" for c in claims if c.obj is None]
    pending = [c for c in claims if c.obj is not None and not _allocation(c.obj)]
    templates = any(_is_template(c.obj) for c in pending if c.obj)
    failures = claim_creation_failures(reader, pod) if templates else CreationFailures({})
    scheduled = bool((pod.get("spec") or {}).get("nodeName"))
    with _BulkRead() as bulk:
        cluster = _ClusterState.read(reader) if pending else _ClusterState([], [], [])
        bulk.done()
        results = [
            _explain_claim(claim, claim.obj, pod=pod, pod_ref=pod_ref, failures=failures, cluster=cluster,
                           scheduled=scheduled)
            for claim in claims
            if claim.obj is not None
        ]  # fmt: skip
    _render_pod(pod_ref, results, errors, output, failures.unreadable)
    if errors:
        return EXIT_INVALID
    waiting = any("notCreated" in r or "notGenerated" in r for r in results)
    fits = all(r["outcome"].fits for r in results if "outcome" in r) and not waiting
    return EXIT_FITS if fits else EXIT_DOES_NOT_FIT


class _BulkRead:
    """Python's cyclic garbage collector kept off the cluster's objects: paused while they are read, then (from
    :meth:`done`) not scanning them again until the block ends.

    Every slice, device and attribute is a dict: millions over a large fleet (500 dynamic-MIG nodes are 134 MB of
    JSON), none in a cycle. With the collector on, each of its collections during the read walks every object read
    so far: the pages of 5,000 whole-GPU and 500 such nodes took 5.1 s to parse and wrap, against 1.8 s with it
    paused (benchmarks/explain-fleet.json). Frozen after the read (``gc.freeze``), they stay out of the scans the
    allocator's own garbage triggers; the block's end returns them to the collector. A process that froze objects
    itself keeps its own freeze: nothing is frozen or thawed then."""

    def __enter__(self) -> _BulkRead:
        self._enabled = gc.isenabled()
        self._freezes = gc.get_freeze_count() == 0
        self._frozen = False
        gc.disable()
        return self

    def done(self) -> None:
        """The read is over: what it made is frozen, and the collector back as it was."""
        if self._freezes and not self._frozen:
            gc.freeze()
            self._frozen = True
        if self._enabled:
            gc.enable()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._frozen:
            gc.unfreeze()
        if self._enabled:
            gc.enable()


@dataclass(frozen=True)
class _ClusterState:
    """What a pending claim is explained against: the classes, the slices (with DeviceTaintRules' taints) and
    every claim of the cluster."""

    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    claims: list[dict[str, Any]]

    @staticmethod
    def read(reader: ClusterReader) -> _ClusterState:
        classes = reader.list_device_classes()
        # The scheduler adds the taints of DeviceTaintRules to the devices they select.
        slices = with_taint_rules(reader.list_resource_slices(), reader.list_device_taint_rules())
        return _ClusterState(classes, slices, reader.list_claims())


def _is_template(obj: dict[str, Any] | None) -> bool:
    return obj is not None and obj.get("kind") == "ResourceClaimTemplate"


def _explain_claim(
    claim: PodClaim,
    obj: dict[str, Any],
    *,
    pod: dict[str, Any],
    pod_ref: str,
    failures: CreationFailures,
    cluster: _ClusterState,
    scheduled: bool,
) -> dict[str, Any]:
    """One pod claim's result: allocated, not created (a refusal recorded), or explained against the cluster —
    from its template, flagged ``notGenerated``, where the claim is still to be created for an unscheduled pod."""
    allocation = _allocation(obj)
    if allocation:
        return {"podClaim": claim.name, "name": Document(obj, "").name, "allocated": allocation}
    if _is_template(obj) and claim.name in failures.by_claim:
        return {"podClaim": claim.name, "template": Document(obj, "").name, "notCreated": failures.by_claim[claim.name]}
    uid = (obj.get("metadata") or {}).get("uid")
    others = [c for c in cluster.claims if _allocation(c) and (c.get("metadata") or {}).get("uid") != uid]
    doc = Document(obj, f"pod {pod_ref} claim {claim.name}")
    outcome = explain_document(doc, slices=cluster.slices, classes=cluster.classes, allocated=others,
                               node=pinned_node(pod))  # fmt: skip
    result: dict[str, Any] = {"podClaim": claim.name, "outcome": outcome}
    if _is_template(obj) and not scheduled:
        # No claim yet, so nothing the scheduler can place: the template says what it will ask for, not that the
        # pod fits.
        result["notGenerated"] = doc.name
    return result


def _allocation(obj: dict[str, Any]) -> dict[str, Any] | None:
    allocation: dict[str, Any] | None = (obj.get("status") or {}).get("allocation")
    return allocation or None


def _allocated_node(allocation: dict[str, Any]) -> str:
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for match in term.get("matchFields") or []:
            if match.get("key") == "metadata.name" and match.get("values"):
                return str(match["values"][0])
    return ""


def _render_pod(pod_ref: str, results: list[dict[str, Any]], errors: list[str], output: str, unreadable: str) -> None:
    """The results as ``output`` asks; ``unreadable`` is why the pod's events could not be read ("" if they could)."""
    if output == "json":
        rendered = [_claim_json(result, unreadable) for result in results]
        json.dump({"pod": pod_ref, "errors": errors, "claims": rendered}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if not results:
        return
    print(f"pod {pod_ref}:")
    for result in results:
        outcome = result.get("outcome")
        if outcome is not None and "notGenerated" in result:
            print(_render_not_generated(result["podClaim"], result["notGenerated"], outcome, unreadable))
        elif outcome is not None:
            print(render_outcome(outcome))
        elif "notCreated" in result:
            print(_render_not_created(pod_ref, result["podClaim"], result["template"], result["notCreated"]))
        else:
            node = _allocated_node(result["allocated"])
            where = f" on node {node}" if node else ""
            print(f"claim {result['podClaim']}: ResourceClaim {result['name']} is already allocated{where}")


def _claim_json(result: dict[str, Any], unreadable: str) -> dict[str, Any]:
    """One claim's result as ``-o json`` prints it."""
    outcome: ClaimOutcome | None = result.get("outcome")
    if "notCreated" in result:
        failure: CreationFailure = result["notCreated"]
        return {"podClaim": result["podClaim"], "template": result["template"], "fits": False,
                "notCreated": failure.message, "quota": failure.quota, "refusedAt": failure.time,
                "quotaNow": failure.quota_now}  # fmt: skip
    if outcome is None:
        return {**result, "fits": True}
    described = outcome_dict(outcome)
    del described["source"]  # the object came from the API server, not a file
    if "notGenerated" not in result:
        return {"podClaim": result["podClaim"], **described}
    return {"podClaim": result["podClaim"], **described, "fits": False, "claimGenerated": False,
            "templateFits": outcome.fits, "eventsUnreadable": unreadable}  # fmt: skip


def _render_not_generated(pod_claim: str, template: str, outcome: ClaimOutcome, unreadable: str) -> str:
    lines = [f"claim {pod_claim}: no ResourceClaim generated yet from ResourceClaimTemplate {template}: the "
             f"scheduler does not consider the pod until the resource claim controller has created it"]  # fmt: skip
    if unreadable:
        lines.append(f"  why it has not been created is not known: the pod's events could not be read: {unreadable}")
    lines.append("  what the template asks for, once its claim exists:")
    lines += [f"  {line}" if line else line for line in render_outcome(outcome).splitlines()]
    return "\n".join(lines) + "\n"


def _render_not_created(pod_ref: str, pod_claim: str, template: str, failure: CreationFailure) -> str:
    lines = [f"claim {pod_claim}: no ResourceClaim could be created from ResourceClaimTemplate {template}: "
             f"{failure.message}"]  # fmt: skip
    if failure.time:
        lines.append(f"  last refused at {failure.time} (the pod's newest {CLAIM_CREATION_FAILED} event)")
    if failure.quota:
        lines.append(_quota_advice(pod_ref, failure))
    return "\n".join(lines)


def _quota_advice(pod_ref: str, failure: CreationFailure) -> str:
    """What to do about the quota that refused the claim, as it is now."""
    namespace, _, pod = pod_ref.partition("/")
    quota = f"ResourceQuota {namespace}/{failure.quota}"
    retry = (
        "the resource claim controller creates the claim at its next retry, which after repeated refusals can be "
        "minutes away; any change to the pod makes it retry at once (kubectl annotate --overwrite pod "
        f'{pod} -n {namespace} retried-at="$(date +%s)"), or wait'
    )
    if failure.quota_now == QUOTA_HAS_ROOM:
        return f"  {quota} has room for the claim's devices now: {retry}"
    if failure.quota_now == QUOTA_GONE:
        return f"  {quota} no longer exists: {retry}"
    advice = (
        f"free some (delete claims or pods of the namespace that hold them) or raise its limit (kubectl describe "
        f"resourcequota {failure.quota} -n {namespace}); the resource claim controller retries by itself"
    )
    if failure.quota_now == QUOTA_FULL:
        return f"  {quota} has no room for the claim's devices: {advice}"
    unknown = f"whether it has now is not known ({failure.quota_now})"
    return f"  {quota} had no room for the claim's devices; {unknown}: {advice}"


def explain_pod(args: argparse.Namespace) -> int:
    kube = KubeClientOptions.from_args(args)
    reader = KubernetesReader(kube.kubeconfig, kube.context)
    try:
        return explain_pod_with(reader, args.pod, args.output)
    finally:
        reader.close()
