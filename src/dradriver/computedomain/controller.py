"""The ComputeDomain controller: per domain, the workload claim template, the daemon claim template and the
DaemonSet of IMEX daemons; clique indices; status and conditions; finalizer and a deletion that never hangs.
With ``host_managed`` (``--imex-mode hostManaged``) the workload template alone: the hosts' own IMEX services serve
every domain, and a domain is Ready once admitted (:meth:`Controller._converge_host_managed`).

Level-triggered: :meth:`Controller.reconcile` converges one domain from what exists (a :class:`Snapshot`), so a
missed event, a restart or a failover loses nothing. What exists comes from informers' caches
(``watching.py``, the default), or with ``--watch false`` from lists each pass (:meth:`Controller.sync`). Writes
happen only on a difference, and the controller is the only writer of daemon indices
and of ComputeDomain status, so the daemons (one per node) never rewrite one shared object: each applies its
own clique entry (server-side apply), the controller numbers them.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dradriver.computedomain import api, metrics
from dradriver.computedomain.kube import Rest, path_of
from dradriver.errors import DradriverError
from dradriver.plugin.cluster.port import ClusterError, ConflictError, NotFoundError

log = logging.getLogger(__name__)

# A pass that has made no progress (finished no domain) for this long is stuck: every request has its own timeout
# of about 35 s, and a domain makes a few. /livez then fails and the Deployment restarts the replica. An API outage
# or a slow API server ends requests with errors or late instead, which a restart would not cure.
STUCK_AFTER_SECONDS = 300.0

CONTROLLER_MANAGER = "dradriver-cd-controller"
DAEMON_CONTAINER = "imex-daemon"
PROBE_TIMEOUT = 10
# The Ready and DaemonsReady reason of a domain admitted under --imex-mode hostManaged.
HOST_MANAGED_REASON = "HostManagedIMEX"


@dataclass(frozen=True)
class ControllerSettings:
    namespace: str  # the driver's: daemon DaemonSets, their claim templates and the cliques live here
    image: str
    daemon_service_account: str = "dradriver-compute-domain-daemon"
    daemon_command: tuple[str, ...] = ("dradriver", "cd-daemon")
    max_nodes_per_domain: int = api.MAX_NODES_PER_IMEX_DOMAIN
    # Daemon pods in the node's network, and more environment for them: for nodes whose pods cannot reach the API
    # server through its service address (no kube-proxy or CNI yet), as the chart's plugin pod can be set up too.
    daemon_host_network: bool = False
    daemon_env: tuple[dict[str, Any], ...] = ()
    # ``--imex-mode hostManaged``: no IMEX daemon per domain (no DaemonSet, no daemon template, no cliques).
    host_managed: bool = False
    # ``--compat``'s: the group of the ComputeDomains it serves, and every name it writes (labels, classes, driver).
    names: api.ComputeDomainNames = api.OURS


@dataclass
class Snapshot:
    """What exists, listed once per pass."""

    domains: list[dict[str, Any]]
    cliques: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    daemonsets: dict[str, dict[str, Any]]  # name: metadata
    templates: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    by_uid: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A live list of domain ``uid``'s daemon pods, asked before a clique entry is dropped for want of its pod:
    # for snapshots from caches, where the pods' may lag the cliques' (None: ``pods`` is fresh enough).
    confirm_pods: Callable[[str], list[dict[str, Any]]] | None = None


class Controller:
    """Converges every ComputeDomain; :meth:`sync` is one pass, :meth:`run` passes until stopped (while leading)."""

    def __init__(self, rest: Rest, settings: ControllerSettings) -> None:
        self.rest = rest
        self.settings = settings
        self.ns = settings.namespace
        self.names = settings.names
        self._progress_at: float | None = None  # monotonic: the running pass's last step; None between passes
        # Objects whose name a create found taken by one not made for its domain: read, not created again, each
        # pass until that object goes (a POST every pass would be a steady write for nothing).
        self._taken: set[str] = set()

    # -- one pass --------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        label = self.names.domain_label
        # What domains left behind is listed before the domains: an object made for a domain created meanwhile
        # then always has its domain in the list, so the sweep never mistakes it for an orphan.
        cliques = self.rest.list(path_of(self.names.api_version, "computedomaincliques", self.ns))
        pods = self.rest.list(path_of("v1", "pods", self.ns), labels=label)
        daemonsets = {
            d["metadata"]["name"]: d["metadata"]
            for d in self.rest.list(path_of("apps/v1", "daemonsets", self.ns), labels=label)
        }
        templates = self.rest.list(path_of("resource.k8s.io/v1", "resourceclaimtemplates"), labels=label)
        nodes = self.rest.list(path_of("v1", "nodes"), labels=label)
        domains = self.rest.list(path_of(self.names.api_version, "computedomains"))
        snap = Snapshot(domains, cliques, pods, daemonsets, templates, nodes)
        snap.by_uid = {d["metadata"]["uid"]: d for d in snap.domains}
        return snap

    def sync(self) -> None:
        """One pass over everything; an error on one domain does not stop the others."""
        snap = self.snapshot()
        self._progressed()
        for domain in snap.domains:
            self.reconcile(domain, snap)
            self._progressed()
        self._sweep(snap)
        metrics.record_domains(snap.domains)

    def reconcile(self, domain: dict[str, Any], snap: Snapshot) -> bool:
        """Converge (or take apart, once deleted) one domain as ``snap`` shows what exists (its objects at least);
        whether it converged: False after an error (logged, counted) or while something stops it (its Ready
        condition says what), so a caller driven by events tries it again later. A conflict (the domain or a
        clique changed since it was read) is not an error: the change's own event brings the domain back."""
        meta = domain["metadata"]
        operation = "delete" if meta.get("deletionTimestamp") else "converge"
        try:
            if operation == "delete":
                self._delete(domain, snap)
                return True
            return not self._converge(domain, snap)
        except ConflictError as err:
            log.info("domain changed meanwhile, again domain=%s/%s error=%s", meta["namespace"], meta["name"], err)
        except (ClusterError, DradriverError) as err:
            metrics.RECONCILE_ERRORS.labels(operation).inc()
            log.warning("reconcile failed domain=%s/%s error=%s", meta["namespace"], meta["name"], err)
        return False

    def sweep(self, uid: str, snap: Snapshot) -> None:
        """Remove what the vanished domain ``uid`` left (its objects as ``snap`` shows them)."""
        log.info("removing what a vanished domain left uid=%s", uid)
        self._delete({"metadata": {"uid": uid, "namespace": "", "name": ""}}, snap)

    # -- a live domain ---------------------------------------------------------------------------------

    def _converge(self, domain: dict[str, Any], snap: Snapshot) -> list[str]:
        """Make the domain's objects, number its daemons, write its status; what stops it converging."""
        meta = domain["metadata"]
        uid = meta["uid"]
        try:
            spec = api.parse_spec(domain)
        except DradriverError as err:
            self._write_status(domain, [], error=str(err))
            return []  # the spec is immutable: trying again cannot help
        domain = self._add_finalizer(domain)
        names = self._template_names(uid, snap)
        if self.settings.host_managed:
            return self._converge_host_managed(domain, snap, names, spec.channel.resource_claim_template.name)
        daemon_name = api.daemon_object_name(uid)
        problems: list[str] = []
        if (self.ns, daemon_name) not in names:
            problems += self._create(
                path_of("resource.k8s.io/v1", "resourceclaimtemplates", self.ns), self._daemon_template(uid), uid
            )
        if daemon_name not in snap.daemonsets:
            problems += self._create(path_of("apps/v1", "daemonsets", self.ns), self._daemonset(uid), uid)
        workload = spec.channel.resource_claim_template.name
        if (meta["namespace"], workload) not in names:
            problems += self._create(
                path_of("resource.k8s.io/v1", "resourceclaimtemplates", meta["namespace"]),
                self._workload_template(domain),
                uid,
            )
        nodes = self._number_cliques(uid, snap, problems)
        # The status is written whatever failed: a domain whose objects cannot be made says why.
        self._write_status(domain, nodes, num_nodes=spec.num_nodes, error="; ".join(problems), reason="CannotConverge")
        return problems

    def _add_finalizer(self, domain: dict[str, Any]) -> dict[str, Any]:
        """The domain with our finalizer (added now unless it has it)."""
        meta = domain["metadata"]
        if self.names.finalizer in (meta.get("finalizers") or []):
            return domain
        return self.rest.json_patch(
            path_of(self.names.api_version, "computedomains", meta["namespace"], meta["name"]),
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                _add_finalizer_op(meta, self.names.finalizer),
            ],
        )

    def _template_names(self, uid: str, snap: Snapshot) -> set[tuple[str, str]]:
        """``(namespace, name)`` of every claim template made for domain ``uid``."""
        return {
            (t["metadata"]["namespace"], t["metadata"]["name"])
            for t in snap.templates
            if t["metadata"].get("labels", {}).get(self.names.domain_label) == uid
        }

    def _converge_host_managed(
        self, domain: dict[str, Any], snap: Snapshot, names: set[tuple[str, str]], workload: str
    ) -> list[str]:
        """``--imex-mode hostManaged``: the workload template only, and the domain Ready once admitted (its spec
        valid, our finalizer on, its workload template made). Ready says nothing of the hosts' IMEX services: each
        node's is asked at prepare, and a pod waits in ContainerCreating until it answers READY.

        What a domain has left from ``driverManaged`` (its DaemonSet and daemon template, its cliques) is removed
        once idle, when no Node carries its label: a labelled Node runs a workload that still uses the daemon
        there (the plugin unlabels it at that claim's unprepare), and it keeps its daemon until then."""
        meta = domain["metadata"]
        uid = meta["uid"]
        problems: list[str] = []
        if (meta["namespace"], workload) not in names:
            problems += self._create(
                path_of("resource.k8s.io/v1", "resourceclaimtemplates", meta["namespace"]),
                self._workload_template(domain),
                uid,
            )
        left = api.daemon_object_name(uid) in snap.daemonsets
        busy = sorted(
            n["metadata"]["name"] for n in snap.nodes if left and _labels(n).get(self.names.domain_label) == uid
        )
        if busy:
            log.info("daemons left from driverManaged kept while nodes use them domain=%s nodes=%s", uid, busy)
        else:
            self._remove_daemons(uid, snap, names)
        self._write_host_managed_status(domain, problems, busy)
        return problems

    def _remove_daemons(self, uid: str, snap: Snapshot, names: set[tuple[str, str]]) -> None:
        """Delete domain ``uid``'s DaemonSet, daemon template and cliques where ``snap`` shows them (ours: each
        listed by our label for that domain)."""
        daemon_name = api.daemon_object_name(uid)
        if (self.ns, daemon_name) in names:
            self._delete_templates(uid, snap, only=daemon_name)
            log.info("removed the daemon template left from driverManaged domain=%s", uid)
        if daemon_name in snap.daemonsets:
            self._finalize_and_delete(
                path_of("apps/v1", "daemonsets", self.ns, daemon_name), snap.daemonsets[daemon_name]
            )
            log.info("removed the DaemonSet left from driverManaged domain=%s", uid)
        for clique in snap.cliques:
            if _labels(clique).get(self.names.domain_label) == uid:
                self.rest.delete(
                    path_of(self.names.api_version, "computedomaincliques", self.ns, clique["metadata"]["name"])
                )

    def _write_host_managed_status(self, domain: dict[str, Any], problems: list[str], busy: list[str]) -> None:
        """Ready (the domain admitted) unless its workload template could not be made; no nodes listed."""
        if problems:
            self._write_status(domain, [], error="; ".join(problems), reason="CannotConverge")
            return
        left = (
            f"; the DaemonSet left from driverManaged stays until node(s) {', '.join(busy)} unprepare its "
            "workloads' channels"
            if busy
            else ""
        )
        self._write_status(
            domain,
            [],
            host_managed=(
                "admitted (--imex-mode hostManaged): no IMEX daemon per domain; each node's own nvidia-imex "
                f"service is asked at prepare, and a pod waits until it answers READY{left}"
            ),
        )

    def _create(self, path: str, body: dict[str, Any], uid: str) -> list[str]:
        """Create ``body``; what went wrong, for the domain's Ready condition (nothing when it was made)."""
        meta = body["metadata"]
        what = f"{body['kind']} {meta['namespace']}/{meta['name']}"
        taken = (
            f"{what} exists but was not made for this ComputeDomain (no label {self.names.domain_label}={uid}): "
            "delete or rename that object, or recreate the ComputeDomain naming another "
            "spec.channel.resourceClaimTemplate.name"
        )
        key = f"{path}/{meta['name']}"
        if key in self._taken:
            try:
                existing = self.rest.get(key)
            except NotFoundError:
                self._taken.discard(key)  # gone: ours can be made now
            except ClusterError as err:
                return [f"{taken} (reading it again failed: {err})"]
            else:
                if (existing["metadata"].get("labels") or {}).get(self.names.domain_label) != uid:
                    return [taken]
                self._taken.discard(key)
                return []
        try:
            self.rest.create(path, body)
            log.info("created kind=%s name=%s", body["kind"], meta["name"])
            return []
        except ConflictError:
            # Made since the list (a pass of an earlier leader): the next pass sees it. Unless it is not ours:
            # an object of that name without our label is never listed, and would be created again forever.
            try:
                existing = self.rest.get(key)
            except ClusterError:
                return []
            if (existing["metadata"].get("labels") or {}).get(self.names.domain_label) == uid:
                return []
            log.warning("name taken by an object not made for the domain object=%s uid=%s", what, uid)
            self._taken.add(key)
            return [taken]
        except ClusterError as err:
            log.warning("create failed object=%s error=%s", what, err)
            return [f"creating {what} failed ({err}): see the controller's log, and its RBAC if it was refused"]

    def _number_cliques(self, uid: str, snap: Snapshot, problems: list[str]) -> list[dict[str, Any]]:
        """Give every daemon of the domain an index (lowest free, kept for as long as its entry lives) and
        drop entries of nodes that no longer run a daemon of it in that clique; the domain's ``status.nodes``.

        A daemon is live in a clique when its pod (on that node, not being deleted) carries the clique's label:
        a node that moved to another clique leaves its old entry behind, which must go, or the node would be
        listed twice and the API server would refuse every status write (``status.nodes`` is a map by name)."""
        live = self._confirmed_live(uid, snap)
        nodes: list[dict[str, Any]] = []
        for clique in snap.cliques:
            labels = clique["metadata"].get("labels", {})
            if labels.get(self.names.domain_label) != uid:
                continue
            for d in self._converge_clique(clique, live):
                if d.get("index") is None:
                    problems.append(
                        f"clique {clique['metadata']['name']} is full: node {d.get('nodeName')} got no index (at "
                        f"most {self.settings.max_nodes_per_domain} daemons, --max-nodes-per-imex-domain); keep "
                        "the job within that many nodes of one clique"
                    )
                    continue
                nodes.append(
                    {
                        "name": d["nodeName"],
                        "ipAddress": d.get("ipAddress", ""),
                        "cliqueID": d.get("cliqueID", ""),
                        "index": d["index"],
                        "status": d.get("status") or api.NOT_READY,
                    }
                )
        # Nodes without multi-node NVLink run a daemon that joins no clique: reported from the pod, index -1.
        for pod in snap.pods:
            labels = pod["metadata"].get("labels", {})
            if labels.get(self.names.domain_label) == uid and labels.get(self.names.clique_label, None) == "":
                nodes.append(
                    {
                        "name": pod["spec"].get("nodeName", ""),
                        "ipAddress": pod.get("status", {}).get("podIP", ""),
                        "cliqueID": "",
                        "index": -1,
                        "status": api.READY if _pod_ready(pod) else api.NOT_READY,
                    }
                )
        unique: dict[str, dict[str, Any]] = {}
        for node in nodes:
            if node["name"] in unique:
                # Two live daemons of one domain on a node (a rollout): one entry, as the list-map demands.
                log.warning("node listed twice domain=%s node=%s", uid, node["name"])
                continue
            unique[node["name"]] = node
        return sorted(unique.values(), key=lambda n: n["name"])

    def _confirmed_live(self, uid: str, snap: Snapshot) -> set[tuple[str | None, str | None]]:
        """``(node, clique ID)`` of domain ``uid``'s live daemons; where one of its clique entries would go for
        want of its pod, as one live list of the domain's pods (``snap.confirm_pods``) says."""
        live = _live_daemons(uid, snap.pods, self.names)
        mine = [c for c in snap.cliques if _labels(c).get(self.names.domain_label) == uid]
        if snap.confirm_pods is not None and any(
            len(_live_entries(c, live, self.names)) != len(c.get("daemons") or []) for c in mine
        ):
            # The pods' cache may not have the daemon's pod yet (its clique entry came first): the API server
            # says. Rare: an entry goes only when its daemon does.
            others = [p for p in snap.pods if _labels(p).get(self.names.domain_label) != uid]
            snap.pods = others + snap.confirm_pods(uid)
            live = _live_daemons(uid, snap.pods, self.names)
        return live

    def _converge_clique(
        self, clique: dict[str, Any], live: set[tuple[str | None, str | None]]
    ) -> list[dict[str, Any]]:
        """The clique's entries once those of nodes without a live daemon in it are gone and the rest numbered."""
        daemons = _live_entries(clique, live, self.names)
        if len(daemons) != len(clique.get("daemons") or []):
            clique = self._drop_entries(clique, {d["nodeName"] for d in daemons})
            daemons = clique.get("daemons") or []
        if any(d.get("index") is None for d in daemons):
            clique = self._assign_indices(clique, daemons)
            daemons = clique.get("daemons") or []
        return list(daemons)

    def _drop_entries(self, clique: dict[str, Any], keep: set[str]) -> dict[str, Any]:
        meta = clique["metadata"]
        operations: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}
        ]
        for position, entry in reversed(list(enumerate(clique.get("daemons") or []))):
            if entry.get("nodeName") not in keep:
                operations.append({"op": "remove", "path": f"/daemons/{position}"})
                log.info("dropping clique entry clique=%s node=%s", meta["name"], entry.get("nodeName"))
        return self.rest.json_patch(
            path_of(self.names.api_version, "computedomaincliques", self.ns, meta["name"]), operations
        )

    def _assign_indices(self, clique: dict[str, Any], daemons: list[dict[str, Any]]) -> dict[str, Any]:
        taken = {d["index"] for d in daemons if d.get("index") is not None}
        indices: dict[str, int] = {d["nodeName"]: d["index"] for d in daemons if d.get("index") is not None}
        numbered = len(indices)
        for d in sorted(daemons, key=lambda d: d["nodeName"]):
            if d.get("index") is not None:
                continue
            free = next((i for i in range(self.settings.max_nodes_per_domain) if i not in taken), None)
            if free is None:
                log.warning(
                    "clique full: no index left clique=%s node=%s max=%d",
                    clique["metadata"]["name"],
                    d["nodeName"],
                    self.settings.max_nodes_per_domain,
                )
                continue
            taken.add(free)
            indices[d["nodeName"]] = free
        if len(indices) == numbered:
            return clique  # a full clique: nothing new to number, nothing to write until an index frees up
        body = {
            "apiVersion": self.names.api_version,
            "kind": "ComputeDomainClique",
            "metadata": {"name": clique["metadata"]["name"], "namespace": self.ns},
            "daemons": [{"nodeName": node, "index": index} for node, index in sorted(indices.items())],
        }
        return self.rest.apply(
            path_of(self.names.api_version, "computedomaincliques", self.ns, clique["metadata"]["name"]),
            body,
            manager=CONTROLLER_MANAGER,
        )

    def _write_status(
        self,
        domain: dict[str, Any],
        nodes: list[dict[str, Any]],
        *,
        num_nodes: int = 0,
        error: str = "",
        reason: str = "InvalidSpec",
        host_managed: str = "",
    ) -> None:
        """Write the domain's status where it differs. ``host_managed``: the Ready message of a domain admitted
        under ``--imex-mode hostManaged`` (Ready, and DaemonsReady: it has no daemons of its own to wait for)."""
        old = domain.get("status") or {}
        if host_managed and not error:
            conditions = [
                _condition(old, "Ready", true=True, reason=HOST_MANAGED_REASON, message=host_managed, domain=domain),
                _condition(
                    old,
                    "DaemonsReady",
                    true=True,
                    reason=HOST_MANAGED_REASON,
                    message="no daemons of its own: the hosts' nvidia-imex services serve it",
                    domain=domain,
                ),
            ]
            status: dict[str, Any] = {"status": api.READY, "nodes": nodes, "conditions": conditions}
        else:
            status = _daemons_status(old, domain, nodes, num_nodes=num_nodes, error=error, reason=reason)
        if _comparable(old) == _comparable(status):
            return
        meta = domain["metadata"]
        self.rest.merge_patch(
            path_of(self.names.api_version, "computedomains", meta["namespace"], meta["name"]) + "/status",
            {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
        )

    # -- deletion --------------------------------------------------------------------------------------

    def _delete(self, domain: dict[str, Any], snap: Snapshot) -> None:
        """Take the domain apart without waiting on anything that could wait on us: the workload template,
        the DaemonSet and its template, the node labels (which ends every daemon), the cliques; then the
        finalizer. Running workload pods keep their channels until they end (unprepare needs no domain)."""
        meta = domain["metadata"]
        uid = meta["uid"]
        self._delete_templates(uid, snap)
        daemon_name = api.daemon_object_name(uid)
        daemonset = path_of("apps/v1", "daemonsets", self.ns, daemon_name)
        if daemon_name in snap.daemonsets:
            self._finalize_and_delete(daemonset, snap.daemonsets[daemon_name])
        else:
            self.rest.delete(daemonset)
        self._unlabel_nodes(uid, snap)
        for clique in snap.cliques:
            if clique["metadata"].get("labels", {}).get(self.names.domain_label) == uid:
                self.rest.delete(
                    path_of(self.names.api_version, "computedomaincliques", self.ns, clique["metadata"]["name"])
                )
        finalizers = meta.get("finalizers") or []
        if self.names.finalizer in finalizers:
            self.rest.json_patch(
                path_of(self.names.api_version, "computedomains", meta["namespace"], meta["name"]),
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                    {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(self.names.finalizer)}"},
                ],
            )
            log.info("domain deleted domain=%s/%s uid=%s", meta["namespace"], meta["name"], uid)

    def _delete_templates(self, uid: str, snap: Snapshot, *, only: str = "") -> None:
        """Delete the claim templates ``snap`` lists for domain ``uid`` (only the one named ``only``, if given)."""
        for template in snap.templates:
            tmeta = template["metadata"]
            if tmeta.get("labels", {}).get(self.names.domain_label) == uid and only in ("", tmeta["name"]):
                path = path_of("resource.k8s.io/v1", "resourceclaimtemplates", tmeta["namespace"], tmeta["name"])
                whole = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", **template}
                self._finalize_and_delete(path, tmeta, whole=whole)

    def _finalize_and_delete(self, path: str, meta: dict[str, Any], *, whole: dict[str, Any] | None = None) -> None:
        """Delete the object at ``path`` (``meta`` its metadata as listed), our names' finalizer taken off first.
        Ours never carries it, but NVIDIA's controller puts resource.nvidia.com/computeDomain on the templates and
        DaemonSets it makes and takes it off itself before deleting them; under --compat nvidia we adopt those by
        label, and a DELETE alone would leave them Terminating for good. Gone meanwhile is done; one deleted already
        (Terminating on another's finalizer) is not deleted again at every pass.

        A ``whole`` object (a claim template) is written back without it, as NVIDIA's controller does: the API
        server compares an opaque config's parameters as the bytes they were written with and refuses a patch of a
        ResourceClaimTemplate ("spec: field is immutable": a patch re-encodes them, keys sorted), not a PUT that sends
        them as they came (kube.Rest writes compact JSON, as NVIDIA's Go controller did). Otherwise (a DaemonSet,
        cached as metadata) a JSON patch. Either is refused if the object changed since it was listed (a conflict:
        tried again)."""
        finalizers = list(meta.get("finalizers") or [])
        if self.names.finalizer in finalizers:
            try:
                if whole is not None:
                    kept = [f for f in finalizers if f != self.names.finalizer]
                    self.rest.update(path, {**whole, "metadata": {**meta, "finalizers": kept}})
                else:
                    self.rest.json_patch(
                        path,
                        [
                            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                            {"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(self.names.finalizer)}"},
                        ],
                    )
            except NotFoundError:
                return
            log.info("removed the finalizer NVIDIA's controller set path=%s", path)
        if meta.get("deletionTimestamp"):
            return  # deleted already: what holds it now is another's finalizer, and a second DELETE changes nothing
        self.rest.delete(path)

    def _unlabel_nodes(self, uid: str, snap: Snapshot) -> None:
        for node in snap.nodes:
            if node["metadata"].get("labels", {}).get(self.names.domain_label) == uid:
                self.rest.merge_patch(
                    path_of("v1", "nodes", None, node["metadata"]["name"]),
                    {
                        "metadata": {
                            "resourceVersion": node["metadata"]["resourceVersion"],
                            "labels": {self.names.domain_label: None},
                        }
                    },
                )

    def _sweep(self, snap: Snapshot) -> None:
        """What a domain left behind when it vanished without our finalizer (deleted while no controller ran
        and the finalizer forced off): node labels, DaemonSets, templates, cliques."""
        gone = set()
        for node in snap.nodes:
            gone.add(node["metadata"]["labels"][self.names.domain_label])
        for template in snap.templates:
            gone.add(template["metadata"]["labels"][self.names.domain_label])
        for clique in snap.cliques:
            gone.add(clique["metadata"].get("labels", {}).get(self.names.domain_label, ""))
        for uid in sorted(gone - set(snap.by_uid) - {""}):
            try:
                self.sweep(uid, snap)
            except ClusterError as err:
                log.warning("sweep failed uid=%s error=%s", uid, err)

    # -- generated objects -----------------------------------------------------------------------------

    def _owner(self, domain: dict[str, Any]) -> dict[str, Any]:
        meta = domain["metadata"]
        return {"apiVersion": self.names.api_version, "kind": "ComputeDomain", "name": meta["name"], "uid": meta["uid"]}

    def _workload_template(self, domain: dict[str, Any]) -> dict[str, Any]:
        template = api.workload_claim_template(domain, self.names)
        template["metadata"]["ownerReferences"] = [self._owner(domain)]
        return template

    def _daemon_template(self, uid: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": api.daemon_object_name(uid),
                "namespace": self.ns,
                "labels": {self.names.domain_label: uid, self.names.target_label: "Daemon"},
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "daemon", "exactly": {"deviceClassName": self.names.daemon_class}}],
                        "config": [
                            {
                                "requests": ["daemon"],
                                "opaque": {
                                    "driver": self.names.driver_name,
                                    "parameters": api.daemon_config(uid, self.names),
                                },
                            }
                        ],
                    }
                }
            },
        }

    def _compat_env(self) -> list[dict[str, Any]]:
        """The daemons' ``--compat`` (their cliques' group, their labels): none with ours, their pods as before."""
        return [{"name": "DRADRIVER_COMPAT", "value": "nvidia"}] if self.names == api.NVIDIA else []

    def _daemonset(self, uid: str) -> dict[str, Any]:
        name = api.daemon_object_name(uid)
        labels = {self.names.domain_label: uid}

        def field_env(env: str, path: str) -> dict[str, Any]:
            return {"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}

        # The probe starts a Python process that runs nvidia-imex-ctl (itself bounded at 5 s): the kubelet's default
        # timeout of 1 s failed it on a busy node, and the daemon pod never became Ready.
        probe = {"exec": {"command": [*self.settings.daemon_command, "check"]}, "timeoutSeconds": PROBE_TIMEOUT}
        network: dict[str, Any] = (
            {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"} if self.settings.daemon_host_network else {}
        )
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": self.ns, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": labels,
                        **network,
                        # Every peer name is in the hosts file (unused ones with a sentinel address): a name the
                        # daemon looks up should not first go through the search domains.
                        "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
                        "serviceAccountName": self.settings.daemon_service_account,
                        "tolerations": [{"operator": "Exists"}],
                        "terminationGracePeriodSeconds": 10,
                        "resourceClaims": [{"name": "compute-domain-daemon", "resourceClaimTemplateName": name}],
                        "containers": [
                            {
                                "name": DAEMON_CONTAINER,
                                "image": self.settings.image,
                                "command": [*self.settings.daemon_command, "run"],
                                "env": [
                                    field_env("NODE_NAME", "spec.nodeName"),
                                    field_env("POD_IP", "status.podIP"),
                                    field_env("POD_NAME", "metadata.name"),
                                    field_env("POD_NAMESPACE", "metadata.namespace"),
                                    field_env("POD_UID", "metadata.uid"),
                                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                                    {
                                        "name": "MAX_NODES_PER_IMEX_DOMAIN",
                                        "value": str(self.settings.max_nodes_per_domain),
                                    },
                                    *self._compat_env(),
                                    *(dict(e) for e in self.settings.daemon_env),
                                ],
                                "resources": {"claims": [{"name": "compute-domain-daemon"}]},
                                "startupProbe": {**probe, "periodSeconds": 1, "failureThreshold": 1200},
                                "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 1},
                            }
                        ],
                    },
                },
            },
        }

    # -- the loop --------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, leading: Callable[[], bool] = lambda: True, interval: float = 1.0) -> None:
        """Pass every ``interval`` seconds while ``leading()``, until ``stop`` is set."""
        while not stop.is_set():
            if leading():
                self._progress_at = started = time.monotonic()
                outcome = "error"
                try:
                    self.sync()
                    outcome = "ok"
                except ClusterError as err:
                    log.warning("pass failed error=%s", err)
                finally:
                    self._progress_at = None
                    metrics.PASSES.labels(outcome).inc()
                    metrics.PASS_DURATION.observe(time.monotonic() - started)
            else:
                metrics.forget_domains()  # the leader's figures only: summed over replicas they stay right
            stop.wait(interval)

    def alive(self) -> tuple[bool, dict[str, Any]]:
        """For /livez: the running pass (if any) made progress within :data:`STUCK_AFTER_SECONDS`."""
        last = self._progress_at
        if last is not None and (idle := time.monotonic() - last) > STUCK_AFTER_SECONDS:
            return False, {"failedCheck": "pass", "reason": f"the current pass has made no progress for {idle:.0f} s"}
        return True, {}

    def _progressed(self) -> None:
        if self._progress_at is not None:
            self._progress_at = time.monotonic()


def _daemons_status(
    old: dict[str, Any], domain: dict[str, Any], nodes: list[dict[str, Any]], *, num_nodes: int, error: str, reason: str
) -> dict[str, Any]:
    """The status of a domain served by daemons of its own (or one with an error): Ready once ``num_nodes``
    daemons are listed and all are Ready."""
    ready = sum(1 for n in nodes if n["status"] == api.READY)
    overall = api.READY if not error and len(nodes) >= num_nodes and ready == len(nodes) else api.NOT_READY
    wanted = f"{num_nodes} wanted" if num_nodes else "numNodes not set"
    conditions = [
        _condition(
            old,
            "Ready",
            true=overall == api.READY,
            reason=reason if error else ("AllDaemonsReady" if overall == api.READY else "WaitingForDaemons"),
            message=error or f"{ready} of {len(nodes)} IMEX daemons Ready ({wanted})",
            domain=domain,
        ),
        _condition(
            old,
            "DaemonsReady",
            true=bool(nodes) and ready == len(nodes),
            reason="DaemonsReady"
            if nodes and ready == len(nodes)
            else ("NoDaemons" if not nodes else "DaemonsNotReady"),
            message=f"{ready}/{len(nodes)} Ready",
            domain=domain,
        ),
    ]
    return {"status": overall, "nodes": nodes, "conditions": conditions}


def _live_daemons(
    uid: str, pods: list[dict[str, Any]], names: api.ComputeDomainNames
) -> set[tuple[str | None, str | None]]:
    """``(node, clique ID)`` of each live daemon pod of domain ``uid`` (not being deleted)."""
    return {
        (p["spec"].get("nodeName"), p["metadata"]["labels"].get(names.clique_label))
        for p in pods
        if _labels(p).get(names.domain_label) == uid and not p["metadata"].get("deletionTimestamp")
    }


def _live_entries(
    clique: dict[str, Any], live: set[tuple[str | None, str | None]], names: api.ComputeDomainNames
) -> list[dict[str, Any]]:
    """The clique's entries whose node runs a live daemon in that clique."""
    clique_id = _labels(clique).get(names.clique_label)
    return [
        d
        for d in clique.get("daemons") or []
        if (d.get("nodeName"), clique_id if clique_id is not None else d.get("cliqueID")) in live
    ]


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels: dict[str, Any] = obj["metadata"].get("labels") or {}
    return labels


def _add_finalizer_op(meta: dict[str, Any], finalizer: str) -> dict[str, Any]:
    if meta.get("finalizers"):
        return {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}
    return {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or []
    )


def _condition(
    old: dict[str, Any], kind: str, *, true: bool, reason: str, message: str, domain: dict[str, Any]
) -> dict[str, Any]:
    status = "True" if true else "False"
    previous = next((c for c in old.get("conditions") or [] if c.get("type") == kind), None)
    moment = (
        previous["lastTransitionTime"]
        if previous and previous.get("status") == status
        else datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": moment,
        "observedGeneration": domain["metadata"].get("generation", 0),
    }


def _comparable(status: dict[str, Any]) -> Any:
    return (
        status.get("status"),
        status.get("nodes") or [],
        [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []],
    )
