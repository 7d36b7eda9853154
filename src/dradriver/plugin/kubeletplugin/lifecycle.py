"""Unix sockets and files that a kubelet plugin owns: the instance lock, gRPC servers bound to socket paths,
and the watcher that puts the registration socket back when someone removes it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from dradriver.errors import ConfigError, DradriverError
from dradriver.plugin.handler import AllocatedClaim, ClaimRef, DriverHandler, PrepareResult

logger = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# Big enough for a batch of thousands of claims; the kubelet's own limit is gRPC's default (4 MiB) per reply.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class StopBudget:
    """The time a whole stop may take, shared by its steps: Kubernetes kills a pod terminationGracePeriodSeconds
    (30 by default) after its SIGTERM, whatever is still running. Each step waits at most its own limit and at most
    what the steps before it left over."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def left(self, limit: float | None = None) -> float:
        """Seconds left, capped at ``limit``; never negative."""
        left = max(0.0, self._end - self._clock())
        return left if limit is None else min(limit, left)


class AlreadyRunningError(DradriverError):
    """Another instance of the same driver already serves this node."""


class InstanceLock:
    """Who may serve a driver from one plugin directory, enforced with ``flock`` (the kernel drops a lock when
    its process dies, so a crash never leaves a stale lock behind).

    Without a pod UID (fixed socket names) an instance takes ``path`` exclusively: one instance at a time.
    With a pod UID (rolling-update mode, per-pod socket names) it takes ``path`` shared, so the old and the
    new pod of an update overlap, yet never with a fixed-name instance (whose sockets would clash with the
    kubelet's view), plus ``plugin-<uid>.lock`` exclusively, so two processes of one pod never serve at once.
    """

    def __init__(self, path: Path, *, pod_uid: str | None = None) -> None:
        self.path = path
        self.pod_uid = pod_uid
        self.pod_path = path.with_name(f"plugin-{pod_uid}.lock") if pod_uid else None
        self._fds: list[int] = []

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def acquire(self, description: str) -> None:
        """Take the lock(s) or raise :class:`AlreadyRunningError` naming the lock file and who holds it
        (:class:`ConfigError` if a file cannot be opened); nothing is held after a failure."""
        try:
            if self.pod_path is None:
                fd = self._take(self.path, fcntl.LOCK_EX)
                if fd is None:
                    raise AlreadyRunningError(
                        f"another instance of {description} is already running ({self._holder(self.path)}): it "
                        f"holds the lock {self.path}; stop that process first, or give this one a different "
                        "--plugin-dir"
                    )
                _write_pid(fd)
                return
            if self._take(self.path, fcntl.LOCK_SH) is None:
                raise AlreadyRunningError(
                    f"an instance of {description} without a pod UID is running ({self._holder(self.path)}): it "
                    f"holds the lock {self.path} exclusively, and fixed socket names cannot overlap with "
                    "rolling-update ones; stop it first, or run every instance with --pod-uid"
                )
            fd = self._take(self.pod_path, fcntl.LOCK_EX)
            if fd is None:
                raise AlreadyRunningError(
                    f"another process of pod {self.pod_uid} already serves {description} "
                    f"({self._holder(self.pod_path)}): it holds the lock {self.pod_path}; stop that process first"
                )
            _write_pid(fd)
        except BaseException:
            self.release()
            raise

    def renew(self, description: str) -> bool:
        """Take the lock again where its files were deleted under us (the plugin directory removed and
        re-created): a lock on a deleted file excludes nobody, since a new instance would lock a new file.
        Returns whether anything was re-taken; raises like ``acquire`` (then the old locks are kept)."""
        paths = [self.path] if self.pod_path is None else [self.path, self.pod_path]
        if not self._fds or all(_is_open_as(fd, path) for fd, path in zip(self._fds, paths, strict=True)):
            return False
        fresh = InstanceLock(self.path, pod_uid=self.pod_uid)
        fresh.acquire(description)
        old, self._fds = self._fds, fresh._fds
        fresh._fds = []
        for fd in old:  # closed, never unlinked: the files at these paths are the new ones
            os.close(fd)
        logger.warning("lock file was deleted under the running instance; locked it again path=%s", self.path)
        return True

    def release(self) -> None:
        """Drop the locks. The shared file stays (deleting it would let two processes lock different files);
        this pod's own file goes, while still locked, so updates do not pile up files."""
        if self.pod_path is not None and len(self._fds) == 2:
            with contextlib.suppress(FileNotFoundError):
                self.pod_path.unlink()
        while self._fds:
            os.close(self._fds.pop())

    def _take(self, path: Path, mode: int) -> int | None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise ConfigError(
                f"cannot open the instance lock file {path}: {err.strerror or err}; fix its "
                "permissions or remove what is there, or give this one a different --plugin-dir"
            ) from err
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        self._fds.append(fd)
        return fd

    @staticmethod
    def _holder(path: Path) -> str:
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            text = ""
        return f"PID {text}" if text else "instances in rolling-update mode"


def _is_open_as(fd: int, path: Path) -> bool:
    """Whether ``path`` is the file open as ``fd`` (not deleted, not replaced by another)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino)


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created owner-only): one holder at a time across processes
    and threads alike (each call opens its own file description, and flock excludes per description)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class SerializedHandler:
    """A :class:`DriverHandler` that runs one prepare or unprepare at a time across every process sharing
    ``lock_path`` (the old and the new pod of a rolling update may both get calls from the kubelet).

    Why one lock and not one per claim or GPU: the two pods share one checkpoint, each rewriting the whole file
    from its copy, and start-up reconciliation must never roll back a prepare the other pod is in the middle
    of; both hold only under one lock. Its cost is small: a prepare holds it for a few milliseconds (see the
    benchmark's 100 concurrent calls, measured in this mode), and within the process the driver still works
    per GPU."""

    def __init__(self, handler: DriverHandler, lock_path: Path) -> None:
        self._handler = handler
        self._lock_path = lock_path

    def prepare_resource_claims(self, claims: Sequence[AllocatedClaim]) -> Mapping[str, PrepareResult]:
        with exclusive(self._lock_path):
            return self._handler.prepare_resource_claims(claims)

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]:
        with exclusive(self._lock_path):
            return self._handler.unprepare_resource_claims(claims)


def check_socket_path(path: Path) -> None:
    """Raise :class:`ConfigError` if ``path`` cannot be a unix socket address (too long, or a directory)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"socket path {path} is {len(os.fsencode(path))} bytes long, more than the "
            f"{MAX_SOCKET_PATH_BYTES} a unix socket address can hold; use a shorter directory"
        )
    if path.is_dir():
        raise ConfigError(f"socket path {path} is a directory; remove it or choose another directory")


def remove_stale(path: Path) -> None:
    """Remove a leftover file at ``path`` (our lock guarantees no live instance of ours serves it)."""
    if path.is_symlink() or path.exists():
        logger.info("removing stale socket file path=%s", path)
        path.unlink()


class SocketServer:
    """A gRPC server bound to one unix socket path, with the services that ``register`` adds."""

    def __init__(self, path: Path, register: Callable[[grpc.Server], None], *, max_workers: int) -> None:
        self.path = path
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"grpc-{path.name}"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        register(self._server)
        self.inode: int | None = None

    def start(self) -> None:
        """Replace a stale file at the path, bind and serve; the path appears only once clients can connect.

        The server binds a hidden name in the same directory and the socket is renamed into place after the
        server started: a kubelet that dials the moment the file appears (its registry watcher does) is never
        refused by a socket that is bound but not yet serving. The kubelet ignores hidden files.
        """
        check_socket_path(self.path)
        remove_stale(self.path)
        staging = self.path.with_name(f".{secrets.token_hex(3)}.sock")
        check_socket_path(staging)
        try:
            self._server.add_insecure_port(f"unix:{staging}")
        except RuntimeError as err:
            raise ConfigError(
                f"cannot serve on socket {self.path}: {err}; check the directory exists and is writable"
            ) from err
        self._server.start()
        try:
            os.chmod(staging, 0o600)  # owner-only: the kubelet (root) is the only client
            os.rename(staging, self.path)
            self.inode = os.stat(self.path).st_ino
        except OSError:
            # The file went (its directory deleted again meanwhile): do not leave a server running unowned.
            self._server.stop(None).wait()
            with contextlib.suppress(OSError):
                staging.unlink()
            raise

    def is_in_place(self) -> bool:
        """Whether the socket file this server created is still at its path."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode

    def stop(self, grace: float | None) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds); remove the socket file if still ours."""
        in_place = self.is_in_place()
        self._server.stop(grace).wait()
        # gRPC unlinks the path itself on shutdown; make sure, but never remove a file someone else put there.
        if in_place:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == self.inode:
                    self.path.unlink()


class SocketWatcher:
    """Calls ``check`` every ``interval`` seconds, on a thread of its own, until stopped; ``check`` puts back
    what someone removed (the registration socket, the plugin directory with the DRA socket) and may raise to
    be retried at the next interval.

    The kubelet learns about plugins only through sockets appearing in its registry directory, so a socket
    deleted by hand or lost with a recreated directory would leave the driver unregistered forever.
    Polling keeps this free of inotify; a check is a ``stat`` per socket.
    """

    def __init__(self, *, interval: float, check: Callable[[], None]) -> None:
        self._interval = interval
        self._check = check
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop watching: wait up to ``timeout`` seconds (None: as long as it takes) for a check in progress to
        end; whether the watcher thread has finished (if not, it ends after that check)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except Exception as err:
                logger.warning(
                    "cannot re-create a socket of the plugin; retrying in %.1f s error=%s", self._interval, err
                )
