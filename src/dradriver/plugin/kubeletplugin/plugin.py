"""KubeletPlugin: everything a DRA driver needs to be a kubelet plugin, started and stopped as one object.

Start order matters to the kubelet: it calls the DRA socket as soon as the registration socket appears, so
the DRA server serves first. Stop order is the reverse: the registration socket goes first (the kubelet
deregisters the plugin when it disappears), then the DRA server stops.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from dradriver.errors import ConfigError, DradriverError
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.handler import DriverHandler, HealthSource
from dradriver.plugin.kubeletplugin.claims import ClaimLocks, ClaimSource
from dradriver.plugin.kubeletplugin.device_metadata import DeviceMetadataWriter
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor, add_dra_services
from dradriver.plugin.kubeletplugin.health import HealthStreams, add_health_services
from dradriver.plugin.kubeletplugin.lifecycle import (
    MAX_SOCKET_PATH_BYTES,
    InstanceLock,
    SerializedHandler,
    SocketServer,
    SocketWatcher,
    StopBudget,
)
from dradriver.plugin.kubeletplugin.registration import (
    DRA_V1,
    DRA_V1BETA1,
    HEALTH_V1,
    HEALTH_V1ALPHA1,
    RegistrationService,
    RegistrationState,
    add_registration_service,
)
from dradriver.validation.names import RESOURCE_DOMAIN_MAX_LENGTH, is_dns_subdomain

logger = logging.getLogger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DRA_SOCKET_NAME = "dra.sock"
LOCK_FILE_NAME = "plugin.lock"
SERIALIZE_LOCK_NAME = "serialize.lock"
CLAIM_STATUS_STOP_SECONDS = 5.0  # the most a stop waits for a claim status write in flight
# A pod's UID as the downward API gives it (a UUID), safe in the per-pod socket and file names.
_POD_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


@dataclass(frozen=True, kw_only=True)
class KubeletPluginOptions:
    """How a :class:`KubeletPlugin` serves: names, directories, intervals and modes (checked when made).

    ``device_metadata_cdi_dir``, if given, turns on KEP-5304 device metadata files, with their CDI specs there;
    with ``device_metadata=False`` as well, none are written but those of earlier runs are removed at unprepare
    and by :meth:`KubeletPlugin.remove_unowned_device_metadata`.

    ``pod_uid`` switches on rolling-update mode (as the upstream kubeletplugin helper's ``RollingUpdate``): the
    registration and DRA sockets get per-pod names (``<driver>-<uid>-reg.sock``, ``dra-<uid>.sock``) so a new
    pod can register next to the old one (the kubelet, 1.33+, prefers the newest), the instance lock admits
    other pods of this driver but not a second process of the same pod nor a fixed-name instance, and
    prepare/unprepare are serialised across the instances by a file lock. Without it the names are fixed and
    one instance at a time serves the node.
    """

    driver_name: str
    node_name: str
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugin_dir: Path | None = None  # default: <plugins dir>/<driver name>
    health_interval: float = 10.0
    registration_check_interval: float = 1.0
    stop_grace: float = 5.0
    stop_drain: float = 20.0
    max_workers: int = 16
    device_metadata_cdi_dir: Path | None = None
    device_metadata: bool = True
    pod_uid: str | None = None
    # The health API versions served and advertised (with a health source), newest first: a 1.37+ kubelet picks
    # v1, 1.34-1.36 know only v1alpha1. Narrow it only to test a kubelet's fallback.
    health_versions: tuple[str, ...] = (HEALTH_V1, HEALTH_V1ALPHA1)

    def __post_init__(self) -> None:
        check_driver_name(self.driver_name)
        unknown = [v for v in self.health_versions if v not in (HEALTH_V1, HEALTH_V1ALPHA1)]
        if unknown or not self.health_versions:
            raise ConfigError(
                f"health_versions {list(self.health_versions)}: name one or both of {HEALTH_V1}, {HEALTH_V1ALPHA1}"
            )
        if self.health_interval <= 0 or self.registration_check_interval <= 0:
            raise ConfigError("health_interval and registration_check_interval must be positive (seconds)")
        if self.pod_uid is not None:
            check_pod_uid(self.pod_uid)


class KubeletPlugin:
    """Serves a driver to the kubelet: DRA v1 + v1beta1 (+ health v1 and v1alpha1) and the registration socket.

    ``options`` say how (:class:`KubeletPluginOptions`); the rest are the parts it works with. ``handler``
    prepares and unprepares claims; ``claim_source`` fetches claims from the API server before prepare;
    ``health_source``, if given, feeds the health stream (and the service is only advertised then).
    ``claim_status``, if given, writes each prepared claim's ``status.devices`` and clears it at unprepare.
    ``claim_locks`` is a seam for tests that need to observe per-claim serialisation.

    ``on_plugin_dir_recreated`` is called after the plugin directory was deleted under the running plugin and
    its DRA socket re-created, so the driver can write back what it keeps there (a checkpoint); if it raises, it is
    called again at each check of the sockets until it returns.
    """

    def __init__(
        self,
        options: KubeletPluginOptions,
        *,
        handler: DriverHandler,
        claim_source: ClaimSource,
        health_source: HealthSource | None = None,
        claim_status: ClaimStatusWriter | None = None,
        claim_locks: ClaimLocks | None = None,
        on_plugin_dir_recreated: Callable[[], None] | None = None,
    ) -> None:
        self.options = options
        self.driver_name = options.driver_name
        self.node_name = options.node_name
        self.pod_uid = options.pod_uid or None
        self.registry_dir = Path(options.registry_dir).absolute()
        self.plugin_dir = Path(options.plugin_dir or DEFAULT_PLUGINS_DIR / options.driver_name).absolute()
        self.dra_socket, self.registration_socket = self._socket_paths()
        self.registration = RegistrationState()
        self.claim_locks = claim_locks or ClaimLocks()
        self.claim_status = claim_status
        if self.pod_uid is not None:
            handler = SerializedHandler(handler, self.plugin_dir / SERIALIZE_LOCK_NAME)
        self._device_metadata = self._device_metadata_writer()
        self._processor = ClaimProcessor(
            driver_name=self.driver_name,
            handler=handler,
            claim_source=claim_source,
            locks=self.claim_locks,
            claim_status=claim_status,
            device_metadata=self._device_metadata,
        )
        self._health = (
            HealthStreams(health_source, interval=options.health_interval) if health_source is not None else None
        )
        health = options.health_versions if self._health else ()
        self.services: tuple[str, ...] = (DRA_V1, DRA_V1BETA1, *health)
        self._lock = InstanceLock(self.plugin_dir / LOCK_FILE_NAME, pod_uid=self.pod_uid)
        self._dra_server: SocketServer | None = None
        self._registration_server: SocketServer | None = None
        self._watcher: SocketWatcher | None = None
        self._mutex = threading.Lock()
        # Set by stop(): a socket check still running then (stop waits for it only so long) installs nothing.
        self._stopping = False
        self._on_plugin_dir_recreated = on_plugin_dir_recreated
        # Set when the DRA socket was re-created and the driver's write-back has not worked yet (watcher thread only).
        self._write_back_pending = False

    def _socket_paths(self) -> tuple[Path, Path]:
        """The DRA and registration sockets: fixed names, or per-pod names in rolling-update mode."""
        if self.pod_uid is None:
            return self.plugin_dir / DRA_SOCKET_NAME, self.registry_dir / f"{self.driver_name}-reg.sock"
        return (
            rolling_update_dra_socket(self.plugin_dir, self.pod_uid),
            rolling_update_registration_socket(self.registry_dir, self.driver_name, self.pod_uid),
        )

    def _device_metadata_writer(self) -> DeviceMetadataWriter | None:
        """KEP-5304 metadata files when the options name a CDI directory for them (written, or only removed)."""
        if self.options.device_metadata_cdi_dir is None:
            return None
        return DeviceMetadataWriter(
            driver_name=self.driver_name,
            plugin_dir=self.plugin_dir,
            cdi_dir=self.options.device_metadata_cdi_dir,
            enabled=self.options.device_metadata,
        )

    def start(self) -> None:
        """Take the instance lock, serve the DRA socket, then create the registration socket and its watcher.

        Raises AlreadyRunningError if another instance serves this driver from the same plugin directory (in
        rolling-update mode: another process of the same pod, or an instance without a pod UID), and
        ConfigError if a directory, the lock file or a socket cannot be created. A second call while started does
        nothing (it would replace the serving sockets and leave a second watcher running).
        """
        if self._watcher is not None:
            return
        with self._mutex:
            self._stopping = False
        _make_dir(self.registry_dir, "kubelet plugin registration directory", "--registry-dir")
        self.lock()
        self._processor.open()
        try:
            self._dra_server = SocketServer(
                self.dra_socket, self._add_dra_services, max_workers=self.options.max_workers
            )
            self._dra_server.start()
            logger.info("serving DRA services socket=%s services=%s", self.dra_socket, ",".join(self.services))
            self._start_registration_server()
            self._watcher = SocketWatcher(
                interval=self.options.registration_check_interval, check=self._put_back_sockets
            )
            self._watcher.start()
        except BaseException:
            self.stop()
            raise

    def lock(self) -> None:
        """Take the instance lock now, if not held yet (``start`` then keeps it): for work on the node's state
        that must wait until no other instance can be serving it, such as reconciling a checkpoint. Raises
        like ``start``; ``stop`` releases it."""
        _make_dir(self.plugin_dir, "plugin directory", "--plugin-dir")
        if not self._lock.held:
            self._lock.acquire(f"driver {self.driver_name} on node {self.node_name}")

    def remove_unowned_device_metadata(self, prepared: Collection[str]) -> None:
        """Before serving: remove the device metadata of claims not in ``prepared`` (the driver's record of
        prepared claims); a failure is logged and tried again at the next start."""
        if self._device_metadata is None:
            return
        try:
            for uid in self._device_metadata.remove_unowned(prepared):
                logger.warning("removed device metadata of a claim that is not prepared claim uid=%s", uid)
        except DradriverError as err:
            logger.error("cannot remove device metadata of claims that are not prepared error=%s", err)

    def stop(self, budget: StopBudget | None = None) -> None:
        """Deregister (remove the registration socket), then stop serving DRA calls; safe to call twice.

        The waits (a socket check in progress: ``stop_grace``; calls in flight: ``stop_grace``, then ``stop_drain``
        for those gRPC gave up on; then the claim status writer) together take at most what ``budget`` leaves; the
        lock is released in any case."""
        budget = budget or StopBudget(math.inf)
        with self._mutex:
            self._stopping = True
        if self._watcher is not None:
            # Its check may be re-creating a socket (stopping the old DRA server takes up to stop_grace).
            watcher_limit = budget.left(self.options.stop_grace)
            if not self._watcher.stop(watcher_limit):
                logger.warning(
                    "the socket watcher did not stop within %.1f s (a check still running); stopping the rest anyway",
                    watcher_limit,
                )
            self._watcher = None
        with self._mutex:
            if self._registration_server is not None:
                self._registration_server.stop(0)
                self._registration_server = None
                logger.info("removed registration socket path=%s", self.registration_socket)
        if self._health is not None:
            self._health.stop()
        with self._mutex:
            dra_server, self._dra_server = self._dra_server, None
        if dra_server is not None:
            dra_server.stop(budget.left(self.options.stop_grace))
            logger.info("stopped DRA services socket=%s", self.dra_socket)
        # Calls gRPC gave up on may still run: the lock is held until they are done. Also when no server is held
        # now (a socket re-creation had taken the old one when the stop came).
        drain = budget.left(self.options.stop_drain)
        if not self._processor.close(drain):
            logger.warning(
                "prepare or unprepare calls still running %.0f s after the DRA server stopped; releasing the "
                "instance lock anyway",
                drain,
            )
        if self.claim_status is not None:
            self.claim_status.stop(budget.left(CLAIM_STATUS_STOP_SECONDS))
        self._lock.release()

    def run_until(self, stop: threading.Event) -> None:
        """Start, serve until ``stop`` is set (e.g. by a SIGTERM handler), then stop in the right order."""
        self.start()
        try:
            stop.wait()
        finally:
            self.stop()

    def __enter__(self) -> KubeletPlugin:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _add_dra_services(self, server: grpc.Server) -> None:
        add_dra_services(server, self._processor)
        if self._health is not None:
            add_health_services(server, self._health, self.options.health_versions)

    def _add_registration_service(self, server: grpc.Server) -> None:
        add_registration_service(
            server,
            RegistrationService(
                driver_name=self.driver_name,
                endpoint=str(self.dra_socket),
                services=self.services,
                state=self.registration,
            ),
        )

    def _start_registration_server(self) -> None:
        server = SocketServer(self.registration_socket, self._add_registration_service, max_workers=2)
        server.start()
        with self._mutex:
            installed = not self._stopping
            if installed:
                self._registration_server = server
        if not installed:
            server.stop(0)  # a stop came meanwhile: nothing may register a plugin that is going away
            return
        logger.info("created registration socket path=%s", self.registration_socket)

    def _put_back_sockets(self) -> None:
        """Re-create what someone removed: the DRA socket (the plugin directory deleted under us; its lock
        files too) and the registration socket. After a new DRA socket the registration socket is re-created
        as well, so the kubelet registers the plugin afresh instead of waiting on a dead endpoint. A missing
        registry directory is the kubelet's to re-create: until it does, there is nowhere to register. The
        driver's write-back (``on_plugin_dir_recreated``) comes last and is tried at each check until it works, so
        its failure never keeps the plugin unregistered."""
        with self._mutex:
            if self._stopping:
                return
            dra_lost = self._dra_server is None or not self._dra_server.is_in_place()
        if dra_lost:
            self._recreate_dra_server()
            self._write_back_pending = self._on_plugin_dir_recreated is not None
        if self.registry_dir.is_dir():
            with self._mutex:
                registration_lost = self._registration_server is None or not self._registration_server.is_in_place()
            if dra_lost or registration_lost:
                self._recreate_registration_server()
        if self._write_back_pending and self._on_plugin_dir_recreated is not None:
            try:
                self._on_plugin_dir_recreated()
            except Exception as err:
                logger.warning(
                    "cannot write back what the driver keeps in the re-created plugin directory; retrying at the "
                    "next check path=%s error=%s",
                    self.plugin_dir,
                    err,
                )
                return
            self._write_back_pending = False

    def _recreate_dra_server(self) -> None:
        with self._mutex:
            if self._stopping:
                return
        logger.warning(
            "DRA socket is gone (was the plugin directory deleted?), re-creating it path=%s", self.dra_socket
        )
        _make_dir(self.plugin_dir, "plugin directory", "--plugin-dir")
        self._lock.renew(f"driver {self.driver_name} on node {self.node_name}")
        with self._mutex:
            old, self._dra_server = self._dra_server, None
        # Stopped before the new one serves, so one server at a time answers at the path; calls in flight on the
        # old connections get the usual grace.
        if old is not None:
            old.stop(self.options.stop_grace)
        server = SocketServer(self.dra_socket, self._add_dra_services, max_workers=self.options.max_workers)
        server.start()
        with self._mutex:
            installed = not self._stopping
            if installed:
                self._dra_server = server
        if not installed:
            server.stop(0)  # the stop went on without waiting for this check; serve nothing after it
            return
        logger.info("serving DRA services again socket=%s", self.dra_socket)

    def _recreate_registration_server(self) -> None:
        logger.warning("re-creating the registration socket path=%s", self.registration_socket)
        with self._mutex:
            old, self._registration_server = self._registration_server, None
        if old is not None:
            old.stop(0)
        self._start_registration_server()


def check_driver_name(driver_name: str) -> None:
    """Raise :class:`ConfigError` unless ``driver_name`` is a driver name the API server accepts."""
    if not is_dns_subdomain(driver_name, max_length=RESOURCE_DOMAIN_MAX_LENGTH):
        raise ConfigError(
            f"driver name {driver_name!r} is not a lower-case DNS subdomain of at most 63 "
            "characters (e.g. gpu.example.com); fix --driver-name"
        )


def check_pod_uid(pod_uid: str) -> None:
    """Raise :class:`ConfigError` unless ``pod_uid`` can name per-pod sockets and locks."""
    if not _POD_UID.fullmatch(pod_uid):
        raise ConfigError(
            f"pod UID {pod_uid!r} is not a Kubernetes UID (letters, digits and '-', at most 64); fix "
            "--pod-uid / POD_UID (set it from the downward API field metadata.uid)"
        )


def rolling_update_registration_socket(registry_dir: Path, driver_name: str, pod_uid: str) -> Path:
    """``<driver>-<uid>-reg.sock``, or a shorter name derived from the UID's hash when that path would not fit
    in a unix socket address (the upstream helper's fallbacks: 8, then 16 characters of the hash)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(pod_uid.encode()).digest()).decode()
    for name in (
        f"{driver_name}-{pod_uid}-reg.sock",
        f"{driver_name}-{digest[:8]}-reg.sock",
        f"dra-{digest[:16]}-reg.sock",
    ):
        path = registry_dir / name
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
            return path
    return path  # too long even so: SocketServer.start names the path and the limit


def rolling_update_dra_socket(plugin_dir: Path, pod_uid: str) -> Path:
    """``dra-<uid>.sock``, or ``dra-<16 characters of the UID's hash>.sock`` when that path would not fit in a unix
    socket address (a second driver's longer directory name, e.g. compute-domain.dradriver.dev, under a deep kubelet
    root: seen on the node tests' kubelet)."""
    path = plugin_dir / f"dra-{pod_uid}.sock"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        return path
    digest = base64.urlsafe_b64encode(hashlib.sha256(pod_uid.encode()).digest()).decode()
    return plugin_dir / f"dra-{digest[:16]}.sock"  # too long even so: SocketServer.start names the path and the limit


def _make_dir(path: Path, what: str, flag: str) -> None:
    """Create ``path`` if missing (owner-only: only the kubelet, as root, connects to the sockets in it), or raise
    :class:`ConfigError` naming it (never a bare OSError). A directory that exists keeps its mode (the kubelet's)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"cannot create the {what} {path}: {err.strerror or err}; fix {flag} or the permissions of its parent"
        ) from err
