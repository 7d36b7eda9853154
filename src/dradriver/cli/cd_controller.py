"""``dradriver cd-controller``: the ComputeDomain controller (a Deployment of the same image), leader-elected."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import threading
import uuid
from typing import Any

from prometheus_client import REGISTRY

from dradriver.cli.logs import configure_logging
from dradriver.cli.options import add_env_option, check_kubeconfig
from dradriver.cli.status_server import StatusServer, check_bindable
from dradriver.computedomain.controller import Controller, ControllerSettings
from dradriver.computedomain.kube import Rest
from dradriver.computedomain.leader import LeaderElector
from dradriver.computedomain.metrics import ApiWrites
from dradriver.errors import ConfigError

log = logging.getLogger("dradriver.cd-controller")
LEASE_NAME = "dradriver-compute-domain-controller"
# Not the plugin's :8080: with hostNetwork a replica may share a node's network with a plugin pod.
DEFAULT_METRICS_ADDRESS = ":8081"


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Turn each ComputeDomain into its claim templates and a DaemonSet of IMEX daemons, number the daemons of "
        "each clique and report status, until SIGTERM. Replicas elect one leader on a Lease."
    )
    add_env_option(parser, "--kubeconfig", env="DRADRIVER_KUBECONFIG", help="kubeconfig file (default: in-cluster)")
    add_env_option(
        parser,
        "--namespace",
        env="POD_NAMESPACE",
        default="dradriver",
        help="the driver's namespace (daemons, cliques)",
    )
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
        type=int,
        help="the most daemons of one clique (NVL72: 18 trays)",
    )
    add_env_option(
        parser, "--identity", env="POD_NAME", default="", help="this replica's name in the Lease (default: host+uuid)"
    )
    add_env_option(parser, "--lease-duration", env="DRADRIVER_LEASE_DURATION", default=15.0, type=float, help="seconds")
    add_env_option(
        parser, "--interval", env="DRADRIVER_CD_INTERVAL", default=2.0, type=float, help="seconds between passes"
    )
    add_env_option(
        parser,
        "--metrics-address",
        env="DRADRIVER_METRICS_ADDRESS",
        default=DEFAULT_METRICS_ADDRESS,
        help="HOST:PORT serving /metrics, /livez, /readyz and /healthz, which the Deployment's probes call "
        "(empty: off)",
    )
    add_env_option(parser, "--log-format", env="DRADRIVER_LOG_FORMAT", default="text", choices=("text", "json"),
                   help="log line format")  # fmt: skip
    parser.set_defaults(handler=run)


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


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    check_kubeconfig("--kubeconfig", args.kubeconfig)
    if args.metrics_address:
        check_bindable("--metrics-address", args.metrics_address)
    rest = Rest.from_kubeconfig(args.kubeconfig)
    settings = ControllerSettings(
        namespace=args.namespace,
        image=args.image,
        daemon_service_account=args.daemon_service_account,
        daemon_command=tuple(args.daemon_command.split()),
        max_nodes_per_domain=args.max_nodes_per_imex_domain,
        daemon_host_network=args.daemon_host_network == "true",
        daemon_env=daemon_env(args.daemon_env),
    )
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    elector = LeaderElector(
        rest, namespace=args.namespace, name=LEASE_NAME, identity=identity, duration=args.lease_duration
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    controller = Controller(rest, settings)
    status = None
    writes = ApiWrites(rest.writes_so_far)
    if args.metrics_address:
        # Ready as soon as it runs (a standby replica too: nothing is sent to it); alive while no pass is stuck.
        status = StatusServer(
            args.metrics_address,
            readiness=lambda: (True, {"leading": elector.leading.is_set()}),
            liveness=controller.alive,
        )
        REGISTRY.register(writes)
        status.start()

    threading.Thread(target=elector.run, args=(stop,), name="leader-election", daemon=True).start()
    log.info("ready identity=%s namespace=%s pid=%d", identity, args.namespace, os.getpid())
    try:
        controller.run(stop, leading=elector.leading.is_set, interval=args.interval)
    finally:
        elector.release()
        rest.close()
        if status is not None:
            status.stop()
            REGISTRY.unregister(writes)
    return 0
