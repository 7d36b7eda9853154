"""``dradriver run``: the DaemonSet entry point, wiring discovery, slice publishing and the kubelet plugin.

Its flags are read by group (``cli/run_options.py`` over ``cli/flags/``), its parts built one by one
(``cli/run_assembly.py``), kept following the node (``cli/node_loops.py``) and shown to the probes
(``cli/node_status.py``); this module says in which order they start and stop.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

from dradriver.cli import run_options
from dradriver.cli.flags.logs import LogOptions
from dradriver.cli.node_loops import ClaimRechecker, Rescanner
from dradriver.cli.node_status import NodeStatus
from dradriver.cli.run_assembly import (
    Gpus,
    NodeDriver,
    assemble,
    check_device_plugin,
    connect,
    open_gpus,
    start_compute_domains,
)
from dradriver.cli.run_options import RunOptions
from dradriver.cli.stop_signals import StopOnSignals
from dradriver.driver.observe.metrics import NodeCollector, register_node_collector
from dradriver.driver.observe.usage import UsageCollector
from dradriver.driver.publish.slices import SliceSettings
from dradriver.gpu.errors import DriverNotLoaded, LibraryNotFound
from dradriver.gpu.fabric_manager import FabricManagerNotReady
from dradriver.nvidia_install.driver_root import DriverFilesMissing
from dradriver.plugin.cluster.kube import KubeCluster
from dradriver.plugin.kubeletplugin.lifecycle import StopBudget

log = logging.getLogger("dradriver.run")
# The DaemonSet's terminationGracePeriodSeconds is 30: stop within 25 s, leaving the rest for the exit itself.
STOP_BUDGET_SECONDS = 25.0
# How often a start waiting for the NVIDIA driver looks again (and says what it waits for).
DRIVER_WAIT_INTERVAL = 30.0
# How often a started driver asks its readiness until it is ready (then it logs "ready").
READY_POLL_SECONDS = 0.1


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Discover this node's GPUs, publish them as ResourceSlices and serve the kubelet's DRA gRPC API until SIGTERM."
    )
    run_options.add_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    LogOptions.from_args(args).configure()  # first: whatever follows may log
    return DriverProcess(RunOptions.from_args(args)).serve()


def _dump_stacks_on_sigquit() -> None:
    """`kill -QUIT` writes every thread's stack to the log and the driver goes on serving: how a stuck stop or
    prepare is diagnosed on a node without a debugger. Not where stderr is no file (run in-process, output captured)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    faulthandler.register(signal.SIGQUIT, all_threads=True, chain=False)


class DriverProcess:
    """One driver instance: the cluster connection (every flag checked against the cluster's release), the status
    endpoint, discovery, slice publishing, the kubelet plugin and periodic rediscovery, started in that order and
    stopped in reverse."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.stop = threading.Event()
        self.status = NodeStatus(options.node.name)

    def serve(self) -> int:
        """Run until SIGTERM or SIGINT; release everything on the way out, whatever happened."""
        _dump_stacks_on_sigquit()
        with StopOnSignals(self.stop):
            return self._serve_until_signalled()

    def _serve_until_signalled(self) -> int:
        # Before any port is bound, GPU discovered or file written: the flags that depend on the cluster's release
        # (read from the API server unless --kubernetes-version names it) are checked against it.
        cluster, settings = connect(self.options)
        try:
            # NVIDIA's device plugin on this node would hand out the same GPUs: refused before anything is touched.
            check_device_plugin(self.options, cluster)
            # Last, the probes that touch the host: the state file's directory takes a file for a moment, then the
            # port is bound for a moment.
            self.options.gpus.probe_state()
            self.options.status.check()
            self._serve_connected(cluster, settings)
        finally:
            cluster.close()
        return 0

    def _serve_connected(self, cluster: KubeCluster, settings: SliceSettings) -> None:
        # Up before the driver is awaited: meanwhile the pod is alive (no restarts) but not ready.
        server = self.status.server(self.options.status)
        if server:
            server.start()
        try:
            gpus = self._wait_for_driver()
            if gpus is None:
                return
            try:
                self._serve(gpus, cluster, settings)
            finally:
                gpus.close()
        finally:
            if server:
                server.stop()

    def _wait_for_driver(self) -> Gpus | None:
        """Open NVML and discover the driver root, waiting (``--wait-for-driver``) while either is missing, as
        when the GPU Operator installs the driver after this pod started, or while Fabric Manager is not there yet
        or still starting (``--fabric-manager-partitions``). None when stopped meanwhile."""
        deadline = time.monotonic() + self.options.driver_root.wait_for_driver
        while True:
            try:
                gpus = open_gpus(self.options)
                self.status.waiting_for = None
                return gpus
            except (LibraryNotFound, DriverNotLoaded, DriverFilesMissing, FabricManagerNotReady) as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self.status.waiting_for = str(err)
                self._log_waiting(err)
                if self.stop.wait(min(DRIVER_WAIT_INTERVAL, left)):
                    return None

    @staticmethod
    def _log_waiting(err: Exception) -> None:
        if isinstance(err, FabricManagerNotReady):
            log.warning(
                "waiting for Fabric Manager; not ready until it answers (it starts beside the NVIDIA driver, often "
                "after this pod) error=%s retry_in=%ds",
                err,
                DRIVER_WAIT_INTERVAL,
            )
            return
        log.warning(
            "waiting for the NVIDIA driver; not ready until it is there (the GPU Operator installs it after "
            "this pod starts; otherwise fix the driver root) missing=%s retry_in=%ds",
            err,
            DRIVER_WAIT_INTERVAL,
        )

    def _serve(self, gpus: Gpus, cluster: KubeCluster, settings: SliceSettings) -> None:
        """Assemble, serve until stopped; the checkpoint is closed on the way out."""
        node = assemble(self.options, gpus, cluster, settings)
        try:
            self._run_until_stopped(node)
        finally:
            node.checkpoint.close()

    def _run_until_stopped(self, node: NodeDriver) -> None:
        rescanner = Rescanner(node, self.stop)
        rechecker = ClaimRechecker(node, self.stop, republish=rescanner.refresh.set)
        # A health change (a taint to add or remove, a lost GPU back) rescans at once, not at the next interval.
        node.health.subscribe(rescanner.refresh.set)
        # A GPU moved to vfio-pci or back is republished at once, as a freed GPU is after a claim re-check.
        node.driver.on_passthrough_moved(rescanner.refresh.set)
        self.status.node = node
        stopping: list[Callable[[StopBudget], None]] = []
        try:
            self._start(node, stopping)
            self.status.running = True
            rescanner.thread.start()
            if self.options.claims.recheck_interval > 0:
                rechecker.thread.start()
            self._log_serving(node, "serving")
            # "ready" only when /readyz would answer 200: the slices published and the kubelet's registration in.
            if self._wait_until_ready():
                self._log_serving(node, "ready")
            self.stop.wait()
            log.info("stopping")
        finally:
            self._stop(node, stopping, rescanner.refresh, threads=(rescanner.thread, rechecker.thread))

    def _wait_until_ready(self) -> bool:
        """Wait until the readiness probe's answer would be yes (True), or until stopped (False). A readiness check
        that raises counts as not ready, as the status server answers it (503): logged once, never ending the
        driver."""
        logged = False
        while not self.stop.wait(READY_POLL_SECONDS):
            try:
                if self.status.readiness()[0]:
                    return True
            except Exception:  # a bug in a check must not take down a driver that serves claims
                if not logged:
                    log.exception("the readiness check raised; not ready until it answers")
                    logged = True
        return False

    def _log_serving(self, node: NodeDriver, what: str) -> None:
        log.info(
            "%s node=%s driver=%s mig_mode=%s devices=%d",
            what,
            node.name,
            self.options.driver_name,
            self.options.gpus.mig_mode.value,
            sum(spec.device_count for spec in node.pools[node.name]),
        )

    def _start(self, node: NodeDriver, stopping: list[Callable[[StopBudget], None]]) -> None:
        """Start serving; what is started besides the parts every run has (the ComputeDomain driver, the metrics
        collectors) goes onto ``stopping`` as it starts."""
        # The instance lock comes first: a second instance must be refused before it publishes anything.
        node.plugin.start()
        node.publisher.start()
        if self.options.compute_domains.enabled:
            stopping.append(start_compute_domains(node).stop)
        node.health.start(node.gpus.lib, poll_seconds=1.0)
        if self.options.status.address:
            unregister = [register_node_collector(NodeCollector(node.checkpoint, lambda: node.publisher.status.ready))]
            if node.usage is not None:
                node.usage.start(self.options.status.usage_interval)
                unregister.append(register_node_collector(UsageCollector(node.usage)))

            def unregister_metrics(_budget: StopBudget) -> None:
                for call in unregister:
                    call()

            stopping.append(unregister_metrics)

    def _stop(
        self,
        node: NodeDriver,
        stopping: list[Callable[[StopBudget], None]],
        refresh: threading.Event,
        *,
        threads: tuple[threading.Thread, ...],
    ) -> None:
        """Kubernetes kills the pod terminationGracePeriodSeconds (30) after SIGTERM: the work that leaves state
        behind (prepares in flight, which write the checkpoint) goes first, then joins bounded by what is left."""
        budget = StopBudget(STOP_BUDGET_SECONDS)
        self.stop.set()
        refresh.set()
        self.status.running = False
        node.plugin.stop(budget)
        for stop in stopping:
            stop(budget)
        if node.usage is not None:
            node.usage.stop(budget.left(5.0))
        node.publisher.stop(budget.left(10.0))
        node.health.stop(budget.left(10.0))
        for thread in threads:
            if thread.is_alive():
                thread.join(budget.left())  # a rediscovery or unprepare in flight finishes before NVML shuts down
                if thread.is_alive():
                    log.warning("thread still running when the stop budget ran out thread=%s", thread.name)
