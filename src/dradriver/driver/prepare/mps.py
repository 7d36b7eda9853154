"""MPS control daemons: one per claim that asks for MPS, started, checked and stopped here.

Each daemon gets its own pipe, log and shm directory under ``<state dir>/mps/<claim uid>/``; the claim's containers
get them through the CDI spec (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, and ``/dev/shm``, which the
daemon sees as its own ``/dev/shm`` too: :mod:`dradriver.driver.prepare.mps_shm`). The daemon is the configured
command (``nvidia-cuda-mps-control`` by default; the simulated node runs ``dradriver.sim.mps_standin``) started in
the foreground (``-f``) in a session of its own, so it does not die with the plugin's process: see docs/sharing.md
for how it outlives the plugin's container. Liveness is asked of the daemon itself (``get_server_list`` through
its pipe directory), which works for a daemon this process did not start (re-adoption after a restart).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dradriver.driver.prepare import mps_shm
from dradriver.errors import DeviceError
from dradriver.validation.names import is_path_safe_uid

log = logging.getLogger(__name__)

#: Where the claim's containers see the daemon's directories (NVIDIA's defaults, so CUDA finds them unset too).
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_LOG_DIR = "/var/log/nvidia-mps"
DEFAULT_COMMAND = ("nvidia-cuda-mps-control",)
#: Beside a daemon's pipe and log directories (not in them: they are the containers'): its pid and start time.
IDENTITY_FILE = "daemon.json"


class ControlUnavailable(DeviceError):
    """The control command itself could not be run (missing, or no process to be had): the daemon was not asked,
    so this says nothing of whether it answers."""


class MpsControl:
    """Starts and stops the MPS control daemons of claims; ``root`` holds their pipe and log directories."""

    def __init__(
        self,
        command: Sequence[str],
        root: Path,
        *,
        ready_timeout_s: float = 10.0,
        daemon_command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
        shm_size: int | None = None,
    ) -> None:
        """``daemon_command`` starts a daemon when given (control calls always use ``command``), after
        ``wrapper``: in the shipped DaemonSet ``nsenter … -- systemd-run --scope --`` then ``env
        LD_LIBRARY_PATH=<host dirs> <host binary>``; the wrapper moves the daemon out of the plugin's container and
        then execs it, keeping its pid, which is recorded (docs/sharing.md). ``env``: added to the daemons'
        environment (the driver root's library directories, so the daemon finds ``libcuda`` wherever the host
        keeps it). ``shm_size``: the bytes of each claim's shm tmpfs (default: half the node's memory)."""
        self.root = root
        self.use(command=command, daemon_command=daemon_command, env=env, wrapper=wrapper)
        self.shm_size = shm_size if shm_size is not None else mps_shm.default_size()
        self._can_mount: bool | None = None  # unknown until the first claim's shm directory is made
        self.ready_timeout_s = ready_timeout_s
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._pause = threading.Event()  # never set: waits between checks of a condition another process changes

    def use(
        self,
        *,
        command: Sequence[str],
        daemon_command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        """Start daemons (and make control calls) with these from now on: an in-place driver upgrade moves the
        binary and libraries; daemons already serving keep theirs."""
        if not command:
            raise ValueError("the MPS control command is empty")
        self.command = tuple(command)
        self.daemon_command = tuple(daemon_command)  # empty: the control command
        self.wrapper = tuple(wrapper)
        self.extra_env = dict(env or {})

    def dirs(self, claim_uid: str) -> tuple[Path, Path]:
        """The claim's pipe and log directories, always inside ``root``: a UID that would name anything else (a
        checkpoint edited by hand; Kubernetes UIDs never do) is refused."""
        if not is_path_safe_uid(claim_uid):
            raise DeviceError(
                f"claim UID {claim_uid[:80]!r} cannot name an MPS directory under {self.root} (a Kubernetes UID has "
                "only letters, digits and '-'); is the checkpoint damaged?"
            )
        base = self.root / claim_uid
        return base / "pipe", base / "log"

    def shm_dir(self, claim_uid: str) -> Path:
        """The claim's shm directory, beside its pipe and log directories: the daemon's and its clients'
        ``/dev/shm``."""
        return self.dirs(claim_uid)[0].parent / "shm"

    def start(
        self,
        claim_uid: str,
        device_uuids: Sequence[str],
        commands: Sequence[str],
        *,
        multi_user: bool = False,
        restart: bool = False,
    ) -> dict[str, Any]:
        """Start the claim's daemon, wait until it answers, send ``commands`` (the limits); the recorded identity.
        ``multi_user`` starts it with ``-M`` (MPS's multi-user mode: clients of any user id may connect).

        A start that fails leaves nothing: the daemon is stopped and the claim's directories and tmpfs go. Not so
        for a ``restart`` (a prepared claim whose daemon died): its pods mount those directories, and the tmpfs
        is their whole ``/dev/shm``, so only the process is killed."""
        pipe, logs = self.dirs(claim_uid)
        shm = self.shm_dir(claim_uid)
        undo = self.kill if restart else self.stop
        undo_dirs = functools.partial(undo, {"pipeDir": str(pipe), "logDir": str(logs)})  # before there is a daemon
        private_shm = self._make_claim_dirs(pipe, logs, shm, undo=undo_dirs)
        argv = self._daemon_argv(shm, private_shm=private_shm, multi_user=multi_user)
        env = {**self._env(pipe, logs), "CUDA_VISIBLE_DEVICES": ",".join(device_uuids)}
        child = self._spawn(claim_uid, argv, env, undo=undo_dirs)
        identity = {
            "pid": child.pid,
            "startTime": _start_time(child.pid),
            "pipeDir": str(pipe),
            "logDir": str(logs),
            "shmDir": str(shm),
        }
        try:
            # The checkpoint learns the daemon's pid with the claim's completion; until then (a crash in between)
            # the undo finds it here, and can stop a daemon that never came to answer.
            _write_identity(pipe.parent / IDENTITY_FILE, {"pid": child.pid, "startTime": identity["startTime"]})
            self._await_ready(claim_uid, child, identity, commands)
        except OSError as err:
            undo(identity)
            raise DeviceError(f"starting the MPS control daemon of claim {claim_uid}: {err}") from err
        except DeviceError:
            undo(identity)
            raise
        log.info("started MPS control daemon claim=%s pid=%d devices=%s", claim_uid, child.pid, ",".join(device_uuids))
        return identity

    def _make_claim_dirs(self, pipe: Path, logs: Path, shm: Path, *, undo: Callable[[], None]) -> bool:
        """The claim's pipe, log and shm directories; whether the shm directory is the daemon's own ``/dev/shm``
        (see ``_make_shm``). Should the shm directory fail, ``undo`` takes the others back."""
        self._make_dirs(pipe, logs)
        try:
            return self._make_shm(shm)
        except DeviceError:
            undo()
            raise

    def _daemon_argv(self, shm: Path, *, private_shm: bool, multi_user: bool) -> list[str]:
        """The daemon's command line: the wrapper, the mount namespace that gives it ``shm`` as its ``/dev/shm``
        (where it has one of its own), the daemon in the foreground, ``-M`` for multi-user mode."""
        return [
            *self.wrapper,
            *(mps_shm.namespace_prefix(shm) if private_shm else []),
            *(self.daemon_command or self.command),
            "-f",
            *(["-M"] if multi_user else []),
        ]

    def _spawn(
        self, claim_uid: str, argv: Sequence[str], env: Mapping[str, str], *, undo: Callable[[], None]
    ) -> subprocess.Popen[bytes]:
        """Start the daemon in a session of its own. A command that cannot start calls ``undo`` and raises an error
        that says what to check."""
        try:
            child = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in the plugin's process group: a signal to the plugin spares it
            )
        except OSError as err:
            undo()
            raise DeviceError(
                f"cannot start the MPS control daemon of claim {claim_uid}: {argv[0]}: {err}; is it on this "
                "machine (the control command in the driver root: --mps-control-command; the wrapper: "
                "--mps-daemon-wrapper; unshare, sh and mount for the daemon's /dev/shm)?"
            ) from err
        self._children[child.pid] = child
        return child

    def _await_ready(
        self, claim_uid: str, child: subprocess.Popen[bytes], identity: Mapping[str, Any], commands: Sequence[str]
    ) -> None:
        """Wait until the new daemon answers, sending the limits with the first question (one control call in the
        usual case: each is a process start). Nothing tells a client when a daemon starts listening, so this
        polls, cheaply: a control call only once the pipe directory has an entry (the daemon's socket), checks
        between them growing from 1 ms, up to ``ready_timeout_s``."""
        pipe = Path(str(identity["pipeDir"]))
        text = "".join(f"{line}\n" for line in ("get_server_list", *commands))
        deadline = time.monotonic() + self.ready_timeout_s
        pause = 0.001
        while True:
            if _has_entries(pipe):
                try:
                    self._send(identity, text, what="applying the MPS limits")
                    return
                except DeviceError as err:
                    if commands and self.alive(identity):
                        # It answers now: it refused a limit, or it began to listen just after the call found no
                        # daemon (a socket left by a killed one looks the same). Sending the limits again tells.
                        self._send(identity, text, what="applying the MPS limits")
                        return
                    failure: DeviceError | None = err
            else:
                failure = None
            if child.poll() in (126, 127):
                # The shell of the shm namespace (or the wrapper) could not exec it: not found, or not runnable.
                raise DeviceError(
                    f"cannot start the MPS control daemon of claim {claim_uid}: "
                    f"{' '.join(self.daemon_command or self.command)}: exit status {child.returncode} (not found or "
                    "not executable); is it in the driver root (--mps-control-command, --mps-daemon-wrapper)?"
                )
            if child.poll() is not None or time.monotonic() > deadline:
                why = f" ({failure})" if failure is not None else ""
                if child.returncode is not None:
                    why += f" (it exited with status {child.returncode})"
                raise DeviceError(
                    f"the MPS control daemon of claim {claim_uid} did not become ready within "
                    f"{self.ready_timeout_s:g}s{why}; see {Path(str(identity['logDir'])) / 'control.log'}"
                )
            self._pause.wait(pause)
            pause = min(2 * pause, 0.05)

    def claim_uids(self) -> list[str]:
        """Claims with MPS directories here (start-up stops the daemons of those the checkpoint does not know)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if is_path_safe_uid(p.name) and p.is_dir() and not p.is_symlink()
        )

    def _make_dirs(self, pipe: Path, logs: Path) -> None:
        """The claim's directories: its own one owner-only like the rest of the state directory, the pipe and log
        directories in it open to read (the claim's containers mount them and may run as any user)."""
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            pipe.parent.mkdir(mode=0o700, exist_ok=True)
            for folder in (pipe.parent, pipe, logs):
                if folder.is_symlink():
                    # chmod and the daemon would follow it out of the state directory.
                    raise OSError(f"{folder} is a symbolic link; remove it")
            for folder in (pipe, logs):
                folder.mkdir(exist_ok=True)
                folder.chmod(0o755)  # whatever the umask
        except OSError as err:
            raise DeviceError(f"cannot create the MPS directories {pipe.parent}: {err}; check --state-dir") from err

    def _make_shm(self, shm: Path) -> bool:
        """The claim's shm directory, a tmpfs where this process may mount; whether the daemon gets it as its
        ``/dev/shm`` (that takes a mount namespace, which needs the same privilege). Without it the daemon keeps
        the ``/dev/shm`` it has: enough for the simulated node's stand-in, not for real MPS clients."""
        try:
            mounted = mps_shm.make(shm, self.shm_size, mount=self._can_mount is not False)
        except mps_shm.NoMountPermission as err:
            self._can_mount = False
            log.warning(
                "cannot mount a tmpfs for MPS shared memory (%s); claims' shm directories are plain directories and "
                "their daemons keep their own /dev/shm, so real MPS clients cannot connect: run the plugin "
                "privileged (docs/sharing.md)",
                err,
            )
            return False
        except OSError as err:
            raise DeviceError(f"cannot make the MPS shm directory {shm}: {err}; check --state-dir") from err
        if self._can_mount is None and mounted:
            self._can_mount = True
            if mps_shm.shared_with_host(shm) is False:
                # Said once: the clients' CDI bind is made by the runtime on the host, which sees the directory
                # under this tmpfs unless the mount propagates there.
                log.error(
                    "the MPS shm tmpfs on %s does not propagate to the host: clients would get the directory under "
                    "it and could not reach their daemon; mount the state directory (--state-dir, the plugin "
                    "directory by default) with mountPropagation: Bidirectional, as the chart does",
                    shm,
                )
        return mounted and self._can_mount is not False

    def alive(self, identity: Mapping[str, Any]) -> bool:
        """Whether the daemon answers through its pipe directory; :class:`ControlUnavailable` when that cannot be
        asked (a daemon must not be taken for dead, and killed, because the client could not run)."""
        child = self._children.get(int(identity.get("pid", 0)))
        if child is not None and child.poll() is not None:
            return False
        try:
            self._send(identity, "get_server_list\n", what="checking the daemon")
        except ControlUnavailable:
            raise
        except DeviceError:
            return False
        return True

    def stop(self, identity: Mapping[str, Any]) -> None:
        """Quit the daemon (idempotent: a daemon already gone is success) and remove its directories."""
        base = Path(str(identity.get("pipeDir", ""))).parent
        try:
            self._send(identity, "quit\n", what="stopping the daemon")
            quitting = True
        except DeviceError:
            quitting = False  # not answering (never started listening, or hung): nothing to wait for
        for pid, start_time in self._daemons(identity):
            if not (quitting and self._exited(pid, start_time)) and self._running(pid, start_time):
                log.warning("MPS control daemon did not quit; killing it pid=%d", pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._exited(pid, start_time)  # gone before its directories are
            self._reap(pid)
        if base != Path() and base.parent == self.root:
            try:
                mps_shm.remove(base / "shm")  # a tmpfs would keep rmtree from removing its mount point
            except OSError as err:
                # Raised, not logged: the undo then records the failure and is retried, instead of forgetting the
                # claim with its tmpfs still mounted.
                raise DeviceError(
                    f"cannot remove the MPS shm directory {base / 'shm'}: {err}; unmount it by hand "
                    "(umount -l) or restart the plugin, which retries"
                ) from err
            shutil.rmtree(base, ignore_errors=True)

    def kill(self, identity: Mapping[str, Any]) -> None:
        """SIGKILL the daemon ``identity`` names if that process still runs (its directories are left as they are,
        since containers mount them)."""
        for pid, start_time in self._daemons(identity):
            if self._running(pid, start_time):
                log.warning("killing an MPS control daemon that does not answer pid=%d", pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._exited(pid, start_time)
            self._reap(pid)

    def _daemons(self, identity: Mapping[str, Any]) -> list[tuple[int, object]]:
        """(pid, start time) of the daemon ``identity`` records and of the one its identity file names, when that
        differs: the file is written at every start, the checkpoint only after it, so after a crash or a failed
        checkpoint write in between (a restart by :meth:`start` on a full disk) only the file knows the daemon."""
        found = [(int(identity.get("pid") or 0), identity.get("startTime"))]
        base = Path(str(identity.get("pipeDir", ""))).parent
        if base != Path() and base.parent == self.root:
            on_file = _identity_in(base / IDENTITY_FILE)
            if on_file[0] and on_file not in found:
                found.append(on_file)
        return [(pid, start_time) for pid, start_time in found if pid]

    def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=self.ready_timeout_s)

    def _exited(self, pid: int, start_time: object) -> bool:
        """Wait up to ``ready_timeout_s`` for the daemon to exit; whether it did. Our own child is waited for
        (woken by its exit); one a previous instance started can only be watched through /proc."""
        child = self._children.get(pid)
        if child is not None:
            try:
                child.wait(timeout=self.ready_timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + self.ready_timeout_s
        pause = 0.001
        while self._running(pid, start_time):
            if time.monotonic() > deadline:
                return False
            self._pause.wait(pause)
            pause = min(2 * pause, 0.05)
        return True

    def _running(self, pid: int, start_time: object) -> bool:
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        # Not our child (started before a restart): the same pid with the same start time is the same process.
        return pid > 0 and start_time is not None and _start_time(pid) == start_time

    def _env(self, pipe: Path, logs: Path) -> dict[str, str]:
        return {
            **os.environ,
            **self.extra_env,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }

    def _send(self, identity: Mapping[str, Any], text: str, *, what: str) -> str:
        env = self._env(Path(str(identity["pipeDir"])), Path(str(identity["logDir"])))
        try:
            done = subprocess.run(
                list(self.command), input=text.encode(), env=env, capture_output=True, timeout=10, check=False
            )
        except OSError as err:
            raise ControlUnavailable(f"{what}: cannot run {' '.join(self.command)}: {err}") from err
        except subprocess.TimeoutExpired as err:  # the daemon took the call and never answered: hung
            raise DeviceError(f"{what}: {' '.join(self.command)} got no answer: {err}") from err
        output = (done.stdout + done.stderr).decode(errors="replace").strip()
        if done.returncode != 0:
            raise DeviceError(f"{what}: {' '.join(self.command)} failed: {output or f'exit {done.returncode}'}")
        return output

    def query(self, identity: Mapping[str, Any], command: str) -> str:
        """Ask the daemon one command (e.g. ``get_default_active_thread_percentage``); its answer."""
        return self._send(identity, command + "\n", what=f"asking {command}")


def _write_identity(path: Path, identity: Mapping[str, Any]) -> None:
    """Owner-only, like the rest of the state directory, and never through a link planted under its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(dict(identity)))


def _has_entries(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except OSError:
        return False


def _identity_in(path: Path) -> tuple[int, object]:
    """(pid, start time) from a daemon's identity file; (0, None) when there is none (never started)."""
    try:
        found = json.loads(path.read_text())
        return int(found["pid"]), found.get("startTime")
    except (OSError, ValueError, KeyError, TypeError):
        return 0, None


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat): with the pid, an
    identity that a recycled pid does not share."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None  # exited, not yet reaped by its parent: dead all the same
    return int(fields[19])
