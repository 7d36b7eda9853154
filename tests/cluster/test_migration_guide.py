"""docs/migrating-from-device-plugin.md, followed from top to bottom: every `$` line of its console blocks runs, as
written, with bash, against a control plane of this module's own (the real API server, scheduler and controller
manager), and prints what the page shows after it.

The cluster is the page's example: Nodes ``a100-1`` and ``h100-1`` (kept Ready by NodeKeeper) and NVIDIA's plugin
as its static DaemonSet. No kubelet runs, so :class:`KubeletStandIns` does what the two kubelets would, in a thread:
a plugin pod bound to a node makes the Node advertise ``nvidia.com/gpu: 8`` and puts the plugin's socket in the
node's device-plugins directory; when that pod leaves, allocatable drops to 0 and capacity goes a moment later (the
kubelet's grace period, shortened) and so does the socket; while our chart's pod is bound to a node, `dradriver run`
serves that node on simulated GPUs with the pod's ``DRADRIVER_DEVICE_PLUGIN_COEXISTENCE``; a pod being deleted is
finished off (grace period 0). Pods never start.

Output is compared line by line, whitespace-split, after masking ages and the random suffixes of generated names,
the header first and the rows in any order; a ``kubectl get`` whose output does not match yet (a DaemonSet's pods
still moving) is run again until it does, for up to a minute. With GUIDE_PRINT=1 (and ``-s``) the test prints what
each command printed, for updating the page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.cluster_fixtures import own_plane
from support.cluster_node import DriverRun
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane, NodeKeeper
from support.helm import helm
from support.kube_rest import ApiError, Kube

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs/migrating-from-device-plugin.md"
# The page's example cluster: node -> pool.
NODES = {"a100-1": "a100", "h100-1": "h100"}
PROFILE = "dgx-a100-80gb"  # eight A100 80GB, as the page's ResourceSlice shows
GPUS = "8"
PLUGIN = "nvidia-device-plugin-daemonset"
OUR_DAEMONSET = "dradriver-kubelet-plugin"
REAL_DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
# How long the kubelet keeps a stopped plugin's capacity (5 minutes there), shortened for the test.
CAPACITY_GRACE_SECONDS = 3.0
RETRY_SECONDS = 60.0
# Kubernetes' random name suffixes (k8s.io/apimachinery/pkg/util/rand: no vowels, no 0, 1 or 3).
_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]"
_AGE = re.compile(r"^(\d+(s|m|h|d))+$")


@dataclass
class Step:
    """One `$` line of a console block and the lines shown after it (until the next `$` line or the block's end)."""

    command: str
    shown: list[str]


def console_steps(text: str) -> list[Step]:
    """Every command of the page's console blocks, in order; a line ending in a backslash goes on."""
    steps: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        pending = ""
        for line in block.splitlines():
            if pending:
                pending += " " + line.strip()
            elif line.startswith("$ "):
                pending = line[2:]
            else:
                steps[-1].shown.append(line)
                continue
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            steps.append(Step(pending, []))
            pending = ""
    return steps


def example_files(text: str) -> dict[str, str]:
    """The YAML blocks whose first line is a comment naming a file (``# workloads/notebooks.yaml``)."""
    blocks = re.findall(r"```yaml\n# ([\w./-]+\.yaml)\n(.*?)```", text, re.S)
    return {name: body for name, body in blocks}


def masked(token: str) -> str:
    if _AGE.match(token):
        return "<age>"
    names = [re.sub(f"-{_SUFFIX}{{5}}$", "-<random>", name) for name in token.split(",")]
    return ",".join(re.sub(f"-{_SUFFIX}{{6,10}}-<random>$", "-<hash>-<random>", name) for name in names)


def rows(lines: list[str]) -> list[list[str]]:
    return [[masked(t) for t in line.split()] for line in lines if line.strip()]


def matches(shown: list[str], printed: str) -> bool:
    """Whether ``printed`` says what the page shows: the same first line, the same other lines in any order."""
    want, got = rows(shown), rows(printed.splitlines())
    return want[:1] == got[:1] and sorted(want[1:]) == sorted(got[1:])


@dataclass
class KubeletStandIns:
    """What the kubelets of the example's nodes do for this page (see the module's docstring), in a thread."""

    plane: ControlPlane
    root: Path
    drivers: dict[str, DriverRun] = field(default_factory=dict)
    plugin_left: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    driver_logs: dict[str, str] = field(default_factory=dict)
    coexistence_seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet-stand-ins", daemon=True)

    @property
    def kube(self) -> Kube:
        return self.plane.kube

    def device_plugins_dir(self, node: str) -> Path:
        path = self.root / node / "device-plugins"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        for node in list(self.drivers):
            self._stop_driver(node)

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.settle()
            except (ApiError, OSError, RuntimeError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def settle(self) -> None:
        """One pass over every pod of the example's nodes."""
        pods = [p for p in self.kube.list("pods") if p["spec"].get("nodeName") in NODES]
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                meta = pod["metadata"]
                self.kube.delete("pods", meta["name"], meta["namespace"], gracePeriodSeconds="0")
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for node in NODES:
            on_node = {owner(p): p for p in live if p["spec"]["nodeName"] == node}
            self._plugin(node, present=PLUGIN in on_node)
            self._driver(node, on_node.get(OUR_DAEMONSET))

    def _plugin(self, node: str, *, present: bool) -> None:
        """The Node's nvidia.com/gpu and the plugin's socket, as the kubelet keeps them while the plugin runs."""
        socket = self.device_plugins_dir(node) / "nvidia-gpu.sock"
        if present:
            self.plugin_left.pop(node, None)
            socket.touch()
            self._advertise(node, capacity=GPUS, allocatable=GPUS)
            return
        socket.unlink(missing_ok=True)
        left = self.plugin_left.setdefault(node, time.monotonic())
        grace_over = time.monotonic() - left > CAPACITY_GRACE_SECONDS
        self._advertise(node, capacity=None if grace_over else GPUS, allocatable=None if grace_over else "0")

    def _advertise(self, node: str, *, capacity: str | None, allocatable: str | None) -> None:
        status = self.kube.get("nodes", node)["status"]
        if (status["capacity"].get("nvidia.com/gpu"), status["allocatable"].get("nvidia.com/gpu")) == (
            capacity,
            allocatable,
        ):
            return
        patch = {"capacity": {"nvidia.com/gpu": capacity}, "allocatable": {"nvidia.com/gpu": allocatable}}
        self.kube.patch("nodes", node, {"status": patch}, sub="status")

    def _driver(self, node: str, pod: dict[str, Any] | None) -> None:
        """`dradriver run` for the node while our chart's pod is bound to it, with that pod's guard setting."""
        if pod is None:
            self._stop_driver(node)
            return
        if node in self.drivers:
            return
        [container] = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        coexistence = env.get("DRADRIVER_DEVICE_PLUGIN_COEXISTENCE") or "refuse"
        self.coexistence_seen.append(coexistence)
        extra = ("--device-plugin-coexistence", coexistence, "--device-plugins-dir", str(self.device_plugins_dir(node)),
                 "--rescan-interval", "1")  # fmt: skip
        self.drivers[node] = DriverRun(
            self.root / node / "driver", node, self.plane.kubeconfig, profile=PROFILE, mig_mode="static",
            version="1.37", extra=extra,
        )  # fmt: skip

    def _stop_driver(self, node: str) -> None:
        driver = self.drivers.pop(node, None)
        if driver is None:
            return
        driver.stop()
        self.driver_logs[node] = driver.log
        (self.plane.logs / f"dradriver-{node}.log").write_text(driver.log)
        # The kubelet wipes a driver's slices once no instance of it is registered (30 s later there).
        for found in self.kube.list("resourceslices", fieldSelector=f"spec.nodeName={node}"):
            self.kube.delete("resourceslices", found["metadata"]["name"])


def owner(pod: dict[str, Any]) -> str:
    refs = pod["metadata"].get("ownerReferences") or [{}]
    return str(refs[0].get("name", ""))


def plugin_daemonset() -> dict[str, Any]:
    """NVIDIA's plugin as its static manifest installs it (the pods never start here)."""
    labels = {"name": "nvidia-device-plugin-ds"}
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-node-critical",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": PLUGIN, "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": labels}, "template": pod},
    }


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """A control plane of this module's own: the page installs the chart under its default names."""
    yield from own_plane(needed_by="the migration guide", prefix="dra-mg-", who="migration guide test")


@pytest.fixture
def example(plane: ControlPlane, tmp_path: Path) -> Iterator[KubeletStandIns]:
    """The page's example cluster and its files in ``tmp_path``, the kubelet stand-ins running."""
    keepers = [NodeKeeper(plane.kube, node, {"pool": pool, "nvidia.com/gpu.present": "true"})
               for node, pool in NODES.items()]  # fmt: skip
    plane.kube.create("daemonsets", plugin_daemonset(), "kube-system")
    kubelets = KubeletStandIns(plane, plane.root / "nodes")  # short: unix socket paths are limited
    kubelets.start()
    try:
        yield kubelets
    finally:
        kubelets.stop()
        for keeper in keepers:
            keeper.stop()


def shell_env(plane: ControlPlane, kubelets: KubeletStandIns, home: Path) -> dict[str, str]:
    """kubectl, helm and dradriver on PATH; the cluster's kubeconfig; doctor on simulated node a100-1."""
    tools = [str(Path(p).parent) for p in (kubectl(), helm(), sys.executable)]
    return {
        "PATH": os.pathsep.join([*tools, os.environ.get("PATH", "/usr/bin:/bin")]),
        "HOME": str(home),
        "KUBECONFIG": str(plane.kubeconfig),
        "DRADRIVER_GPU_BACKEND": "sim",
        "DRADRIVER_SIM_PROFILE": PROFILE,
        "DRADRIVER_DEVICE_PLUGINS_DIR": str(kubelets.device_plugins_dir("a100-1")),
    }


def run_step(step: Step, workdir: Path, env: dict[str, str], kubelets: KubeletStandIns) -> str:
    """Run one command as the page writes it; its output once it says what the page shows."""
    retry = step.command.startswith("kubectl get") and bool(step.shown)
    deadline = time.monotonic() + (RETRY_SECONDS if retry else 0)
    while True:
        done = subprocess.run(["bash", "-c", step.command], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        printed = done.stdout.replace(env["DRADRIVER_DEVICE_PLUGINS_DIR"], REAL_DEVICE_PLUGINS_DIR)
        said = f"$ {step.command}\nexit {done.returncode}\n{printed}{done.stderr}"
        assert not kubelets.errors, f"{said}\nthe kubelet stand-ins failed: {kubelets.errors}"
        if done.returncode == 0 and (not step.shown or matches(step.shown, printed)):
            if os.environ.get("GUIDE_PRINT"):
                sys.stderr.write(f"$ {step.command}\n{printed}")
            return printed
        if time.monotonic() > deadline:
            shown = "\n".join(step.shown)
            raise AssertionError(f"{said}\nthe page shows:\n{shown}")
        time.sleep(1)


def test_the_guide_moves_a_pool_and_back_as_written(
    plane: ControlPlane, example: KubeletStandIns, tmp_path: Path
) -> None:
    text = GUIDE.read_text()
    workdir = tmp_path / "work"
    for name, body in example_files(text).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(body)
    (workdir / "deployments").symlink_to(REPO / "deployments")
    env = shell_env(plane, example, workdir)
    steps = console_steps(text)
    assert len(steps) > 20, [s.command for s in steps]
    for step in steps:
        run_step(step, workdir, env, example)
        if step.command == "kubectl apply -f workloads/":
            served_by_the_plugin(plane.kube)
        if step.command.startswith("helm upgrade"):
            assert guard_of_the_chart(plane.kube) == "refuse"
    # The chart's pod ran the driver with the page's guard setting (it withheld the GPUs while the Node still
    # advertised the plugin's), and went with the label.
    assert example.coexistence_seen == ["withhold"] and not example.drivers
    assert "withholding every GPU" in example.driver_logs["a100-1"]


def guard_of_the_chart(kube: Kube) -> str | None:
    """The chart DaemonSet's DRADRIVER_DEVICE_PLUGIN_COEXISTENCE."""
    daemonset = kube.get("daemonsets", OUR_DAEMONSET, "dradriver")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    return env.get("DRADRIVER_DEVICE_PLUGIN_COEXISTENCE")


def served_by_the_plugin(kube: Kube) -> None:
    """After the roll-back the workloads as they were are scheduled on the plugin's nvidia.com/gpu again: bound,
    and no claim written for them by the scheduler (the plugin's resource, not our DeviceClass's)."""

    def bound() -> list[dict[str, Any]] | None:
        pods = kube.list("pods", "default", labelSelector="app=notebooks")
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = kube.wait("the notebooks pods to be scheduled", bound, RETRY_SECONDS)
    assert not any(p.get("status", {}).get("extendedResourceClaimStatus") for p in pods), pods


def test_the_parser_reads_steps_and_files() -> None:
    """The reader of the page: continued lines, output, files (so an empty page cannot pass)."""
    page = "```console\n$ helm install a \\\n    --set b=c\n$ kubectl get x\nNAME  AGE\nx-6d5f7c9b8d-2xq4z  5s\n```\n"
    page += "```yaml\n# dir/file.yaml\nkind: Pod\n```\n"
    steps = console_steps(page)
    assert [s.command for s in steps] == ["helm install a --set b=c", "kubectl get x"]
    assert steps[1].shown == ["NAME  AGE", "x-6d5f7c9b8d-2xq4z  5s"]
    assert matches(steps[1].shown, "NAME   AGE\nx-5b8c9d6f4-k2x4z   12m\n")
    assert not matches(steps[1].shown, "NAME   AGE\ny-5b8c9d6f4-k2x4z   12m\n")
    assert example_files(page) == {"dir/file.yaml": "kind: Pod\n"}
