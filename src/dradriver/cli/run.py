"""``dradriver run``: the DaemonSet entry point, wiring discovery, slice publishing and the kubelet plugin."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from dradriver.cli import cd_node
from dradriver.cli.driver_root import (
    add_driver_root_options,
    driver_root_for,
    nvml_library_for,
    seconds_or_forever,
)
from dradriver.cli.logs import configure_logging
from dradriver.cli.options import (
    add_env_option,
    add_gpu_options,
    add_slice_options,
    apply_compat,
    check_kubeconfig,
    check_writable_dir,
    check_writable_file,
    dns_subdomain,
    interval_seconds,
    non_negative_float,
    positive_int,
    unwritable_state,
)
from dradriver.cli.status_server import StatusServer, check_bindable
from dradriver.driver.observe.allocations import Allocation, allocations
from dradriver.driver.observe.health import (
    DEFAULT_FATAL_XIDS,
    DEFAULT_IGNORED_XIDS,
    DEFAULT_RECOVERY_PERIOD,
    GpuHealth,
    HealthPolicy,
    TaintEffect,
    parse_xids,
)
from dradriver.driver.observe.metrics import DELETED_CLAIMS, InstrumentedHandler, NodeCollector, register_node_collector
from dradriver.driver.observe.usage import DEFAULT_INTERVAL as DEFAULT_USAGE_INTERVAL
from dradriver.driver.observe.usage import Device as UsageDevice
from dradriver.driver.observe.usage import UsageCollector, UsageSampler, pod_uid_of_pid
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.mps import DEFAULT_COMMAND, MpsControl
from dradriver.driver.prepare.recheck import DEFAULT_INTERVAL as DEFAULT_RECHECK_INTERVAL
from dradriver.driver.prepare.recheck import ClaimLookup, recheck_claims
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.driver.publish.slices import (
    SliceSettings,
    build_slice_specs,
    check_consumable_shares,
    release_problem,
    shape_for,
)
from dradriver.errors import ConfigError, DradriverError
from dradriver.gpu.backend import open_gpu_backend, simulated_mps_command
from dradriver.gpu.errors import DriverNotLoaded, LibraryNotFound
from dradriver.gpu.inventory import MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.driver_root import DriverFilesMissing, DriverRoot
from dradriver.plugin.cluster import ClusterError, NotFoundError, kubernetes_minor_version
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.cluster.kube import KubeCluster
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import consumers
from dradriver.plugin.kubeletplugin.lifecycle import StopBudget, exclusive
from dradriver.plugin.kubeletplugin.plugin import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    SERIALIZE_LOCK_NAME,
    KubeletPlugin,
    KubeletPluginOptions,
    check_pod_uid,
)
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec
from dradriver.quantity import parse_quantity

if TYPE_CHECKING:  # loaded by cd_node.start only with --compute-domains (docs/reliability.md, memory)
    from dradriver.computedomain.plugin import ComputeDomainPlugin

log = logging.getLogger("dradriver.run")
# Probes reach the pod's IP, so listen on every interface; the DaemonSet declares the port.
DEFAULT_STATUS_ADDRESS = ":8080"
# Above client-go's 5/10: each pod start costs a claim GET and a status write, and a node starting 50 pods at once
# must not queue them behind the limit; it still bounds a runaway loop to a rate the API server shrugs off.
DEFAULT_KUBE_API_QPS, DEFAULT_KUBE_API_BURST = 50.0, 100
# The DaemonSet's terminationGracePeriodSeconds is 30: stop within 25 s, leaving the rest for the exit itself.
STOP_BUDGET_SECONDS = 25.0
# How often a start waiting for the NVIDIA driver looks again (and says what it waits for).
DRIVER_WAIT_INTERVAL = 30.0


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Discover this node's GPUs, publish them as ResourceSlices and serve the kubelet's DRA gRPC API until SIGTERM."
    )
    add_env_option(
        parser, "--node-name", env="NODE_NAME", type=dns_subdomain("node name"), help="this node's name (required)"
    )
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
        "--state-dir",
        env="DRADRIVER_STATE_DIR",
        help="where the checkpoint of prepared claims lives (default: the plugin directory); it must survive "
        "plugin restarts but not reboots (a checkpoint from an earlier boot is discarded)",
    )
    add_env_option(
        parser,
        "--gpu-sharing",
        env="DRADRIVER_GPU_SHARING",
        default="exclusive",
        choices=("exclusive", "consumable"),
        help="publish whole GPUs for one claim each, or as consumable capacity (memory, shares) that several "
        "claims share, each limited by its own MPS daemon (KEP-5075, Kubernetes 1.34+ DRAConsumableCapacity)",
    )
    add_env_option(
        parser,
        "--consumable-shares",
        env="DRADRIVER_CONSUMABLE_SHARES",
        metavar="memory|unlimited|N",
        help="NVIDIA's consumable shares: whole GPUs and MIG devices (static MIG) shared by claims (KEP-5075), "
        "each claim taking memory (memory: by default all of it; unlimited: none unless asked) or one of N shares; "
        "each claim's config chooses MPS (limits from what it took), TimeSlicing or nothing (docs/sharing.md)",
    )
    add_env_option(
        parser,
        "--mps-control-command",
        env="DRADRIVER_MPS_CONTROL_COMMAND",
        metavar="COMMAND",
        help="the MPS control command, split like a shell line (default: nvidia-cuda-mps-control, or the simulated "
        "node's stand-in with --gpu-backend sim); claims with MPS get one daemon each, started with -f",
    )
    add_env_option(
        parser,
        "--list-attributes",
        env="DRADRIVER_LIST_ATTRIBUTES",
        default="false",
        choices=("true", "false"),
        help="publish resource.kubernetes.io/numaNode as a list of ints (KEP-6072), as NVIDIA's driver does with "
        "DRAListTypeAttributes: Kubernetes 1.36+ with that feature gate on (a server without it refuses the devices)",
    )
    add_env_option(
        parser,
        "--mps-daemon-wrapper",
        env="DRADRIVER_MPS_DAEMON_WRAPPER",
        metavar="COMMAND",
        help="put before the MPS control command when a claim's daemon starts (not for control calls): a command "
        "that takes the daemon out of this container, so a plugin restart or update leaves it serving, and then "
        "execs it; the chart's is 'nsenter --target 1 --mount --uts --ipc --net -- systemd-run --scope --quiet "
        "--collect --slice=dradriver-mps.slice --' (needs hostPID: true; docs/sharing.md)",
    )
    add_env_option(
        parser,
        "--mps-shm-size",
        env="DRADRIVER_MPS_SHM_SIZE",
        type=_shm_size,
        metavar="QUANTITY",
        help="the size limit of each MPS claim's shared-memory tmpfs, the /dev/shm of its daemon and its containers "
        "(default: half the node's memory, as a tmpfs's and NVIDIA's; docs/sharing.md)",
    )
    add_env_option(
        parser,
        "--metrics-address",
        env="DRADRIVER_METRICS_ADDRESS",
        default=DEFAULT_STATUS_ADDRESS,
        help="HOST:PORT serving /metrics, /livez, /readyz and /healthz, which the DaemonSet's probes call (empty: off)",
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
        type=interval_seconds,
        metavar="SECONDS",
        help="how often to rediscover GPUs and republish slices if they changed "
        "(MIG devices created out of band, a GPU gone); 0: only when device health changes",
    )
    add_env_option(
        parser,
        "--claim-recheck-interval",
        env="DRADRIVER_CLAIM_RECHECK_INTERVAL",
        default=DEFAULT_RECHECK_INTERVAL,
        type=interval_seconds,
        metavar="SECONDS",
        help="how often to look up every prepared claim in the API server and unprepare those deleted behind "
        "the kubelet's back (their MIG instances, MPS daemons and CDI specs freed); 0: only at start-up",
    )
    add_env_option(
        parser,
        "--usage-interval",
        env="DRADRIVER_USAGE_INTERVAL",
        default=DEFAULT_USAGE_INTERVAL,
        type=interval_seconds,
        metavar="SECONDS",
        help="how often to read each GPU's and MIG device's utilisation, memory, temperature, power and processes "
        "from NVML for /metrics and `dradriver top`; 0: off",
    )
    add_env_option(
        parser,
        "--kube-api-qps",
        env="DRADRIVER_KUBE_API_QPS",
        default=DEFAULT_KUBE_API_QPS,
        type=non_negative_float,
        metavar="QPS",
        help="requests a second to the API server after a burst (client-go's QPS); 0: no limit",
    )
    add_env_option(
        parser,
        "--kube-api-burst",
        env="DRADRIVER_KUBE_API_BURST",
        default=DEFAULT_KUBE_API_BURST,
        type=positive_int,
        metavar="N",
        help="requests to the API server that may go at once before --kube-api-qps paces them",
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
    add_driver_root_options(parser)
    _add_claim_status_options(parser)
    _add_health_options(parser)
    cd_node.add_options(parser)
    parser.set_defaults(handler=run)


def _add_claim_status_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("start-up and claim status")
    add_env_option(
        group,
        "--wait-for-driver",
        env="DRADRIVER_WAIT_FOR_DRIVER",
        default=float("inf"),
        type=seconds_or_forever,
        metavar="SECONDS",
        help="while NVML or the driver's files are missing (the GPU Operator installs the driver after this pod "
        "starts), wait this long, not ready, logging what is missing every 30 s; 0: fail at once",
    )

    add_env_option(
        group,
        "--claim-device-status",
        env="DRADRIVER_CLAIM_DEVICE_STATUS",
        default="true",
        choices=("true", "false"),
        help="write prepared devices into the claims' status.devices (API server 1.33+, feature "
        "DRAResourceClaimDeviceStatus)",
    )
    add_env_option(
        group,
        "--device-metadata",
        env="DRADRIVER_DEVICE_METADATA",
        default="false",
        choices=("true", "false"),
        help="give containers KEP-5304 device metadata files under /var/run/kubernetes.io/dra-device-attributes",
    )


def _add_health_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("device health (docs/health.md)")
    add_env_option(
        group,
        "--health-ignore-xids",
        env="DRADRIVER_HEALTH_IGNORE_XIDS",
        default=",".join(map(str, sorted(DEFAULT_IGNORED_XIDS))),
        metavar="XID,...",
        help="XIDs applications cause (informational taint only); 'none' for none",
    )
    add_env_option(
        group,
        "--health-fatal-xids",
        env="DRADRIVER_HEALTH_FATAL_XIDS",
        default=",".join(map(str, sorted(DEFAULT_FATAL_XIDS))),
        metavar="XID,...",
        help="XIDs that always make a GPU unhealthy, even if also ignored; 'none' for none",
    )
    add_env_option(
        group,
        "--health-taint-effect",
        env="DRADRIVER_HEALTH_TAINT_EFFECT",
        default=TaintEffect.NO_SCHEDULE.value,
        choices=(TaintEffect.NO_SCHEDULE.value, TaintEffect.NO_EXECUTE.value),
        help="effect of the taints on unhealthy devices (NoExecute also evicts pods that do not tolerate it)",
    )
    add_env_option(
        group,
        "--health-recovery-period",
        env="DRADRIVER_HEALTH_RECOVERY_PERIOD",
        default=DEFAULT_RECOVERY_PERIOD,
        type=float,
        metavar="SECONDS",
        help="a condition without a GPU reset clears after this long without a new event; 0: only a reset clears",
    )
    add_env_option(
        group,
        "--health-taint-fallback",
        env="DRADRIVER_HEALTH_TAINT_FALLBACK",
        default="withdraw",
        choices=("withdraw", "keep"),
        help="where the API server drops device taints: withdraw unhealthy devices from the slices, or keep "
        "offering them",
    )


def _health_policy(args: argparse.Namespace) -> HealthPolicy:
    def xids(value: str, flag: str) -> frozenset[int]:
        return frozenset() if value.strip().lower() == "none" else parse_xids(value, flag)

    return HealthPolicy(
        ignored_xids=xids(args.health_ignore_xids, "--health-ignore-xids"),
        fatal_xids=xids(args.health_fatal_xids, "--health-fatal-xids"),
        taint_effect=TaintEffect(args.health_taint_effect),
        recovery_period=args.health_recovery_period,
        taint_domain=args.driver_name,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_level)
    apply_compat(args)
    check_config(args)
    return DriverProcess(args).serve()


def check_config(args: argparse.Namespace) -> None:
    """Refuse a configuration that cannot work before anything is created, bound or published (exit 2)."""
    if not args.node_name:
        raise ConfigError("--node-name (or NODE_NAME) is required: set it from the pod's spec.nodeName")
    if args.kubernetes_version:
        shape_for(args.kubernetes_version)  # when unset, the API server is asked later
    if args.pod_uid:
        check_pod_uid(args.pod_uid)
    if args.consumable_shares:
        check_consumable_shares(args.consumable_shares)
        if args.gpu_sharing == "consumable":
            raise ConfigError(
                "--consumable-shares and --gpu-sharing consumable are two ways to share GPUs; choose one "
                "(--gpu-sharing consumable: always MPS, compute shares in percent)"
            )
    if args.metrics_address:
        check_bindable("--metrics-address", args.metrics_address)
    for flag, env, value in (
        ("--registry-dir", "DRADRIVER_REGISTRY_DIR", args.registry_dir),
        ("--cdi-dir", "DRADRIVER_CDI_DIR", args.cdi_dir),
    ):
        if not value:  # Path("") is the current directory, where neither the kubelet nor the runtime looks
            raise ConfigError(f"{flag} ({env}) is empty; give a directory, or unset the variable for the default")
    for flag, value in (
        ("--registry-dir", args.registry_dir),
        ("--plugin-dir", args.plugin_dir),
        ("--cdi-dir", args.cdi_dir),
        ("--state-dir", args.state_dir),
    ):
        if value:
            check_writable_dir(flag, Path(value))
    if args.sim_state:
        check_writable_file("--sim-state", Path(args.sim_state))
    check_kubeconfig("--kubeconfig", args.kubeconfig)
    _health_policy(args)


class DriverProcess:
    """One driver instance: discovery, the cluster connection, slice publishing, the kubelet plugin, the
    status endpoint and periodic rediscovery, started in that order and stopped in reverse."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node: str = args.node_name
        self.mig_mode = MigMode(args.mig_mode)
        self.stop = threading.Event()
        self.checkpoint: CheckpointStore | None = None
        self.compute_domains: ComputeDomainPlugin | None = None
        self.waiting_for: str | None = "starting"  # what start-up still waits for; None once serving
        self.running = False
        self.usage: UsageSampler | None = None
        self._unregister_metrics: Callable[[], None] = lambda: None

    def serve(self) -> int:
        """Run until SIGTERM or SIGINT; release everything on the way out, whatever happened."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop.set())
        # Up first: while the driver is awaited the pod is alive (no restarts) but not ready.
        self.status = (
            StatusServer(
                self.args.metrics_address,
                self._readiness,
                self._liveness,
                self._health,
                documents={"/allocations": self._allocations},
            )
            if self.args.metrics_address
            else None
        )
        if self.status:
            self.status.start()
        try:
            # Before any cluster access: without the driver's libraries no container could use a GPU here.
            if not self._wait_for_driver():
                return 0
            try:
                self._connect()
                try:
                    self._assemble()
                    self._run_until_stopped()
                finally:
                    self.cluster.close()
                    if self.checkpoint is not None:
                        self.checkpoint.close()
            finally:
                self.gpulib.close()
        finally:
            if self.status:
                self.status.stop()
        return 0

    def _wait_for_driver(self) -> bool:
        """Open NVML and discover the driver root, waiting (``--wait-for-driver``) while either is missing, as
        when the GPU Operator installs the driver after this pod started. False when stopped meanwhile."""
        deadline = time.monotonic() + self.args.wait_for_driver
        while True:
            try:
                self._open_gpus()
                try:
                    self.driver_root = driver_root_for(
                        self.args, self.inventory.driver_version, simulated=self.simulated is not None
                    )
                except BaseException:
                    self.gpulib.close()
                    raise
                self.waiting_for = None
                return True
            except (LibraryNotFound, DriverNotLoaded, DriverFilesMissing) as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self.waiting_for = str(err)
                log.warning(
                    "waiting for the NVIDIA driver; not ready until it is there (the GPU Operator installs it after "
                    "this pod starts; otherwise fix the driver root) missing=%s retry_in=%ds",
                    err,
                    DRIVER_WAIT_INTERVAL,
                )
                if self.stop.wait(min(DRIVER_WAIT_INTERVAL, left)):
                    return False

    # -- steps ---------------------------------------------------------------------------------------

    def _open_gpus(self) -> None:
        args = self.args
        state = Path(args.sim_state) if args.sim_state else None
        try:
            self.gpulib, self.simulated = open_gpu_backend(
                args.gpu_backend,
                sim_profile=args.sim_profile,
                node_name=self.node,
                sim_state=state,
                nvml_library=nvml_library_for(args),
            )
        except OSError as err:
            if state is None:
                raise
            raise unwritable_state(state, err) from None
        try:
            self.inventory = discover(self.gpulib)
        except BaseException:
            self.gpulib.close()
            raise
        log.info(
            "discovered gpus=%d mig_devices=%d driver=%s backend=%s",
            len(self.inventory.gpus),
            len(self.inventory.mig_devices),
            self.inventory.driver_version,
            args.gpu_backend,
        )

    def _connect(self) -> None:
        args = self.args
        self.cluster = KubeCluster.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
        try:
            release = self.args.kubernetes_version or _detect_kubernetes_version(self.cluster)
            self.shape = shape_for(release)
            self.settings = SliceSettings(
                driver=self.args.driver_name,
                mig_mode=self.mig_mode,
                shape=self.shape,
                gpu_sharing=self.args.gpu_sharing,
                consumable_shares=self.args.consumable_shares or None,
                list_attributes=self.args.list_attributes == "true",
            )
            problem = release_problem(release, self.settings)
            if problem is not None:
                raise ConfigError(problem)
        except BaseException:
            self.cluster.close()
            raise

    def _assemble(self) -> None:
        args, node = self.args, self.node
        plugin_dir = Path(args.plugin_dir) if args.plugin_dir else DEFAULT_PLUGINS_DIR / args.driver_name
        self.health = GpuHealth(
            inventory=self.inventory,
            mig_mode=self.mig_mode,
            pool=node,
            policy=_health_policy(args),
            state_path=plugin_dir / "health.json",
        )
        # A simulated node has no /dev/nvidia*: bind /dev/null so a real runtime can still inject the spec.
        simulated = self.simulated is not None
        cdi = CdiWriter(
            Path(args.cdi_dir),
            host_path=(lambda _path: "/dev/null") if simulated else lambda _path: None,
            driver_root=self.driver_root,
        )
        state_dir = Path(args.state_dir or args.plugin_dir or DEFAULT_PLUGINS_DIR / args.driver_name)
        # In rolling-update mode the old and the new pod share the checkpoint (their calls are serialised).
        self.checkpoint = CheckpointStore.open(state_dir, shared=bool(args.pod_uid))
        self.driver = GpuDriver(
            GpuDriverOptions(
                driver_name=args.driver_name,
                pool=node,
                mig_mode=self.mig_mode,
                consumable_shares=args.consumable_shares or None,
            ),
            inventory=self.inventory,
            cdi=cdi,
            gpulib=self.gpulib,
            checkpoint=self.checkpoint,
            device_problem=self.health.problem,
            mps=MpsControl(
                root=state_dir / "mps", shm_size=args.mps_shm_size, **_mps_commands(args, simulated, self.driver_root)
            ),
            holder_released=lambda ref, device: _holder_released(self.cluster, args.driver_name, node, ref, device),
        )
        claim_status = (
            ClaimStatusWriter(self.cluster, driver_name=args.driver_name, node_name=node)
            if args.claim_device_status == "true"
            else None
        )
        options = KubeletPluginOptions(
            driver_name=args.driver_name,
            node_name=node,
            registry_dir=Path(args.registry_dir),
            plugin_dir=Path(args.plugin_dir) if args.plugin_dir else None,
            device_metadata_cdi_dir=Path(args.cdi_dir),
            device_metadata=args.device_metadata == "true",
            pod_uid=args.pod_uid or None,
        )
        self.plugin = KubeletPlugin(
            options,
            handler=InstrumentedHandler(self.driver),
            claim_source=self.cluster,
            health_source=self.health,
            claim_status=claim_status,
            # The default state directory is the plugin directory: deleted with it, the checkpoint is written back.
            on_plugin_dir_recreated=self.checkpoint.ensure_written,
        )
        # Refused here, a second instance has not touched the running one's claims, CDI specs or MIG devices.
        self.plugin.lock()
        try:
            self._reconcile()
            # Built once, from the inventory as reconciliation left it; the publisher validates them once too.
            # Kept as the publisher keeps them (JSON text, shared with it): the dict form would hold about 2 MB
            # more for the driver's whole life (docs/reliability.md, memory).
            self.pools = _pools(node, build_slice_specs(self.inventory, self.settings, taints=self.health.taints))
            self.publisher = Publisher(
                self.cluster,
                PublisherOptions(
                    driver=args.driver_name,
                    node_name=node,
                    node_uid=_node_uid(self.cluster, node),
                    shape=self.shape,
                    withdraw_tainted_if_dropped=args.health_taint_fallback == "withdraw",
                ),
                pools=self.pools,
            )
        except BaseException:
            self.plugin.stop()
            raise
        self.usage = (
            UsageSampler(
                self.gpulib,
                self._usage_devices,
                self._allocations_now,
                # A simulated node's PIDs are nobody's: it says itself which pod each process runs for.
                pod_of_pid=self.simulated.pod_of_pid if self.simulated is not None else pod_uid_of_pid,
            )
            if self.status is not None and args.usage_interval > 0
            else None
        )
        # A health change (a taint to add or remove, a lost GPU back) rescans at once, not at the next interval.
        self.refresh = threading.Event()
        self.health.subscribe(self.refresh.set)
        self.rescanner = threading.Thread(target=self._rescan_loop, name="rescan", daemon=True)
        self.rechecker = threading.Thread(target=self._recheck_loop, name="claim-recheck", daemon=True)

    def _reconcile(self) -> None:
        """Before the kubelet can call: finish what a crash left half done, drop what is gone, destroy orphans."""
        cluster = self.cluster
        with _serialised_with_other_pods(self.plugin.plugin_dir, enabled=bool(self.args.pod_uid)):
            self.driver.reconcile(lambda ref: _claim_exists(cluster, ref))
            prepared = {record.uid for record in self.driver.checkpoint.records()}
            self.plugin.remove_unowned_device_metadata(prepared)
        if self.mig_mode is MigMode.DYNAMIC:
            self.inventory = discover(self.gpulib)  # reconciliation may have destroyed MIG instances
            self.driver.update_inventory(self.inventory, self.mig_mode)
            self.health.update_inventory(self.inventory, self.mig_mode)

    def _run_until_stopped(self) -> None:
        try:
            # The instance lock comes first: a second instance must be refused before it publishes anything.
            self.plugin.start()
            self.publisher.start()
            if self.args.compute_domains == "true":
                self.compute_domains = self._start_compute_domains()
            self.health.start(self.gpulib, poll_seconds=1.0)
            if self.status:
                assert self.checkpoint is not None
                collector = NodeCollector(self.checkpoint, lambda: self.publisher.status.ready)
                unregister = [register_node_collector(collector)]
                if self.usage is not None:
                    self.usage.start(self.args.usage_interval)
                    unregister.append(register_node_collector(UsageCollector(self.usage)))
                self._unregister_metrics = lambda: _call_each(unregister)
            self.running = True
            self.rescanner.start()
            if self.args.claim_recheck_interval > 0:
                self.rechecker.start()
            log.info(
                "ready node=%s driver=%s mig_mode=%s devices=%d",
                self.node,
                self.args.driver_name,
                self.mig_mode.value,
                sum(spec.device_count for spec in self.pools[self.node]),
            )
            self.stop.wait()
            log.info("stopping")
        finally:
            # Kubernetes kills the pod terminationGracePeriodSeconds (30) after SIGTERM: the work that leaves state
            # behind (prepares in flight, which write the checkpoint) goes first, then joins bounded by what is left.
            budget = StopBudget(STOP_BUDGET_SECONDS)
            self.stop.set()
            self.refresh.set()
            self.running = False
            self.plugin.stop(budget)
            if self.compute_domains is not None:
                self.compute_domains.stop(budget)
            self._unregister_metrics()
            if self.usage is not None:
                self.usage.stop(budget.left(5.0))
            self.publisher.stop(budget.left(10.0))
            self.health.stop(budget.left(10.0))
            for thread in (self.rescanner, self.rechecker):
                if thread.is_alive():
                    thread.join(budget.left())  # a rediscovery or unprepare in flight finishes before NVML shuts down
                    if thread.is_alive():
                        log.warning("thread still running when the stop budget ran out thread=%s", thread.name)

    def _start_compute_domains(self) -> ComputeDomainPlugin:
        # The IMEX daemon pods run the host driver's nvidia-imex and nvidia-imex-ctl (versions must match it).
        imex = [
            (self.driver_root.host_path(f), path)
            for f in self.driver_root.binaries
            if f.path.name.startswith("nvidia-imex")
            for path in f.container_paths
        ]
        return cd_node.start(
            self.args,
            imex_binaries=imex,
            gpulib=self.gpulib,
            simulated=self.simulated is not None,
            cluster=self.cluster,
            node_uid=_node_uid(self.cluster, self.node),
            shape=self.shape,
        )

    def _liveness(self) -> tuple[bool, dict[str, Any]]:
        """/livez: alive while both gRPC sockets answer. Nothing about the API server: a restart does not cure
        an API outage, so a failing publish must never make the liveness probe restart the pod. Alive while
        starting too: a restart would not bring the driver sooner."""
        if not self.running:
            return True, {"starting": True, "waitingFor": self.waiting_for}
        answering = {
            "draSocket": _socket_answers(self.plugin.dra_socket),
            "registrationSocket": _socket_answers(self.plugin.registration_socket),
        }
        return all(answering.values()), answering

    def _health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: every check, the sockets and the last publish (kube-apiserver's convention)."""
        if not self.running:
            return False, {"starting": True, "waitingFor": self.waiting_for}
        alive, detail = self._liveness()
        published = self.publisher.status
        return alive and published.ready, {
            **detail,
            "slicesPublished": published.ready,
            "publishError": published.last_error,
        }

    def _readiness(self) -> tuple[bool, dict[str, Any]]:
        if not self.running:
            return False, {"starting": True, "waitingFor": self.waiting_for}
        published = self.publisher.status
        registered = self.plugin.registration.status
        ready = published.ready and registered is not None and registered.registered
        return ready, {
            "slicesPublished": published.ready,
            "publishError": published.last_error,
            "registered": bool(registered and registered.registered),
        }

    def _allocations_now(self) -> list[Allocation]:
        return allocations(self.driver.checkpoint.records())

    def _usage_devices(self) -> list[UsageDevice]:
        """Every GPU and MIG device of the last inventory, and MIG devices carved for claims since."""
        inventory = self.inventory
        devices = [UsageDevice(g.name, g.uuid, g.uuid) for g in inventory.gpus]
        devices += [UsageDevice(m.name, m.uuid, m.parent.uuid) for m in inventory.mig_devices if m.uuid]
        known = {d.uuid for d in devices}
        for a in self._allocations_now():
            if a.uuid not in known:
                known.add(a.uuid)
                devices.append(UsageDevice(a.device, a.uuid, a.gpu_uuid))
        return devices

    def _allocations(self) -> dict[str, Any]:
        """/allocations: this node's GPUs, which pod holds which device and, when sampled, how busy each device is
        (``dradriver top`` reads it); empty, with what start-up waits for, until the driver serves."""
        if not self.running:
            return {"node": self.node, "waitingFor": self.waiting_for, "gpus": [], "allocations": [], "usage": []}
        gpus = [
            {"name": g.name, "uuid": g.uuid, "productName": g.info.product_name, "index": g.info.index}
            for g in self.inventory.gpus
        ]
        held = [a.to_json() for a in self._allocations_now()]
        sample = self.usage.latest if self.usage is not None else None
        usage = sample.to_json() if sample is not None else []
        return {"node": self.node, "gpus": gpus, "allocations": held, "usage": usage}

    def _rescan_loop(self) -> None:
        interval = self.args.rescan_interval if self.args.rescan_interval > 0 else None
        while not self.stop.is_set():
            self.refresh.wait(interval)
            self.refresh.clear()
            if self.stop.is_set():
                return
            # The thread must outlive any one failure, or slices, taints and MPS daemons silently stop following
            # the node while /readyz stays green.
            try:
                self._rescan()
                # Like a prepare or unprepare: the other pod of a rolling update may be stopping a daemon now.
                with _serialised_with_other_pods(self.plugin.plugin_dir, enabled=bool(self.args.pod_uid)):
                    self.driver.check_mps_daemons()
            except Exception:
                log.exception("rescan failed unexpectedly; retrying at the next interval or health change")

    def _recheck_loop(self) -> None:
        """Every --claim-recheck-interval: unprepare the claims deleted behind the kubelet's back."""
        cluster, plugin = self.cluster, self.plugin
        rolling = bool(self.args.pod_uid)

        @contextlib.contextmanager
        def hold(uid: str) -> Iterator[None]:
            # As a kubelet call: the claim's lock, and in rolling-update mode the lock the two pods share; only
            # around the unprepare, never around the API look-ups.
            with plugin.claim_locks.hold([uid]), _serialised_with_other_pods(plugin.plugin_dir, enabled=rolling):
                yield

        while not self.stop.wait(self.args.claim_recheck_interval):
            try:
                gone = recheck_claims(self.driver, lambda ref: _look_up_claim(cluster, ref), hold=hold)
                DELETED_CLAIMS.inc(len(gone))
                if gone:
                    with _serialised_with_other_pods(plugin.plugin_dir, enabled=rolling):
                        plugin.remove_unowned_device_metadata({r.uid for r in self.driver.checkpoint.records()})
                    self.refresh.set()  # freed MIG instances and GPUs: republish at once
            except Exception:
                log.exception("claim re-check failed unexpectedly; retrying at the next interval")

    def _follow_driver_upgrade(self, version: str) -> None:
        """NVML reports another driver version than the root was discovered for (an in-place upgrade): find the
        new files for new prepares; claims prepared before keep the old files until their pods restart."""
        old = self.driver_root.version
        try:
            fresh = driver_root_for(self.args, version, simulated=self.simulated is not None)
        except DradriverError as err:
            log.warning(
                "the NVIDIA driver changed but its files are not all there yet; new prepares keep driver %s's "
                "files until they are version=%s error=%s",
                old,
                version,
                err,
            )
            return
        self.driver_root = fresh
        self.driver.cdi.driver_root = fresh
        if self.driver.sharing.mps is not None:  # new daemons start the new driver's binary and libraries
            self.driver.sharing.mps.use(**_mps_commands(self.args, self.simulated is not None, fresh))
        assert self.checkpoint is not None
        prepared = sorted(record.uid for record in self.checkpoint.records())
        log.warning(
            "NVIDIA driver upgraded in place from %s to %s: new prepares use the new files; prepared claims keep "
            "the old driver's files until their pods restart (restart them to use the new driver) claims=%s",
            old,
            version,
            ",".join(prepared) or "-",
        )

    def _rescan(self) -> None:
        """Rediscover and republish if the devices or their health changed; one bad rescan keeps the last
        inventory."""
        try:
            fresh = discover(self.gpulib)
            self.health.update_inventory(fresh, self.mig_mode)
            fresh_pools = _pools(self.node, build_slice_specs(fresh, self.settings, taints=self.health.taints))
        except DradriverError as err:
            log.warning("rediscovery failed; keeping the last inventory error=%s", err)
            return
        if fresh.driver_version != self.driver_root.version:
            self._follow_driver_upgrade(fresh.driver_version)
        if fresh_pools == self.pools:
            return
        log.info(
            "devices or their health changed; republishing gpus=%d mig_devices=%d lost_gpus=%d",
            len(fresh.gpus),
            len(fresh.mig_devices),
            len(fresh.lost_gpus),
        )
        self.pools = fresh_pools
        self.inventory = fresh  # what /allocations and the usage sampler list
        self.driver.update_inventory(fresh, self.mig_mode)
        self.publisher.update(fresh_pools)


def _call_each(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


@contextlib.contextmanager
def _serialised_with_other_pods(plugin_dir: Path, *, enabled: bool) -> Iterator[None]:
    """In rolling-update mode, hold the lock the pods' prepare and unprepare calls take (SerializedHandler), so
    reconciliation never rolls back a prepare the other pod is in the middle of."""
    if not enabled:
        yield
        return
    plugin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with exclusive(plugin_dir / SERIALIZE_LOCK_NAME):
        yield


def _socket_answers(path: Path, timeout: float = 1.0) -> bool:
    """Whether a gRPC server answers on the unix socket ``path`` (the channel becomes ready)."""
    channel = grpc.insecure_channel(f"unix:{path}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def _claim_exists(cluster: KubeCluster, ref: ClaimRef) -> bool | None:
    """Whether the API server still has the claim (False also when it was replaced); None when it cannot say."""
    try:
        uid = cluster.get_resource_claim(ref.namespace, ref.name).get("metadata", {}).get("uid")
    except NotFoundError:
        return False
    except ClusterError as err:
        log.warning("cannot tell whether claim %s still exists; keeping it error=%s", ref, err)
        return None
    return bool(uid == ref.uid)


def _look_up_claim(cluster: KubeCluster, ref: ClaimRef) -> ClaimLookup:
    """The claim as the re-check needs it: gone (or replaced: another UID), there with its pods, or unknown now."""
    try:
        claim = cluster.get_resource_claim(ref.namespace, ref.name)
    except NotFoundError:
        return ClaimLookup(exists=False)
    except ClusterError as err:
        log.warning("claim re-check: cannot tell whether claim %s still exists; keeping it error=%s", ref, err)
        return ClaimLookup(exists=None)
    if claim.get("metadata", {}).get("uid") != ref.uid:
        return ClaimLookup(exists=False)
    status = claim.get("status")
    return ClaimLookup(
        exists=True, consumers=consumers(status.get("reservedFor") if isinstance(status, dict) else None)
    )


def _holder_released(cluster: KubeCluster, driver: str, pool: str, ref: ClaimRef, device: str) -> bool:
    """Whether the API server no longer allocates ``device`` of this node to the claim ``ref``: it was deleted,
    replaced or deallocated (so its pods are gone). False when it cannot say."""
    try:
        claim = cluster.get_resource_claim(ref.namespace, ref.name)
    except NotFoundError:
        return True
    except ClusterError as err:
        log.warning("cannot tell whether claim %s still holds device %s; keeping it error=%s", ref, device, err)
        return False
    if claim.get("metadata", {}).get("uid") != ref.uid:
        return True
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return not any(r.get("driver") == driver and r.get("pool") == pool and r.get("device") == device for r in results)


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


def _mps_commands(args: argparse.Namespace, simulated: bool, driver_root: DriverRoot) -> dict[str, Any]:
    """MpsControl's commands and daemon environment for ``driver_root`` (at start, and after an in-place driver
    upgrade). The daemon loads libcuda like any CUDA program: from the driver root, wherever the host keeps it."""
    env = (
        {}
        if simulated
        else {"LD_LIBRARY_PATH": ":".join(str(driver_root.container_root / d) for d in driver_root.source_dirs)}
    )
    wrapper = shlex.split(str(args.mps_daemon_wrapper or ""))
    return {
        "command": _mps_command(args, simulated, driver_root),
        "daemon_command": _mps_daemon_command(args, simulated, driver_root) if wrapper else [],
        "wrapper": wrapper,
        "env": env,
    }


def _mps_daemon_command(args: argparse.Namespace, simulated: bool, driver_root: DriverRoot) -> list[str]:
    """How a claim's daemon starts after --mps-daemon-wrapper. The wrapper runs it in the host's namespaces, where
    the driver root is at its host path: the binary and its libraries are named there (a simulated node's
    stand-in, or an explicit --mps-control-command, are taken as given)."""
    if simulated or args.mps_control_command:
        return _mps_command(args, simulated, driver_root)
    host = driver_root.host_root
    libraries = ":".join(str(host / d) for d in driver_root.source_dirs)
    binary = next((b.path for b in driver_root.binaries if b.path.name == DEFAULT_COMMAND[0]), None)
    command = [str(host / binary)] if binary is not None else list(DEFAULT_COMMAND)
    return ["env", f"LD_LIBRARY_PATH={libraries}", *command]


def _mps_command(args: argparse.Namespace, simulated: bool, driver_root: DriverRoot) -> list[str]:
    if args.mps_control_command:
        return shlex.split(str(args.mps_control_command))
    if simulated:
        return simulated_mps_command()
    for binary in driver_root.binaries:
        if binary.path.name == DEFAULT_COMMAND[0]:
            return [str(driver_root.container_root / binary.path), *DEFAULT_COMMAND[1:]]
    return list(DEFAULT_COMMAND)


def _shm_size(value: str) -> int:
    """--mps-shm-size: a Kubernetes quantity of at least 1Mi, in bytes."""
    size = parse_quantity(value)
    if size is None or size < 1024 * 1024:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size of at least 1Mi (e.g. 64Mi, 2Gi)")
    return int(size)
