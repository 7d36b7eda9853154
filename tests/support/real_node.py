"""A real Kubernetes node on loopback for the `node` tests: containerd (CRI, CDI on) and the kubelet of the pinned
release, from the binaries ``scripts/build-node`` builds, registered with the `cluster` tests' control plane; and
`dradriver run` (simulated GPUs) as a host process, registered with that kubelet through its plugin directory.

Everything lives under one temporary directory: containerd's root, state and socket; the kubelet's root (which
it bind-mounts onto itself, so teardown unmounts it), its pod logs and its certificates; the driver's CDI
directory, which containerd reads specs from. Images come from :mod:`support.oci_images`, imported into
containerd's ``k8s.io`` namespace. Pods get their own network namespace on a bridge of the node's own (CNI
``bridge`` and ``host-local`` plugins of Debian's containernetworking-plugins), with no route off the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.cluster_node import DRIVER, DriverRun
from support.control_plane import (
    FEATURE_GATES,
    Component,
    ControlPlane,
    free_port,
    issue_client_certificate,
    write_kubeconfig,
)
from support.kube_rest import ApiError, Kube
from support.oci_images import SANDBOX_IMAGE, build_archives

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-node"
BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
# From the distribution: the OCI runtime, the busybox the images are made of, the CNI plugins.
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_FILES = (RUNC, "/bin/busybox", *(str(CNI_BIN_DIR / name) for name in ("bridge", "host-local", "loopback")))
START_TIMEOUT = 120.0
# The taint that keeps the `cluster` tests' pods (which the kubelet stand-in serves) off the real node; pods meant
# for it tolerate it (see :func:`for_this_node`).
TAINT_KEY = "dradriver.dev/real-node"
KUBELET_FEATURE_GATES = {
    **{gate: value == "true" for gate, value in (g.split("=") for g in FEATURE_GATES.split(","))},
    # Device health in pod status (KEP-4680), with the driver's message.
    "ResourceHealthStatus": True,
    "ResourceHealthStatusMessage": True,
}


def binaries_dir() -> Path:
    """Where ``scripts/build-node`` puts (or would put) the binaries for the pinned release."""
    override = os.environ.get("DRADRIVER_NODE_DIR")
    if override:
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, check=True, timeout=30)
    return Path(out.stdout.strip())


def missing(directory: Path) -> list[str]:
    """What the node needs and this machine lacks: built binaries and the distribution's tools."""
    gone = [str(directory / name) for name in BINARIES if not os.access(directory / name, os.X_OK)]
    gone += [path for path in HOST_FILES if not os.path.exists(path)]
    if os.geteuid() != 0:
        gone.append("root (containerd and the kubelet mount, create cgroups and namespaces)")
    return gone


def wait_for(what: str, condition: Callable[[], Any], timeout: float = START_TIMEOUT, interval: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (the order to unmount them)."""
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if point == str(path) or point.startswith(f"{path}/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_all(path: Path) -> None:
    """Unmount everything the kubelet and containerd mounted below ``path`` (volumes, the kubelet's bind mount of
    its own root, sandboxes' shm), lazily, deepest first."""
    for _attempt in range(5):
        points = _mounts_under(path)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


@dataclass
class Containerd:
    """containerd 2.x with its own root, state and socket; CRI with CDI specs from ``cdi_dir``."""

    binaries: Path
    root: Path
    cdi_dir: Path
    logs: Path
    component: Component | None = None

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def bridge(self) -> str:
        """This node's Linux bridge (interface names have at most 15 characters)."""
        return "drabr" + hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    def config(self) -> str:
        cni = self.root / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        # containerd needs an eth0 with an address in every sandbox ("failed to find network info" with only
        # loopback): a bridge of its own, no gateway, no masquerading, so nothing on the host's network changes.
        subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}.0/24"
        bridge = {
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": False,
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(self.root / "ipam")},
        }
        (cni / "10-pods.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "dradriver-node", "plugins": [bridge]})
        )
        return f"""version = 3
# NRI would listen on a fixed host path (/var/run/nri/nri.sock), shared by every containerd on the machine.
disabled_plugins = ["io.containerd.nri.v1.nri"]
root = "{self.root / "root"}"
state = "{self.root / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{self.root / "opt"}"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{SANDBOX_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  # This sandbox refuses to lower oom_score_adj; without this every sandbox fails in runc ("can't get final
  # child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  # Pods' network namespaces below our state directory, not /var/run/netns: teardown unmounts them.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
"""

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.toml"
        config.write_text(self.config())
        env = {**os.environ, "PATH": f"{self.binaries}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        self.component = Component(
            "containerd",
            [str(self.binaries / "containerd"), "--config", str(config), "--log-level", "info"],
            self.logs / "containerd.log",
            env=env,
        )
        self.component.start()
        wait_for("containerd to answer", lambda: self.ctr_ok("version") or not self.component_alive(), 60)
        if not self.component_alive():
            raise RuntimeError(f"containerd exited:\n{self.component.tail()}")

    def component_alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binaries / "ctr"), "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip

    def ctr_ok(self, *args: str) -> bool:
        return self.socket.exists() and self.ctr(*args, timeout=10).returncode == 0

    def import_images(self, directory: Path) -> list[str]:
        names = []
        for name, archive in build_archives(directory).items():
            # --local: unpacked by ctr itself; through the transfer service it would need an unpack_config
            # naming the native snapshotter ("no unpack platforms defined" otherwise).
            done = self.ctr("images", "import", "--local", "--snapshotter", "native", str(archive))
            if done.returncode != 0:
                raise RuntimeError(f"ctr images import {archive} ({name}) failed:\n{done.stdout}{done.stderr}")
            names.append(name)
        listed = self.ctr("images", "ls", "-q").stdout.split()
        absent = [name for name in names if name not in listed]
        if absent:
            raise RuntimeError(f"images {absent} not in containerd after import (has {listed})")
        return names

    def import_archive(self, archive: Path, base_name: str) -> None:
        """An OCI archive (our image: support/image.py) into the k8s.io namespace, as ``<base_name>:<tag>``."""
        done = self.ctr("images", "import", "--local", "--snapshotter", "native", "--base-name", base_name,
                        str(archive), timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed:\n{done.stdout}{done.stderr}")

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False, timeout=30)


@dataclass
class Kubelet:
    """The kubelet, registered as Node ``name`` with a node identity (``system:node:<name>``)."""

    binaries: Path
    root: Path
    name: str
    control_plane: ControlPlane
    containerd_socket: Path
    logs: Path
    component: Component | None = None
    port: int = field(default_factory=free_port)
    healthz_port: int = field(default_factory=free_port)

    @property
    def root_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    def config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            # The API server reaches the kubelet (logs, exec) without a client certificate here.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            # This machine: no systemd, cgroup v1 (hybrid), swap on, the native snapshotter's file systems.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "localStorageCapacityIsolation": False,
            "resolvConf": "",
            # Never evict or collect our images: nothing could pull them back.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Quick pod status and node status: tests poll for them.
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "featureGates": KUBELET_FEATURE_GATES,
            "registerWithTaints": [{"key": TAINT_KEY, "effect": "NoSchedule"}],
            "serializeImagePulls": False,
        }

    def write_files(self) -> tuple[Path, Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "kubelet-config.json"
        config.write_text(json.dumps(self.config(), indent=1))
        pki = self.control_plane.pki
        cert, key = issue_client_certificate(pki, f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes")
        kubeconfig = write_kubeconfig(self.root / "kubelet.kubeconfig", self.control_plane.server, pki.ca_cert,
                                      cert, key)  # fmt: skip
        return config, kubeconfig

    def start(self) -> None:
        config, kubeconfig = self.write_files()
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.component = Component(
            "kubelet",
            [
                str(self.binaries / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={self.root / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                "--v=4",
            ],
            self.logs / "kubelet.log",
        )
        self.component.start()

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.healthz_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@dataclass
class RealNode:
    """containerd + kubelet + `dradriver run` on simulated GPUs (``profile``, ``mig_mode``), as Node ``name``."""

    binaries: Path
    root: Path
    control_plane: ControlPlane
    name: str = "localhost"
    profile: str = "mixed"
    mig_mode: str = "dynamic"
    # The driver's name (its plugin directory is named after it) and the arguments every start of it gets: the
    # NVIDIA-compatible node runs `--compat nvidia` as gpu.nvidia.com.
    driver_name: str = DRIVER
    driver_args: tuple[str, ...] = ()
    containerd: Containerd = field(init=False)
    kubelet: Kubelet = field(init=False)
    drivers: list[DriverRun] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cdi_dir = self.root / "cdi"
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self.containerd = Containerd(self.binaries, self.root / "containerd", self.cdi_dir, self.logs)
        self.kubelet = Kubelet(self.binaries, self.root, self.name, self.control_plane, self.containerd.socket,
                               self.logs)  # fmt: skip

    @property
    def kube(self) -> Kube:
        return self.control_plane.kube

    @property
    def driver(self) -> DriverRun:
        return self.drivers[-1]

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet.plugins_dir / self.driver_name

    def start(self) -> None:
        self.containerd.start()
        self.images = self.containerd.import_images(self.root / "images")
        self.start_kubelet()
        self.start_driver()

    def start_kubelet(self) -> None:
        self.kubelet.start()
        try:
            wait_for("the kubelet's /healthz", lambda: self.kubelet.healthy() or not self.kubelet.alive())
            wait_for(f"Node {self.name} to be Ready", lambda: self.ready() or not self.kubelet.alive())
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}:\n{self.tails()}") from None
        if not self.kubelet.alive():
            raise RuntimeError(f"the kubelet exited:\n{self.tails()}")
        self._untaint_not_ready()

    def ready(self) -> bool:
        node = self.kube.find("nodes", self.name)
        return node is not None and node_ready(node)

    def prepared_claims(self) -> list[str]:
        """UIDs of the claims the driver's checkpoint holds (its on-disk record of what is prepared)."""
        path = self.plugin_dir / "checkpoint.json"
        if not path.exists():
            return []
        return sorted(json.loads(path.read_text())["data"]["claims"])

    def _untaint_not_ready(self) -> None:
        # Admission taints a new Node not-ready; the node lifecycle controller (not run here) lifts it once Ready.
        def lifted() -> bool:
            node = self.kube.get("nodes", self.name)
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if not t["key"].startswith("node.kubernetes.io/")]
            if kept != taints:
                self.kube.patch("nodes", self.name, {"spec": {"taints": kept}})
            return kept == taints

        wait_for(f"node {self.name} to lose its not-ready taint", lifted, 30)

    def container_output(self, pod: dict[str, Any]) -> dict[str, list[str]]:
        """Each container's output so far, read from the kubelet's pod log files (CRI format: time, stream, tag,
        text): works on a node the API server cannot reach for ``kubectl logs`` (any but the one named
        ``localhost``, see docs/node-tests.md)."""
        meta = pod["metadata"]
        directory = self.root / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        output: dict[str, list[str]] = {}
        for container in sorted(directory.glob("*/")) if directory.is_dir() else []:
            lines = []
            for log in sorted(container.glob("*.log")):
                lines += [line.split(" ", 3)[3] for line in log.read_text().splitlines() if line.count(" ") >= 3]
            output[container.name] = lines
        return output

    def container_pids(self) -> dict[str, int]:
        """containerd's task of each running container (its ID, as a pod's ``containerStatuses`` names it after
        ``containerd://``) and that task's host pid."""
        listed = self.containerd.ctr("tasks", "ls").stdout.splitlines()[1:]
        return {words[0]: int(words[1]) for words in (line.split() for line in listed) if len(words) >= 3}

    def registrations(self, driver: DriverRun | None = None) -> int:
        """How often the kubelet has registered ``driver`` (default: the newest) so far."""
        return (driver or self.driver).log.count("kubelet registered the plugin")

    def start_driver(
        self,
        *,
        pod_uid: str | None = None,
        wait_registered: bool = True,
        mig_mode: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> DriverRun:
        """`dradriver run` with the node's settings, ``driver_args`` and ``extra`` (``mig_mode`` overrides the
        node's for this instance only); by default returns once the kubelet has registered it."""
        extra = (*self.driver_args, *extra, *(("--pod-uid", pod_uid) if pod_uid else ()))
        driver = DriverRun(
            self.root / "driver",
            self.name,
            self.control_plane.kubeconfig,
            profile=self.profile,
            mig_mode=mig_mode or self.mig_mode,
            version="1.37",
            extra=extra,
            registry_dir=self.kubelet.registry_dir,
            plugin_dir=self.plugin_dir,
            cdi_dir=self.cdi_dir,
        )
        self.drivers.append(driver)
        if wait_registered:
            wait_for("the kubelet to register the driver", lambda: self.registrations(driver) > 0, 60)
        return driver

    def stop_driver(self, driver: DriverRun, signum: int = 15) -> int:
        code = driver.stop(signum)
        self._save_driver_log(driver)
        return code

    def _save_driver_log(self, driver: DriverRun) -> None:
        number = self.drivers.index(driver)
        (self.logs / f"dradriver-{number}.log").write_text(driver.log)

    def sim(self, *args: str) -> str:
        """`dradriver sim ARGS` on this node's simulated GPUs (what an admin with nvidia-smi would do)."""
        done = subprocess.run(
            [sys.executable, "-m", "dradriver", "sim", "--sim-profile", self.profile, "--sim-state",
             str(self.root / "driver" / "sim.json"), "--node-name", self.name, *args],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"dradriver sim {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def restart_kubelet(self) -> None:
        self.kubelet.stop()
        self.kubelet.start()
        wait_for("the kubelet's /healthz after a restart", lambda: self.kubelet.healthy() or not self.kubelet.alive())
        if not self.kubelet.alive():
            raise RuntimeError(f"the kubelet exited:\n{self.tails()}")

    def tails(self, lines: int = 40) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            text = "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            parts.append(f"--- {log.name} (last {lines} lines) ---\n{text}")
        for number, driver in enumerate(self.drivers):
            text = "\n".join(driver.log.splitlines()[-lines:])
            parts.append(f"--- dradriver run #{number} (last {lines} lines) ---\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Delete the pods left on the node, then stop everything and unmount what the kubelet mounted."""
        for driver in self.drivers:
            if driver.proc.poll() is None:
                with contextlib.suppress(Exception):
                    driver.stop()
            self._save_driver_log(driver)
        self.kubelet.stop()
        # Pods' containers outlive the kubelet; their shims and sandboxes go with containerd's tasks.
        tasks = self.containerd.ctr("tasks", "ls", "-q").stdout.split() if self.containerd.component_alive() else []
        for task in tasks:
            self.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=30)
        self.containerd.stop()
        _kill_shims(self.containerd.root)
        unmount_all(self.root)
        with contextlib.suppress(ApiError):
            self.kube.request("DELETE", f"/api/v1/nodes/{self.name}")

    def discard(self) -> None:
        """Remove everything but the logs."""
        for child in self.root.iterdir():
            if child != self.logs:
                shutil.rmtree(child, ignore_errors=True)


def _kill_shims(containerd_root: Path) -> None:
    """containerd-shim-runc-v2 processes of this containerd (their command line names its state directory's
    socket address) are killed by PID; nothing else is touched."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            cmdline
            and cmdline[0].endswith(b"containerd-shim-runc-v2")
            and str(containerd_root).encode() in b" ".join(cmdline)
        ):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), 9)
