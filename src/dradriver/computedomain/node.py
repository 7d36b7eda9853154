"""The node side: the ``compute-domain.dradriver.dev`` DRA driver, on the generic kubelet-plugin layer.

It publishes two devices per node: ``channel-0`` (what a workload pod's claim gets: IMEX channel 0, or every
channel in ``All`` mode) and ``daemon-0`` (what the domain's IMEX daemon pod gets). Preparing a channel labels
the Node with the domain's UID, which pulls the domain's daemon onto it; the channel is handed out only once
that daemon is Ready in its clique (until then a retryable error: the kubelet retries the prepare).

One record of what is prepared: ``<state-dir>/checkpoint.json``. CDI specs are outputs, never read back.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.atomic_files import sweep_dead_writers, write_atomically
from dradriver.computedomain import api
from dradriver.computedomain.fabric import CharDevice
from dradriver.computedomain.host_imex import HostImex
from dradriver.computedomain.kube import Rest, path_of
from dradriver.errors import ClaimError, ConfigError, DradriverError
from dradriver.faults import fault_point
from dradriver.plugin.cluster.port import ClusterError, ConflictError, NotFoundError
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DeviceConfig, PreparedDevice, PrepareResult

log = logging.getLogger(__name__)

CHANNEL_DEVICE = "channel-0"
DAEMON_DEVICE = "daemon-0"


class NotReadyError(DradriverError):
    """This node's IMEX daemon is not Ready yet: the kubelet retries prepare later (the pod waits)."""


def slice_devices(clique_id: str) -> list[dict[str, Any]]:
    """The devices of this node's one slice. ``cliqueID`` lets a selector keep a job inside one clique."""

    def device(name: str, kind: str) -> dict[str, Any]:
        return {
            "name": name,
            "attributes": {"type": {"string": kind}, "id": {"int": 0}, "cliqueID": {"string": clique_id}},
        }

    return [device(CHANNEL_DEVICE, "channel"), device(DAEMON_DEVICE, "daemon")]


@dataclass(frozen=True)
class NodeFacts:
    """What the node side knows about its node: clique and device numbers (re-read while it runs, since the
    fabric manager can re-register GPUs into another clique)."""

    node_name: str
    clique_id: str  # "" when the node is in no multi-node clique
    channel_major: int
    imex_mgmt: CharDevice | None  # None on a node without the capability (no clique)
    problem: str = ""  # why the node cannot serve ComputeDomains now (fabric not registered); "" when it can


class Checkpoint:
    """Prepared claims of this driver, in one JSON file written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            claims = json.loads(text).get("claims", {})
            if not isinstance(claims, dict) or not all(
                isinstance(entry, dict) and isinstance(entry.get("kind"), str) for entry in claims.values()
            ):
                raise ValueError("claims is not an object of claim entries with a kind")
        except (ValueError, AttributeError) as err:
            raise ConfigError(
                f"ComputeDomain checkpoint {self.path} is corrupt ({err}): move it aside and restart this node's "
                "dradriver pod; the kubelet then prepares the claims of running pods again"
            ) from None
        return claims

    def update(self, change: Callable[[dict[str, dict[str, Any]]], None]) -> None:
        with self._lock:
            claims = self.load()
            change(claims)
            write_atomically(self.path, json.dumps({"claims": claims}, indent=1, sort_keys=True))


class ComputeDomainDriver:
    """The :class:`~dradriver.plugin.handler.DriverHandler` of ``compute-domain.dradriver.dev``."""

    def __init__(
        self,
        *,
        facts: NodeFacts,
        rest: Rest,
        namespace: str,
        state_dir: Path,
        cdi_dir: Path,
        daemon_mounts: Sequence[Mapping[str, Any]] = (),
        host_imex: HostImex | None = None,
        names: api.ComputeDomainNames = api.OURS,
    ) -> None:
        """``host_imex`` (``--imex-mode hostManaged``): channels come from the host's IMEX daemon; no daemon per
        domain is pulled onto the node (:mod:`~dradriver.computedomain.host_imex`). ``names``: ``--compat``'s (the
        domains' group, the node label, the CDI vendor, the opaque configs' apiVersion)."""
        self.facts = facts
        self.names = names
        self.host_imex = host_imex
        self.rest = rest
        self.namespace = namespace  # the driver's, where cliques and daemon pods live
        self.state_dir = state_dir
        self.cdi_dir = cdi_dir
        # Host files every daemon container gets (the driver's nvidia-imex and nvidia-imex-ctl).
        self.daemon_mounts = [dict(m) for m in daemon_mounts]
        self.checkpoint = Checkpoint(state_dir / "checkpoint.json")
        self._label_lock = threading.Lock()

    # -- DriverHandler ---------------------------------------------------------------------------------

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            try:
                results[claim.uid] = PrepareResult(devices=tuple(self._prepare(claim)))
            except (DradriverError, OSError) as err:
                log.info("prepare refused claim=%s error=%s", claim.ref, err)
                results[claim.uid] = PrepareResult(error=str(err))
        return results

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        results: dict[str, str | None] = {}
        for ref in claims:
            try:
                self._unprepare(ref)
                results[ref.uid] = None
            except (DradriverError, OSError) as err:
                results[ref.uid] = f"unprepare of {ref}: {err}"
        return results

    # -- prepare ---------------------------------------------------------------------------------------

    def _prepare(self, claim: AllocatedClaim) -> list[PreparedDevice]:
        if self.facts.problem:
            raise NotReadyError(f"node {self.facts.node_name} cannot serve ComputeDomains now: {self.facts.problem}")
        prepared: list[PreparedDevice] = []
        for device in claim.devices:
            if device.pool != self.facts.node_name or device.device not in (CHANNEL_DEVICE, DAEMON_DEVICE):
                raise ClaimError(f"claim {claim.ref}: device {device.pool}/{device.device} is not on this node")
            config = _config_for(device.request, claim.config, self.names)
            if device.device == CHANNEL_DEVICE:
                if not isinstance(config, api.ChannelConfig):
                    raise ClaimError(
                        f"claim {claim.ref}: request {device.request!r} has a channel but no "
                        "ComputeDomainChannelConfig; use the claim template the ComputeDomain generated"
                    )
                edits = self._prepare_channel(claim.ref, config)
            else:
                if not isinstance(config, api.DaemonConfig):
                    raise ClaimError(
                        f"claim {claim.ref}: request {device.request!r} has a daemon device but no "
                        "ComputeDomainDaemonConfig; only the domain's DaemonSet asks for daemon devices"
                    )
                edits = self._prepare_daemon(claim.ref, config)
            name = f"{claim.uid}-{device.device}"
            self._write_cdi(claim.uid, name, edits)
            prepared.append(
                PreparedDevice(
                    pool=device.pool,
                    device=device.device,
                    requests=(device.request.split("/", 1)[0],),
                    cdi_device_ids=(f"{self.names.cdi_vendor}/claim={name}",),
                )
            )
        return prepared

    def _prepare_channel(self, ref: ClaimRef, config: api.ChannelConfig) -> dict[str, Any]:
        # Channel 0 is one per node: a claim still holding it (being unprepared) must go first.
        holders = [
            uid for uid, entry in self.checkpoint.load().items() if entry["kind"] == "channel" and uid != ref.uid
        ]
        if holders:
            raise NotReadyError(
                f"IMEX channel 0 on node {self.facts.node_name} is still held by claim {holders[0]}; "
                "retrying once it is unprepared"
            )
        domain = self._domain(config.domain_id, ref.namespace)
        channels = api.MAX_IMEX_CHANNELS if config.allocation_mode == api.ALL else 1
        if self.host_imex is not None:
            return self._host_managed_channel(ref, config, channels, self.host_imex)
        self.checkpoint.update(
            lambda c: c.__setitem__(
                ref.uid, {"kind": "channel", "domain": config.domain_id, "namespace": ref.namespace, "name": ref.name}
            )
        )
        self._label_node(config.domain_id, domain)
        edits: dict[str, Any] = {"env": [f"COMPUTE_DOMAIN_UUID={config.domain_id}"]}
        if not self.facts.clique_id:
            # A node with no multi-node NVLink runs no IMEX daemon work; the pod starts without channels.
            return edits
        self._check_daemon_ready(config.domain_id)
        edits["deviceNodes"] = [
            _node(CharDevice(f"{api.CHANNEL_DIR}/channel{i}", self.facts.channel_major, i)) for i in range(channels)
        ]
        return edits

    def _host_managed_channel(
        self, ref: ClaimRef, config: api.ChannelConfig, channels: int, host: HostImex
    ) -> dict[str, Any]:
        """The channel from the host's IMEX daemon: no Node label (the domain's DaemonSet runs nowhere), the
        channel devices once ``nvidia-imex-ctl -q`` answers READY (one look; the kubelet retries)."""
        edits: dict[str, Any] = {"env": [f"COMPUTE_DOMAIN_UUID={config.domain_id}"]}
        if self.facts.clique_id:
            state = host.state()
            if not state.ready:
                raise NotReadyError(host.not_ready_message(self.facts.node_name, state))
            edits["deviceNodes"] = [
                _node(CharDevice(f"{api.CHANNEL_DIR}/channel{i}", self.facts.channel_major, i)) for i in range(channels)
            ]
        entry = {
            "kind": "channel",
            "domain": config.domain_id,
            "namespace": ref.namespace,
            "name": ref.name,
            "hostManaged": True,
        }
        self.checkpoint.update(lambda c: c.__setitem__(ref.uid, entry))
        fault_point("cd-channel-recorded")  # recorded, CDI spec not written yet: unprepare removes both
        return edits

    def _prepare_daemon(self, ref: ClaimRef, config: api.DaemonConfig) -> dict[str, Any]:
        if self.host_imex is not None:
            raise ClaimError(
                f"claim {ref}: node {self.facts.node_name} runs --imex-mode hostManaged: the host's IMEX daemon serves "
                "every ComputeDomain here and no daemon per domain runs"
            )
        # The daemon device carries the domain's IMEX files and management capability: a claim anyone can make in
        # their own namespace must never get it, only the controller's DaemonSet in the driver's namespace.
        if ref.namespace != self.namespace:
            raise ClaimError(
                f"claim {ref}: only the IMEX DaemonSet of a ComputeDomain (in the driver's namespace {self.namespace}) "
                f"may request daemon devices, not a claim in namespace {ref.namespace}; a workload requests the "
                "channel through the claim template its ComputeDomain generated"
            )
        domain = self._domain(config.domain_id, None)
        meta = domain["metadata"]
        directory = self.state_dir / "domains" / config.domain_id
        directory.mkdir(parents=True, exist_ok=True)
        self.checkpoint.update(
            lambda c: c.__setitem__(
                ref.uid, {"kind": "daemon", "domain": config.domain_id, "namespace": ref.namespace, "name": ref.name}
            )
        )
        edits: dict[str, Any] = {
            "env": [
                f"CLIQUE_ID={self.facts.clique_id}",
                f"COMPUTE_DOMAIN_UUID={config.domain_id}",
                f"COMPUTE_DOMAIN_NAME={meta['name']}",
                f"COMPUTE_DOMAIN_NAMESPACE={meta['namespace']}",
            ],
            "mounts": [
                {"hostPath": str(directory), "containerPath": "/imexd", "options": ["rw", "nosuid", "nodev", "bind"]},
                *self.daemon_mounts,
            ],
        }
        if self.facts.clique_id and self.facts.imex_mgmt is not None:
            edits["deviceNodes"] = [_node(self.facts.imex_mgmt)]
        return edits

    def _domain(self, uid: str, namespace: str | None) -> dict[str, Any]:
        """The ComputeDomain with ``uid``; for a channel it must be in the claim's namespace."""
        items = self.rest.list(path_of(self.names.api_version, "computedomains", namespace))
        for item in items:
            if item["metadata"].get("uid") == uid:
                if item["metadata"].get("deletionTimestamp"):
                    raise ClaimError(f"ComputeDomain {item['metadata']['name']} (UID {uid}) is being deleted")
                return item
        where = f"namespace {namespace}" if namespace else "the cluster"
        raise ClaimError(
            f"no ComputeDomain with UID {uid} in {where}: a channel claim must be in its ComputeDomain's namespace, "
            "made from the claim template the ComputeDomain generated"
        )

    def _label_node(self, uid: str, domain: dict[str, Any]) -> None:
        """Label this Node with the domain (which pulls its daemon here); refuse when another domain holds it."""
        path = path_of("v1", "nodes", None, self.facts.node_name)
        with self._label_lock:
            for _ in range(5):
                node = self.rest.get(path)
                current = (node["metadata"].get("labels") or {}).get(self.names.domain_label)
                if current == uid:
                    return
                if current:
                    label = self.names.domain_label
                    raise NotReadyError(
                        f"node {self.facts.node_name} serves ComputeDomain {current} (label {label}); "
                        f"one domain per node: {domain['metadata']['name']} gets this node once that one is done"
                    )
                patch = {
                    "metadata": {
                        "resourceVersion": node["metadata"]["resourceVersion"],
                        "labels": {self.names.domain_label: uid},
                    }
                }
                try:
                    self.rest.merge_patch(path, patch)
                    log.info("node labelled node=%s domain=%s", self.facts.node_name, uid)
                    return
                except ConflictError:
                    continue
        raise NotReadyError(f"node {self.facts.node_name} kept changing while labelling it; retrying")

    def _check_daemon_ready(self, uid: str) -> None:
        """One look at this node's clique entry, never a wait: a prepare runs under the node-wide handler lock
        (rolling updates), and the daemon pod's own prepare, which the entry waits on, needs that lock too."""
        path = path_of(
            self.names.api_version,
            "computedomaincliques",
            self.namespace,
            api.clique_object_name(uid, self.facts.clique_id),
        )
        try:
            clique = self.rest.get(path)
        except NotFoundError:
            clique = {}
        entry = next((d for d in clique.get("daemons") or [] if d.get("nodeName") == self.facts.node_name), None)
        if entry is None or entry.get("status") != api.READY:
            raise NotReadyError(
                f"the IMEX daemon of ComputeDomain {uid} on node {self.facts.node_name} is not Ready in clique "
                f"{self.facts.clique_id} yet; the kubelet retries (the pod stays in ContainerCreating)"
            )

    # -- unprepare -------------------------------------------------------------------------------------

    def _unprepare(self, ref: ClaimRef) -> None:
        entry = self.checkpoint.load().get(ref.uid)
        if entry is None:
            self._remove_cdi(ref.uid)
            return
        if entry["kind"] == "channel" and not entry.get("hostManaged"):
            self._unlabel_node(entry["domain"])
        self._remove_cdi(ref.uid)
        self.checkpoint.update(lambda c: _drop(c, ref.uid))
        if entry["kind"] == "daemon" and not any(
            e["kind"] == "daemon" and e["domain"] == entry["domain"] for e in self.checkpoint.load().values()
        ):
            # The domain's IMEX files go with its last daemon here (a later daemon writes them anew).
            shutil.rmtree(self.state_dir / "domains" / entry["domain"], ignore_errors=True)

    def _unlabel_node(self, uid: str) -> None:
        path = path_of("v1", "nodes", None, self.facts.node_name)
        with self._label_lock:
            try:
                node = self.rest.get(path)
            except NotFoundError:
                return
            if (node["metadata"].get("labels") or {}).get(self.names.domain_label) != uid:
                return
            try:
                self.rest.merge_patch(
                    path,
                    {
                        "metadata": {
                            "resourceVersion": node["metadata"]["resourceVersion"],
                            "labels": {self.names.domain_label: None},
                        }
                    },
                )
            except ClusterError as err:
                raise DradriverError(
                    f"removing label {self.names.domain_label} from node {self.facts.node_name}: {err}"
                ) from None
            log.info("node unlabelled node=%s domain=%s", self.facts.node_name, uid)

    # -- CDI -------------------------------------------------------------------------------------------

    def remove_interrupted_writes(self) -> list[Path]:
        """Remove the temp files of the checkpoint and of this driver's CDI specs that a killed write left (never
        another program's); the caller holds the lock every prepare and unprepare holds, so none is in progress."""
        specs = self.cdi_dir / f"{self.names.cdi_vendor}-claim_*.json"
        return [
            *sweep_dead_writers(self.checkpoint.path, writers_locked_out=True),
            *sweep_dead_writers(specs, writers_locked_out=True),
        ]

    def _cdi_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.names.cdi_vendor}-claim_{claim_uid}.json"

    def _write_cdi(self, claim_uid: str, name: str, edits: dict[str, Any]) -> None:
        spec = {
            "cdiVersion": "0.5.0",
            "kind": f"{self.names.cdi_vendor}/claim",
            "devices": [{"name": name, "containerEdits": edits}],
        }
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self._cdi_path(claim_uid), json.dumps(spec))

    def _remove_cdi(self, claim_uid: str) -> None:
        self._cdi_path(claim_uid).unlink(missing_ok=True)


def _config_for(
    request: str, configs: Sequence[DeviceConfig], names: api.ComputeDomainNames
) -> api.ChannelConfig | api.DaemonConfig | None:
    """The config that applies to ``request``: the last one naming it (or every request); claim wins over class."""
    base = request.split("/", 1)[0]
    chosen = None
    for config in configs:
        if not config.requests or request in config.requests or base in config.requests:
            chosen = api.parse_config(config.parameters, names)
    return chosen


def _node(device: CharDevice) -> dict[str, Any]:
    return {"path": device.path, "type": "c", "major": device.major, "minor": device.minor, "fileMode": device.mode}


def _drop(claims: dict[str, dict[str, Any]], uid: str) -> None:
    claims.pop(uid, None)
