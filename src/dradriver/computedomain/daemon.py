"""``dradriver cd-daemon run``: the IMEX daemon's supervisor in a ComputeDomain's DaemonSet pod.

It joins its clique (server-side apply of its own entry only; the controller numbers entries), writes the IMEX
config and the static node list, keeps the hosts file mapping peer names to their addresses, runs the IMEX
daemon (restarting it when it exits, SIGUSR1 when peers change), and reports its entry Ready while the local
IMEX daemon answers READY. On SIGTERM it stops IMEX and leaves the clique.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.computedomain import api, imexconf
from dradriver.computedomain.kube import Rest, path_of
from dradriver.errors import ConfigError
from dradriver.plugin.cluster.port import ClusterError, ConflictError, NotFoundError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonSettings:
    domain_uid: str
    clique_id: str
    node_name: str
    pod_ip: str
    pod_name: str
    pod_uid: str
    namespace: str
    config_dir: Path
    hosts_file: Path
    imex_command: tuple[str, ...]
    imex_ctl_command: tuple[str, ...]
    max_nodes: int = api.MAX_NODES_PER_IMEX_DOMAIN
    poll: float = 0.5
    # ``--compat``'s (the controller passes DRADRIVER_COMPAT to its daemons): the cliques' group and the labels.
    names: api.ComputeDomainNames = api.OURS

    @property
    def config_file(self) -> Path:
        return self.config_dir / "imexd.cfg"

    @property
    def manager(self) -> str:
        return f"cd-daemon-{self.node_name}"


def settings_from_env(
    env: dict[str, str],
    *,
    config_dir: Path,
    hosts_file: Path,
    imex_command: Sequence[str],
    imex_ctl_command: Sequence[str],
    names: api.ComputeDomainNames = api.OURS,
) -> DaemonSettings:
    """Settings from the pod's environment (downward API, and the CDI edits of the daemon claim)."""
    if not env.get("COMPUTE_DOMAIN_UUID"):
        raise ConfigError(
            "COMPUTE_DOMAIN_UUID is not set: the daemon claim's CDI edits did not reach this container; run it only "
            f"from the ComputeDomain's DaemonSet, with the {names.driver_name} plugin on the node"
        )
    missing = [name for name in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP") if not env.get(name)]
    if missing:
        raise ConfigError(f"{', '.join(missing)} not set: the DaemonSet passes them through the downward API")
    return DaemonSettings(
        domain_uid=env["COMPUTE_DOMAIN_UUID"],
        clique_id=env.get("CLIQUE_ID", ""),
        node_name=env["NODE_NAME"],
        pod_ip=env["POD_IP"],
        pod_name=env["POD_NAME"],
        pod_uid=env["POD_UID"],
        namespace=env["POD_NAMESPACE"],
        config_dir=config_dir,
        hosts_file=hosts_file,
        imex_command=tuple(imex_command),
        imex_ctl_command=tuple(imex_ctl_command),
        max_nodes=int(env.get("MAX_NODES_PER_IMEX_DOMAIN") or api.MAX_NODES_PER_IMEX_DOMAIN),
        names=names,
    )


def missing_imex(binary: str, err: OSError) -> str:
    """The one line a daemon dies with when it cannot start the IMEX daemon binary."""
    where = binary if "/" in binary else f"{binary} (looked up in PATH={os.environ.get('PATH', '')})"
    return (
        f"cannot run the IMEX daemon {where}: {err.strerror or err}; the node plugin mounts the host driver's "
        "nvidia-imex from the driver root into this pod: install NVIDIA's nvidia-imex package of the driver's "
        "version on the host (or into the driver root of a containerized driver), then restart the node's "
        "dradriver pod and this one"
    )


def local_ready(settings: DaemonSettings, timeout: float = 5.0) -> bool:
    """Whether the local IMEX daemon answers READY (``nvidia-imex-ctl -q``); what ``cd-daemon check`` reports."""
    if not settings.clique_id:
        return True
    try:
        done = subprocess.run(
            [*settings.imex_ctl_command, "-c", str(settings.config_file), "-q"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout == "READY\n"


class ImexDaemon:
    """Membership, files, the supervised IMEX process and readiness, for one daemon pod."""

    def __init__(self, rest: Rest, settings: DaemonSettings) -> None:
        self.rest = rest
        self.s = settings
        self.clique_path = path_of(
            settings.names.api_version,
            "computedomaincliques",
            settings.namespace,
            api.clique_object_name(settings.domain_uid, settings.clique_id),
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._peers: dict[int, str] = {}
        self._reported: str | None = None

    def run(self, stop: threading.Event) -> None:
        self._label_pod()
        if not self.s.clique_id:
            log.info("node has no multi-node NVLink clique: no IMEX daemon to run node=%s", self.s.node_name)
            stop.wait()
            return
        self.s.config_dir.mkdir(parents=True, exist_ok=True)
        nodes_file = self.s.config_dir / "nodes.cfg"
        nodes_file.write_text(imexconf.render_nodes(self.s.max_nodes))
        self.s.config_file.write_text(imexconf.render_config(pod_ip=self.s.pod_ip, nodes_file=nodes_file))
        try:
            self._apply_entry(api.NOT_READY)
            while not stop.is_set():
                self._step()
                stop.wait(self.s.poll)
        finally:
            self._stop_process()
            self._leave()

    def _step(self) -> None:
        try:
            clique = self.rest.get(self.clique_path)
        except NotFoundError:
            self._reported = None  # the controller dropped it (or a sweep): join again
            self._apply_entry(api.NOT_READY)
            return
        except ClusterError as err:
            log.warning("reading the clique failed error=%s", err)
            return
        entries = clique.get("daemons") or []
        mine = next((d for d in entries if d.get("nodeName") == self.s.node_name), None)
        if mine is None or mine.get("ipAddress") != self.s.pod_ip:
            self._reported = None
            self._apply_entry(api.NOT_READY)
            return
        peers = {d["index"]: d["ipAddress"] for d in entries if d.get("index") is not None and d.get("ipAddress")}
        if mine.get("index") is None:
            return  # the controller has not numbered us yet: IMEX cannot know its own node ID
        if peers != self._peers:
            current = self.s.hosts_file.read_text() if self.s.hosts_file.exists() else ""
            self.s.hosts_file.write_text(imexconf.rewrite_hosts(current, peers, self.s.max_nodes))
            changed = bool(self._peers)
            self._peers = peers
            if changed and self.process is not None and self.process.poll() is None:
                log.info("peers changed, IMEX re-reads them peers=%d", len(peers))
                self.process.send_signal(signal.SIGUSR1)
        self._supervise()
        status = api.READY if local_ready(self.s) else api.NOT_READY
        if status != mine.get("status") or status != self._reported:
            self._apply_entry(status)

    def _supervise(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        if self.process is not None:
            self.restarts += 1
            log.warning("IMEX daemon exited, restarting code=%s restarts=%d", self.process.returncode, self.restarts)
        command = [*self.s.imex_command, "-c", str(self.s.config_file)]
        try:
            self.process = subprocess.Popen(command)
        except OSError as err:
            raise ConfigError(missing_imex(self.s.imex_command[0], err)) from None
        log.info("IMEX daemon started pid=%d", self.process.pid)

    def _stop_process(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def _label_pod(self) -> None:
        path = path_of("v1", "pods", self.s.namespace, self.s.pod_name)
        self.rest.merge_patch(path, {"metadata": {"labels": {self.s.names.clique_label: self.s.clique_id}}})

    def _apply_entry(self, status: str) -> None:
        """Create or update this node's entry, and only it (the clique is created on first apply)."""
        body: dict[str, Any] = {
            "apiVersion": self.s.names.api_version,
            "kind": "ComputeDomainClique",
            "metadata": {
                "name": api.clique_object_name(self.s.domain_uid, self.s.clique_id),
                "namespace": self.s.namespace,
                "labels": {
                    self.s.names.domain_label: self.s.domain_uid,
                    self.s.names.clique_label: self.s.clique_id,
                },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": self.s.pod_name, "uid": self.s.pod_uid}
                ],
            },
            "daemons": [
                {
                    "nodeName": self.s.node_name,
                    "ipAddress": self.s.pod_ip,
                    "cliqueID": self.s.clique_id,
                    "status": status,
                }
            ],
        }
        try:
            self.rest.apply(self.clique_path, body, manager=self.s.manager)
            self._reported = status
            log.info("clique entry applied node=%s status=%s", self.s.node_name, status)
        except ClusterError as err:
            log.warning("applying the clique entry failed error=%s", err)

    def _leave(self) -> None:
        """Remove this node's entry (a JSON patch guarded by a test, so a concurrent change is never lost)."""
        for _ in range(5):
            try:
                clique = self.rest.get(self.clique_path)
                entries = clique.get("daemons") or []
                position = next((i for i, d in enumerate(entries) if d.get("nodeName") == self.s.node_name), None)
                if position is None:
                    return
                self.rest.json_patch(
                    self.clique_path,
                    [
                        {"op": "test", "path": f"/daemons/{position}/nodeName", "value": self.s.node_name},
                        {"op": "remove", "path": f"/daemons/{position}"},
                    ],
                )
                log.info("left the clique node=%s", self.s.node_name)
                return
            except NotFoundError:
                return
            except (ConflictError, ClusterError) as err:
                log.warning("leaving the clique failed, retrying error=%s", err)
                time.sleep(0.2)
