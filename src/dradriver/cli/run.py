"""``dradriver run``: the DaemonSet entry point, wiring discovery, slice publishing and the kubelet plugin."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from dradriver.cli.logs import configure_logging
from dradriver.cli.options import add_env_option, add_gpu_options, add_slice_options
from dradriver.cli.status_server import StatusServer
from dradriver.driver.cdi import CdiWriter
from dradriver.driver.health import GpuHealth
from dradriver.driver.metrics import InstrumentedHandler
from dradriver.driver.slices import SliceSettings, build_slice_specs, shape_for
from dradriver.driver.state import GpuDriver
from dradriver.errors import ConfigError, DradriverError
from dradriver.gpu.backend import open_gpu_backend
from dradriver.gpu.inventory import MigMode, discover
from dradriver.plugin.cluster import ClusterError, kubernetes_minor_version
from dradriver.plugin.kube_cluster import KubeCluster
from dradriver.plugin.kubelet_plugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, KubeletPlugin
from dradriver.plugin.publisher import Publisher, SliceSpec

log = logging.getLogger("dradriver.run")
# Probes reach the pod's IP, so listen on every interface; the DaemonSet declares the port.
DEFAULT_STATUS_ADDRESS = ":8080"


def register(subcommands: Any) -> None:
    parser: argparse.ArgumentParser = subcommands.add_parser(
        "run",
        help="run the kubelet plugin (the DaemonSet entry point)",
        description="Discover this node's GPUs, publish them as ResourceSlices and serve the kubelet's DRA "
        "gRPC API until SIGTERM.",
    )
    add_env_option(parser, "--node-name", env="NODE_NAME", help="this node's name (required)")
    add_env_option(
        parser,
        "--kubeconfig",
        env="DRADRIVER_KUBECONFIG",
        help="kubeconfig file; default: in-cluster service account, then $KUBECONFIG",
    )
    add_env_option(
        parser,
        "--registry-dir",
        env="DRADRIVER_REGISTRY_DIR",
        default=str(DEFAULT_REGISTRY_DIR),
        help="kubelet plugin registration directory",
    )
    add_env_option(
        parser,
        "--plugin-dir",
        env="DRADRIVER_PLUGIN_DIR",
        help=f"directory for the DRA socket and lock (default: {DEFAULT_PLUGINS_DIR}/<driver-name>)",
    )
    add_env_option(
        parser,
        "--cdi-dir",
        env="DRADRIVER_CDI_DIR",
        default="/var/run/cdi",
        help="where per-claim CDI specs are written",
    )
    add_env_option(
        parser,
        "--metrics-address",
        env="DRADRIVER_METRICS_ADDRESS",
        default=DEFAULT_STATUS_ADDRESS,
        help="HOST:PORT serving /metrics, /healthz and /readyz, which the DaemonSet's probes call (empty: off)",
    )
    add_env_option(
        parser,
        "--pod-uid",
        env="POD_UID",
        help="this pod's UID (downward API metadata.uid): per-pod socket names, so a rolling update can start "
        "the new pod before the old one stops (kubelet 1.33+); unset: fixed names, one instance per node",
    )
    add_env_option(
        parser,
        "--rescan-interval",
        env="DRADRIVER_RESCAN_INTERVAL",
        default=60.0,
        type=float,
        metavar="SECONDS",
        help="how often to rediscover GPUs and republish slices if they changed "
        "(MIG devices created out of band, a GPU gone); 0: never",
    )
    add_env_option(
        parser,
        "--log-format",
        env="DRADRIVER_LOG_FORMAT",
        default="text",
        choices=("text", "json"),
        help="log line format",
    )
    add_env_option(
        parser,
        "--log-level",
        env="DRADRIVER_LOG_LEVEL",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level",
    )
    add_gpu_options(parser)
    add_slice_options(parser, version_default="")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    if not args.node_name:
        raise ConfigError("--node-name (or NODE_NAME) is required: set it from the pod's spec.nodeName")
    node = args.node_name
    mig_mode = MigMode(args.mig_mode)
    if args.kubernetes_version:
        shape = shape_for(args.kubernetes_version)  # fails fast, before touching GPUs or the API server

    gpulib, simulated = open_gpu_backend(
        args.gpu_backend,
        sim_profile=args.sim_profile,
        node_name=node,
        sim_state=Path(args.sim_state) if args.sim_state else None,
    )
    inventory = discover(gpulib)
    log.info(
        "discovered gpus=%d mig_devices=%d driver=%s backend=%s",
        len(inventory.gpus),
        len(inventory.mig_devices),
        inventory.driver_version,
        args.gpu_backend,
    )

    cluster = KubeCluster.from_kubeconfig(args.kubeconfig)
    if not args.kubernetes_version:
        shape = shape_for(_detect_kubernetes_version(cluster))
    node_uid = _node_uid(cluster, node)
    settings = SliceSettings(driver=args.driver_name, mig_mode=mig_mode, shape=shape)
    specs = build_slice_specs(inventory, settings)
    publisher = Publisher(
        cluster, driver=args.driver_name, node_name=node, node_uid=node_uid, shape=shape, pools=_pools(node, specs)
    )

    # A simulated node has no /dev/nvidia*: bind /dev/null so a real runtime can still inject the spec.
    cdi = CdiWriter(Path(args.cdi_dir), host_path=(lambda _path: "/dev/null") if simulated else lambda _path: None)
    driver = GpuDriver(driver_name=args.driver_name, pool=node, inventory=inventory, mig_mode=mig_mode, cdi=cdi)
    health = GpuHealth(inventory=inventory, mig_mode=mig_mode, pool=node)
    plugin = KubeletPlugin(
        driver_name=args.driver_name,
        node_name=node,
        handler=InstrumentedHandler(driver),
        claim_source=cluster,
        health_source=health,
        registry_dir=Path(args.registry_dir),
        plugin_dir=Path(args.plugin_dir) if args.plugin_dir else None,
        pod_uid=args.pod_uid or None,
    )

    def readiness() -> tuple[bool, dict[str, Any]]:
        published = publisher.status
        registered = plugin.registration.status
        ready = published.ready and registered is not None and registered.registered
        return ready, {
            "slicesPublished": published.ready,
            "publishError": published.last_error,
            "registered": bool(registered and registered.registered),
        }

    status = StatusServer(args.metrics_address, readiness) if args.metrics_address else None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def rescan() -> None:
        nonlocal specs
        while not stop.wait(args.rescan_interval):
            # One bad rescan must not end rescanning for the life of the process: keep the last inventory.
            try:
                fresh = discover(gpulib)
                fresh_specs = build_slice_specs(fresh, settings)
            except DradriverError as err:
                log.warning("rediscovery failed; keeping the last inventory error=%s", err)
                continue
            if fresh_specs != specs:
                log.info(
                    "inventory changed; republishing gpus=%d mig_devices=%d", len(fresh.gpus), len(fresh.mig_devices)
                )
                specs = fresh_specs
                driver.update_inventory(fresh, mig_mode)
                health.update_inventory(fresh, mig_mode)
                publisher.update(_pools(node, fresh_specs))

    rescanner = threading.Thread(target=rescan, name="rescan", daemon=True)

    status_started = False
    try:
        # The instance lock comes first: a second instance must be refused before it publishes anything.
        plugin.start()
        publisher.start()
        health.start(gpulib)
        if status:
            status.start()
            status_started = True
        if args.rescan_interval > 0:
            rescanner.start()
        log.info(
            "ready node=%s driver=%s mig_mode=%s devices=%d",
            node,
            args.driver_name,
            mig_mode.value,
            sum(len(s.get("devices", ())) for s in specs),
        )
        stop.wait()
        log.info("stopping")
    finally:
        stop.set()
        plugin.stop()
        if status and status_started:
            status.stop()
        publisher.stop()
        health.stop()
        if rescanner.is_alive():
            rescanner.join(timeout=30)  # a rediscovery in flight finishes before NVML shuts down
        gpulib.close()
        cluster.close()
    return 0


def _pools(node: str, specs: list[dict[str, Any]]) -> dict[str, list[SliceSpec]]:
    """The one pool a node publishes, named after the node."""
    return {node: [SliceSpec.of(s.get("devices", ()), s.get("sharedCounters", ())) for s in specs]}


def _detect_kubernetes_version(cluster: KubeCluster) -> str:
    """The cluster's ``1.N`` from the API server's /version (the slice layout depends on it)."""
    try:
        version = kubernetes_minor_version(cluster.server_version())
    except ClusterError as err:
        raise ConfigError(
            f"cannot read the API server's version to choose the ResourceSlice layout: {err}; "
            "fix the API server connection or set --kubernetes-version (DRADRIVER_KUBERNETES_VERSION)"
        ) from err
    log.info("detected Kubernetes version=%s (override with --kubernetes-version)", version)
    return version


def _node_uid(cluster: KubeCluster, node: str) -> str | None:
    """The Node's UID for the slices' owner reference (so they are garbage-collected with the Node)."""
    try:
        uid = cluster.get_node(node).get("metadata", {}).get("uid")
        return str(uid) if uid else None
    except ClusterError as err:
        log.warning("cannot read Node %s; slices get no owner reference error=%s", node, err)
        return None
