"""Unix sockets and files that a kubelet plugin owns: the instance lock, gRPC servers bound to socket paths,
and the watcher that puts the registration socket back when someone removes it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from dradriver.errors import ConfigError, DradriverError

logger = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
# Big enough for a batch of thousands of claims; the kubelet's own limit is gRPC's default (4 MiB) per reply.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class AlreadyRunningError(DradriverError):
    """Another instance of the same driver already serves this node."""


class PluginLock:
    """An exclusive ``flock`` on a file in the plugin directory, holding the owner's PID.

    The kernel drops the lock when the process dies, so a crash never leaves a stale lock behind.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, description: str) -> None:
        """Take the lock or raise :class:`AlreadyRunningError` naming the lock file and the holder's PID
        (:class:`ConfigError` if the file cannot be opened)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(
                f"cannot open the instance lock file {self.path}: {err.strerror or err}; fix its "
                "permissions or remove what is there, or give this one a different --plugin-dir"
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunningError(
                f"another instance of {description} is already running (PID {holder}): it holds the lock "
                f"{self.path}; stop that process first, or give this one a different --plugin-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: deleting it would let two processes lock different files)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
        """Replace a stale file at the path, bind and serve; on return, clients can connect."""
        check_socket_path(self.path)
        remove_stale(self.path)
        try:
            self._server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as err:
            raise ConfigError(
                f"cannot serve on socket {self.path}: {err}; check the directory exists and is writable"
            ) from err
        self._server.start()
        self.inode = os.stat(self.path).st_ino

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


class RegistrationWatcher:
    """Checks every ``interval`` seconds that the registration socket is in place and re-creates it if not.

    The kubelet learns about plugins only through sockets appearing in its registry directory, so a socket
    deleted by hand or lost with a recreated directory would leave the driver unregistered forever.
    Polling keeps this free of inotify; the check is one ``stat``.
    """

    def __init__(
        self, *, interval: float, is_in_place: Callable[[], bool], recreate: Callable[[], None], directory: Path
    ) -> None:
        self._interval = interval
        self._is_in_place = is_in_place
        self._recreate = recreate
        self._directory = directory
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registration-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; returns once the watcher thread has finished."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            # The kubelet owns the registry directory: wait for it to come back rather than creating it.
            if self._is_in_place() or not self._directory.is_dir():
                continue
            try:
                self._recreate()
            except Exception:
                logger.exception("cannot re-create the registration socket; retrying dir=%s", self._directory)
