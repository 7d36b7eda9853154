"""The topology recipe's NIC driver (``nic.example.com``) on a kind cluster, run as users run a second DRA driver:
scripts/build-nic-driver-image's image loaded with ``kind load image-archive``, e2e/nic-driver.yaml applied (its
namespace, RBAC and DaemonSet) with docs/recipes/topology.md's DeviceClass, all removed after the block.

A kind node has no NICs under the simulated GPUs' PCIe roots, so the DaemonSet's init container writes the stand-in
sysfs the local node's NIC driver reads (tests/support/nic_driver.py: the same tree, from the same NICs), and the
driver reads it instead of /sys: the NICs' ``resource.kubernetes.io/pcieRoot`` values are the sim GPUs'."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import yaml
from polling import wait_for_commands
from support.nic_driver import NIC_DRIVER, NICS, StandInNic, binary, device_class, write_sysfs

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "e2e/nic-driver.yaml"
BUILD_SCRIPT = ROOT / "scripts/build-nic-driver-image"
NAMESPACE = "nic-driver"
SYSFS_MOUNT = "/stand-in-sys"
REGISTERED = "kubelet registered the plugin"  # what the driver logs once the kubelet took it (tools/nic-driver)


def sysfs_script(nics: tuple[StandInNic, ...] = NICS, *, mount: str = SYSFS_MOUNT) -> str:
    """A shell script (busybox's applets) that writes :func:`write_sysfs`'s tree for ``nics`` under ``mount``: the
    tree is made here and replayed there, so the kind node's NICs are the local node's."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = write_sysfs(Path(scratch), nics)
        lines = [f"cd {shlex.quote(mount)}"]
        for directory, subdirs, files in sorted(os.walk(tree)):
            here = Path(directory)
            relative = here.relative_to(tree)
            real_subdirs = [name for name in subdirs if not (here / name).is_symlink()]
            if files or not real_subdirs:  # a subdirectory's own mkdir -p makes this one otherwise
                lines.append(f"busybox mkdir -p {shlex.quote(str(relative))}")
            for name in sorted(files + subdirs):
                path, target = here / name, shlex.quote(str(relative / name))
                if path.is_symlink():
                    lines.append(f"busybox ln -s {shlex.quote(os.readlink(path))} {target}")
                elif path.is_file():
                    lines.append(f"printf %s {shlex.quote(path.read_text())} > {target}")
    return "\n".join(lines) + "\n"


def image() -> tuple[Path, str]:
    """scripts/build-nic-driver-image's archive (built now where missing: seconds, from the built binary) and the
    image's name."""
    binary()  # a missing binary stops the test as support.nic_driver says (a skip, or a failure where demanded)
    built = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, f"{BUILD_SCRIPT} failed ({built.returncode}):\n{built.stderr}"
    archive = Path(built.stdout.strip())
    return archive, (archive.parent / "image").read_text().strip()


def manifest(image_name: str) -> list[dict[str, Any]]:
    """e2e/nic-driver.yaml with the image and the stand-in sysfs script filled in."""
    documents = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    [daemonset] = [doc for doc in documents if doc["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = image_name
    pod["initContainers"][0]["command"][-1] = sysfs_script()
    return documents


def as_list(documents: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})


class Kubectl(Protocol):
    """kubectl bound to the kind cluster (kindutil.Cluster.kubectl)."""

    def __call__(self, *args: str, timeout: float = 300, input: str | None = None) -> str: ...


class KindNicDriver:
    """The NIC driver's DaemonSet on a kind cluster: :meth:`start` returns once every pod's kubelet registered it
    and its slices list every NIC of the node; :meth:`stop` removes it, its slices and its DeviceClass."""

    def __init__(self, *, kubectl: Kubectl, load_image_archive: Callable[[Path], None]) -> None:
        self.kubectl = kubectl
        self.load_image_archive = load_image_archive
        self.archive, self.image = image()

    def start(self) -> None:
        self.load_image_archive(self.archive)
        self.kubectl("apply", "-f", "-", input=as_list([device_class(), *manifest(self.image)]))
        self.kubectl("-n", NAMESPACE, "rollout", "status", "daemonset/nic-driver", "--timeout=300s", timeout=320)
        wait_for_commands("the kubelet to register the NIC driver on every node", self.registered_everywhere, 120)
        wait_for_commands("the NIC driver's slices to list every NIC", self.published_everywhere, 120)

    def pods(self) -> list[dict[str, Any]]:
        listed = self.kubectl("-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=nic-driver",
                                      "-o", "json")  # fmt: skip
        return list(json.loads(listed)["items"])

    def registered_everywhere(self) -> bool:
        pods = self.pods()
        logs = [self.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"]) for pod in pods]
        return bool(pods) and all(REGISTERED in log for log in logs)

    def published_everywhere(self) -> bool:
        """Every node with a driver pod has a slice of :data:`NICS`'s devices."""
        listed = self.kubectl("get", "resourceslices", "--field-selector", f"spec.driver={NIC_DRIVER}",
                                      "-o", "json")  # fmt: skip
        per_node: dict[str, int] = {}
        for item in json.loads(listed)["items"]:
            node = item["spec"]["nodeName"]
            per_node[node] = per_node.get(node, 0) + len(item["spec"].get("devices", []))
        nodes = {pod["spec"]["nodeName"] for pod in self.pods()}
        return bool(nodes) and all(per_node.get(node) == len(NICS) for node in nodes)

    def stop(self) -> None:
        """The DaemonSet and its RBAC gone, then its slices (the kubelet would drop them only after a grace period:
        no later claim may be allocated a NIC nobody prepares), then its DeviceClass."""
        try:
            self.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=180s", "-f", "-",
                            input=as_list(manifest(self.image)), timeout=200)  # fmt: skip
            self.kubectl("delete", "resourceslices", "--field-selector", f"spec.driver={NIC_DRIVER}")
        finally:
            self.kubectl("delete", "deviceclass", NIC_DRIVER, "--ignore-not-found")


@contextlib.contextmanager
def running_nic_driver(*, kubectl: Kubectl, load_image_archive: Callable[[Path], None]) -> Iterator[KindNicDriver]:
    """The NIC driver on every node of the cluster ``kubectl`` reaches (its image loaded with
    ``load_image_archive``) and its DeviceClass, for the body of the block."""
    driver = KindNicDriver(kubectl=kubectl, load_image_archive=load_image_archive)
    try:
        driver.start()
        yield driver
    finally:
        driver.stop()
