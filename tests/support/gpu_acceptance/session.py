"""What the node checks share (they run inside the kit's venv): their settings, a recorder that keeps every
result on disk as it comes, and ``dradriver run`` as a process against the API stand-in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from support.gpu_acceptance.report import CheckResult, failed, skipped

DRIVER = "gpu.dradriver.dev"
NODE = "acceptance-node"
SERVING = '"msg": "serving node='
_PORT = re.compile(r"serving metrics and readiness port=(\d+)")


@dataclass(frozen=True)
class SessionConfig:
    """What the outer kit hands the node session (as JSON): where things are and what it found on the host."""

    repo: str
    work: str
    kit_root: str
    backend: str  # "nvml", or "sim" in a rehearsal
    results: str
    logs: str
    mps_control: str  # the host's nvidia-cuda-mps-control ('' when the driver ships none)
    smi_gpus: list[dict[str, str]]
    found_modes: dict[str, dict[str, str]]
    host_probes: dict[str, str]  # "opencl"/"egl" -> '' when the probe ran on the host, else why it does not apply
    deadline: float = 0.0  # time.time() by which the session must have stopped its drivers (0: none)

    @classmethod
    def load(cls, path: Path) -> SessionConfig:
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @property
    def real(self) -> bool:
        return self.backend == "nvml"


class Recorder:
    """The session's results and notes (figures no one check owns), rewritten to ``path`` after each result, so a
    crash keeps what was already known."""

    #: What a check needs left before the deadline to start: the drivers' stops and unprepares come after it.
    RESERVE_S = 40.0

    def __init__(self, path: Path, deadline: float = 0.0) -> None:
        self.path = path
        self.deadline = deadline
        self.results: list[CheckResult] = []
        self.notes: dict[str, Any] = {}

    def add(self, result: CheckResult) -> CheckResult:
        self.results.append(result)
        self.save()
        return result

    def note(self, key: str, value: Any) -> None:
        self.notes[key] = value
        self.save()

    def save(self) -> None:
        document = {"results": [asdict(r) for r in self.results], "notes": self.notes}
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(document, indent=2, default=str))
        partial.replace(self.path)  # whole or not at all, should this process be killed mid-write

    def recorded(self) -> set[str]:
        return {r.name for r in self.results}

    def skip_missing(self, names: Iterable[str], reason: str) -> None:
        """Skip those of ``names`` that have no result yet."""
        self.skip([n for n in names if n not in self.recorded()], reason)

    def fail_missing(self, names: Iterable[str], reason: str) -> None:
        """Fail those of ``names`` that have no result yet."""
        self.fail([n for n in names if n not in self.recorded()], reason)

    def skip(self, names: Iterable[str], reason: str) -> None:
        for name in names:
            self.add(skipped(name, reason))

    def fail(self, names: Iterable[str], reason: str) -> None:
        for name in names:
            self.add(failed(name, reason))

    def out_of_time(self) -> bool:
        return bool(self.deadline) and time.time() > self.deadline - self.RESERVE_S

    def guarded(self, names: Iterable[str], step: Callable[[], object]) -> None:
        """Run ``step``; an exception fails those of ``names`` it left without a result, and the session goes on."""
        try:
            step()
        except Exception as err:  # reported as these checks' failure
            self.fail_missing(names, f"{type(err).__name__}: {err}")

    def timed(self, name: str, check: Callable[[], CheckResult]) -> CheckResult:
        """Run ``check``; an exception it raises is its failure, with the traceback's end in the details. Skipped
        when the run's deadline is too near to start it."""
        if self.out_of_time():
            return self.add(skipped(name, "out of time: the run's deadline is near"))
        started = time.monotonic()
        try:
            result = check()
        except Exception as err:  # any error is this check's failure, and the next check still runs
            result = failed(name, f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-2000:])
        result.seconds = round(time.monotonic() - started, 2)
        return self.add(result)


@dataclass(frozen=True)
class NodeDirs:
    """One driver instance's directories (short paths: unix sockets live in them)."""

    base: Path

    @property
    def registry(self) -> Path:
        return self.base / "registry"

    @property
    def plugin(self) -> Path:
        return self.base / "plugin"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"

    def make(self) -> NodeDirs:
        for folder in (self.registry, self.plugin, self.cdi):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def spec(self, claim_uid: str) -> Path:
        return self.cdi / f"k8s.gpu.dradriver.dev-claim_{claim_uid}.json"

    def mps(self, claim_uid: str) -> Path:
        return self.plugin / "mps" / claim_uid


class DriverProcess:
    """``dradriver run`` as a process, its log (JSON lines) kept in a file and in memory."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.log_path = log_path
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.log_path.open("a") as log:
            for line in self.proc.stderr:
                self.lines.append(line)
                log.write(line)
                log.flush()
                if SERVING in line:
                    self.ready.set()
        self.ready.set()  # it ended: stop waiting

    def wait_ready(self, timeout: float) -> str:
        """'' once it serves, else why not (its log's end)."""
        if self.ready.wait(timeout) and self.proc.poll() is None:
            return ""
        state = f"exited {self.proc.returncode}" if self.proc.poll() is not None else f"not serving after {timeout} s"
        return f"dradriver run {state}: {self.tail()}"

    def tail(self, lines: int = 8) -> str:
        return " | ".join(line.strip()[-300:] for line in self.lines[-lines:])

    @property
    def metrics_port(self) -> int | None:
        ports = [int(m.group(1)) for line in self.lines if (m := _PORT.search(line))]
        return ports[-1] if ports else None

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 30 s; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return self.proc.returncode


def run_command(cfg: SessionConfig, dirs: NodeDirs, kubeconfig: Path, extra: list[str]) -> list[str]:
    """The ``dradriver run`` command line for this host (or the simulated node in a rehearsal)."""
    command = [sys.executable, "-m", "dradriver", "run", "--node-name", NODE, "--kubeconfig", str(kubeconfig)]
    command += ["--registry-dir", str(dirs.registry), "--plugin-dir", str(dirs.plugin), "--cdi-dir", str(dirs.cdi)]
    command += ["--log-format", "json", "--metrics-address", "127.0.0.1:0", "--usage-interval", "1"]
    command += ["--mig-mode", "static", "--wait-for-driver", "0", "--cdi-hook-source", "none"]
    if cfg.real:
        # MPS's control binary as a node finds it: discovered in the driver root (no --mps-control-command).
        command += ["--gpu-backend", "nvml", "--driver-root", "/"]
    else:
        command += [
            "--gpu-backend",
            "sim",
            "--sim-profile",
            "hgx-h100-80gb",
            "--sim-state",
            str(dirs.base / "sim.json"),
        ]
    return command + extra


def http_get(port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def eventually(condition: Callable[[], Any], timeout: float, pause: float = 0.2) -> Any:
    """The first true value of ``condition`` within ``timeout`` seconds, else its last (false) value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(pause)
