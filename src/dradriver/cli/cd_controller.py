"""``dradriver cd-controller``: the ComputeDomain controller (a Deployment of the same image), leader-elected."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
import uuid
from typing import Any

from prometheus_client import REGISTRY

from dradriver.cli.flags import kube_client, logs, status
from dradriver.cli.flags.compute_domains import IMEX_MODE
from dradriver.cli.flags.env import add_env_option
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.cli.flags.logs import LogOptions
from dradriver.cli.flags.publishing import COMPAT
from dradriver.cli.flags.status import StatusOptions
from dradriver.cli.flags.values import positive_int, positive_seconds
from dradriver.cli.status_server import StatusServer
from dradriver.cli.stop_signals import StopOnSignals
from dradriver.computedomain.api import names_of
from dradriver.computedomain.controller import Controller, ControllerSettings
from dradriver.computedomain.kube import Rest
from dradriver.computedomain.leader import LeaderElector
from dradriver.computedomain.metrics import ApiReads, ApiWrites
from dradriver.computedomain.watching import WatchingController
from dradriver.errors import ConfigError

log = logging.getLogger("dradriver.cd-controller")
LEASE_NAME = "dradriver-compute-domain-controller"
# Not the plugin's :8080: with hostNetwork a replica may share a node's network with a plugin pod.
DEFAULT_METRICS_ADDRESS = ":8081"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Turn each ComputeDomain into its claim templates and a DaemonSet of IMEX daemons, number the daemons of "
        "each clique and report status, until SIGTERM. Replicas elect one leader on a Lease. With --imex-mode "
        "hostManaged: the workload claim template alone, and each domain Ready once admitted."
    )
    kube_client.add_flags(parser, rate_limits=False)
    add_env_option(
        parser,
        "--namespace",
        env="POD_NAMESPACE",
        default="dradriver",
        help="the driver's namespace (daemons, cliques)",
    )
    _add_daemon_flags(parser)
    _add_election_flags(parser)
    COMPAT.add(
        parser,
        help="whose ComputeDomain API to serve, as the node plugins' --compat: 'none', ours (resource.dradriver.dev, "
        "compute-domain.dradriver.dev); 'nvidia', NVIDIA's (resource.nvidia.com, compute-domain.nvidia.com, its "
        "DeviceClasses and labels), so NVIDIA's ComputeDomains apply unedited (docs/nvidia-compatibility.md)",
    )
    status.METRICS_ADDRESS.add(
        parser,
        default=DEFAULT_METRICS_ADDRESS,
        help="HOST:PORT serving /metrics, /livez, /readyz and /healthz, which the Deployment's probes call "
        "(empty: off)",
    )
    logs.add_flags(parser, level=False)
    parser.set_defaults(handler=run)


def _add_daemon_flags(parser: argparse.ArgumentParser) -> None:
    """What the IMEX daemon pods run, as whom, in which network and with which environment."""
    add_env_option(
        parser, "--image", env="IMAGE_NAME", default="dradriver:latest", help="the image the daemon pods run"
    )
    add_env_option(
        parser,
        "--daemon-service-account",
        env="DRADRIVER_CD_DAEMON_SERVICE_ACCOUNT",
        default="dradriver-compute-domain-daemon",
        help="the service account of the daemon pods",
    )
    add_env_option(
        parser,
        "--daemon-command",
        env="DRADRIVER_CD_DAEMON_COMMAND",
        default="dradriver cd-daemon",
        help="the daemon pods' command, before run/check",
    )
    add_env_option(
        parser,
        "--daemon-host-network",
        env="DRADRIVER_CD_DAEMON_HOST_NETWORK",
        default="false",
        choices=("true", "false"),
        help="run the daemon pods in the node's network (nodes whose pods cannot reach the API server otherwise)",
    )
    add_env_option(
        parser,
        "--daemon-env",
        env="DRADRIVER_CD_DAEMON_ENV",
        default="[]",
        metavar="JSON",
        help="more environment for the daemon containers: a JSON list of Kubernetes EnvVars, e.g. "
        '[{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}]',
    )
    add_env_option(
        parser,
        "--max-nodes-per-imex-domain",
        env="MAX_NODES_PER_IMEX_DOMAIN",
        default=18,
        type=positive_int,
        help="the most daemons of one clique (NVL72: 18 trays)",
    )
    IMEX_MODE.add(
        parser,
        help="who runs nvidia-imex, as the node plugins' --imex-mode: driverManaged, a DaemonSet of IMEX daemons per "
        "ComputeDomain; hostManaged, the nodes' own nvidia-imex services: no DaemonSet, and a domain is Ready once "
        "admitted (its workload claim template made; each node's service is asked at prepare)",
    )


def _add_election_flags(parser: argparse.ArgumentParser) -> None:
    """Who this replica is in the Lease, how long a lease lasts, how often the leader passes over the domains."""
    add_env_option(
        parser, "--identity", env="POD_NAME", default="", help="this replica's name in the Lease (default: host+uuid)"
    )
    add_env_option(
        parser, "--lease-duration", env="DRADRIVER_LEASE_DURATION", default=15.0, type=positive_seconds, help="seconds"
    )
    add_env_option(
        parser,
        "--interval",
        env="DRADRIVER_CD_INTERVAL",
        default=2.0,
        type=positive_seconds,
        help="seconds between passes (with --watch false)",
    )
    add_env_option(
        parser,
        "--watch",
        env="DRADRIVER_CD_WATCH",
        default="true",
        choices=("true", "false"),
        help="watch the cluster into caches and reconcile the domains that changed (false: list everything "
        "every --interval, as before informers)",
    )
    add_env_option(
        parser,
        "--resync",
        env="DRADRIVER_CD_RESYNC",
        default=600.0,
        type=positive_seconds,
        help="seconds between reconciles of every domain from the caches (with --watch true)",
    )
    add_env_option(
        parser,
        "--sync-timeout",
        env="DRADRIVER_CD_SYNC_TIMEOUT",
        default=120.0,
        type=positive_seconds,
        help="seconds a new leader's caches may take to list everything before /livez and /readyz fail (with "
        "--watch true; a list refused for RBAC or a missing CRD never ends)",
    )
    add_env_option(
        parser,
        "--watch-timeout",
        env="DRADRIVER_CD_WATCH_TIMEOUT",
        default=300,
        type=positive_int,
        help="each watch is asked to end after between this many seconds and twice as many (at random, so the "
        "caches' watches do not end together); then opened again from where it was, with no list",
    )


def daemon_env(text: str) -> tuple[dict[str, Any], ...]:
    """``--daemon-env``: a JSON list of EnvVars, each with a name and a value or valueFrom."""
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'--daemon-env is not JSON ({err}): give a list like [{{"name": "A", "value": "b"}}]'
        ) from None
    if not isinstance(entries, list):
        raise ConfigError('--daemon-env must be a JSON list of EnvVars ({"name": …, "value": …})')
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f'--daemon-env[{position}] has no name: each entry is {{"name": …, "value": …}}')
        if not isinstance(entry.get("value", ""), str) or not isinstance(entry.get("valueFrom", {}), dict):
            raise ConfigError(
                f"--daemon-env[{position}] ({entry['name']}): value must be a string, valueFrom an object"
            )
    return tuple(entries)


def controller_settings(args: argparse.Namespace) -> ControllerSettings:
    """What the controller creates, from its flags (``--daemon-env`` checked: a ConfigError names the entry)."""
    return ControllerSettings(
        namespace=args.namespace,
        image=args.image,
        daemon_service_account=args.daemon_service_account,
        daemon_command=tuple(args.daemon_command.split()),
        max_nodes_per_domain=args.max_nodes_per_imex_domain,
        daemon_host_network=args.daemon_host_network == "true",
        daemon_env=daemon_env(args.daemon_env),
        host_managed=IMEX_MODE.value(args) == "hostManaged",
        names=names_of(COMPAT.value(args)),
    )


def _readiness(elector: LeaderElector, watching: WatchingController | None) -> tuple[bool, dict[str, Any]]:
    """Ready (a standby too: nothing is sent to it) unless, leading, its caches never synced."""
    ready, detail = watching.ready() if watching is not None else (True, {})
    return ready, {"leading": elector.leading.is_set(), **detail}


def _watching(controller: Controller, rest: Rest, args: argparse.Namespace) -> WatchingController | None:
    """The informer-driven controller, or None with --watch false (the old pass every --interval)."""
    if args.watch != "true":
        return None
    return WatchingController(
        controller, rest, resync=args.resync, sync_timeout=args.sync_timeout, watch_timeout=args.watch_timeout
    )


def run(args: argparse.Namespace) -> int:
    LogOptions.from_args(args).configure()
    # Every input checked before a port is bound: its own flags, then the kubeconfig, then the port (probed last).
    settings = controller_settings(args)
    kube = KubeClientOptions.from_args(args)
    kube.check()
    serving = StatusOptions.from_args(args)
    serving.check()
    rest = Rest(kube.transport())
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    elector = LeaderElector(
        rest, namespace=args.namespace, name=LEASE_NAME, identity=identity, duration=args.lease_duration
    )
    stop = threading.Event()
    with StopOnSignals(stop):
        controller = Controller(rest, settings)
        watching = _watching(controller, rest, args)
        server = None
        collectors = (ApiWrites(rest.writes_so_far), ApiReads(rest.reads_so_far))
        if serving.address:
            # Ready as soon as it runs (a standby replica too: nothing is sent to it); alive while no pass is stuck.
            server = StatusServer(
                serving.address,
                readiness=lambda: _readiness(elector, watching),
                liveness=watching.alive if watching is not None else controller.alive,
            )
            for collector in collectors:
                REGISTRY.register(collector)
            server.start()

        threading.Thread(target=elector.run, args=(stop,), name="leader-election", daemon=True).start()
        log.info(
            "ready identity=%s namespace=%s watch=%s imex_mode=%s pid=%d",
            identity,
            args.namespace,
            args.watch,
            IMEX_MODE.value(args),
            os.getpid(),
        )
        try:
            if watching is not None:
                watching.run(stop, leading=elector.leading.is_set)
            else:
                controller.run(stop, leading=elector.leading.is_set, interval=args.interval)
        finally:
            elector.release()
            rest.close()
            if server is not None:
                server.stop()
                for collector in collectors:
                    REGISTRY.unregister(collector)
    return 0
