"""`helm install`, `helm upgrade` and `helm uninstall` of the chart against the real control plane: every object
the chart renders is created, an upgrade with a changed value reaches the DaemonSet (with its surge-first rolling
update intact) and a rollback or uninstall leaves nothing of the release behind.

The release has its own names (release `helmtest`, driver and DeviceClasses under helmtest.dev), so it lives
beside the kustomize install of test_manifests.py. This control plane runs no DaemonSet controller or kubelet:
no plugin pod runs here (the node tests run one); what is judged is the API objects helm manages.

Each test finds the release installed (the ``release`` fixture installs it when a test before, the uninstall test
say, left none), so each passes alone and in any order; the module's teardown uninstalls what is left."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane
from support.helm import CHART, preset_file, run_helm

RELEASE = "helmtest"
NAMESPACE = "helm-test"
# Names of our own, so this release conflicts with no other install in the shared control plane.
VALUES = (
    "driverName=gpu.helmtest.dev",
    "deviceClasses.gpu.name=gpu.helmtest.dev",
    "deviceClasses.gpu.extendedResourceName=",
    "deviceClasses.mig.name=mig.helmtest.dev",
    "deviceClasses.migProfiles.nameSuffix=helmtest.dev",
    "image.repository=localhost/dradriver",
    "image.pullPolicy=Never",
)


def helm_on(control_plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return run_helm("--kubeconfig", str(control_plane.kubeconfig), *args, timeout=180)


def values() -> list[str]:
    return [a for v in VALUES for a in ("--set", v)]


def manifest(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """The objects of the release's current revision, as helm recorded them."""
    done = helm_on(control_plane, "get", "manifest", RELEASE, "-n", NAMESPACE)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "release.yaml"
    path.write_text(done.stdout)
    return path


def existing(control_plane: ControlPlane, path: Path) -> list[str]:
    """kind/name of each object in ``path`` the API server has."""
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(control_plane.kubeconfig), "get", "-f", str(path), "--ignore-not-found",
         "-o", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def installed(control_plane: ControlPlane) -> bool:
    return helm_on(control_plane, "status", RELEASE, "-n", NAMESPACE).returncode == 0


@pytest.fixture(scope="module")
def uninstalled_after(control_plane: ControlPlane) -> Iterator[None]:
    """Whatever the module's tests left of the release goes at its end."""
    yield
    helm_on(control_plane, "uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found")


@pytest.fixture
def release(control_plane: ControlPlane, uninstalled_after: None) -> None:
    """The release installed (its first revision with the module's values), unless a test before left it so."""
    if installed(control_plane):
        return
    done = helm_on(control_plane, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
                   "-f", preset_file("sim"), *values())  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_install_creates_every_object_the_chart_renders(
    release: None, control_plane: ControlPlane, tmp_path: Path
) -> None:
    path = manifest(control_plane, tmp_path)
    objects = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {o["kind"] for o in objects}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DeviceClass",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds  # fmt: skip
    assert len(existing(control_plane, path)) == len(objects)
    status = helm_on(control_plane, "status", RELEASE, "-n", NAMESPACE)
    assert "STATUS: deployed" in status.stdout, status.stdout + status.stderr


def test_upgrade_with_a_changed_value_rolls_the_daemonset_surge_first(
    release: None, control_plane: ControlPlane, tmp_path: Path
) -> None:
    changed = ("--set", "logging.level=debug", "--set", "deviceClasses.migProfiles.enabled=false")
    done = helm_on(control_plane, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "-f", preset_file("sim"),
                   *values(), *changed)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    got = subprocess.run(
        [kubectl(), "--kubeconfig", str(control_plane.kubeconfig), "-n", NAMESPACE, "get", "daemonset",
         f"{RELEASE}-dradriver-kubelet-plugin", "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    daemonset = yaml.safe_load(got.stdout)
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": "DRADRIVER_LOG_LEVEL", "value": "debug"} in container["env"]
    assert daemonset["metadata"]["generation"] >= 2  # a new pod template: the controller rolls the pods
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # Objects the new values leave out are deleted; the rest stay.
    names = existing(control_plane, manifest(control_plane, tmp_path))
    assert not [n for n in names if "mig-1g" in n]
    gone = subprocess.run(
        [kubectl(), "--kubeconfig", str(control_plane.kubeconfig), "get", "deviceclass",
         "mig-1g.10gb.helmtest.dev", "--ignore-not-found", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert gone.stdout.strip() == ""


def test_uninstall_leaves_nothing_of_the_release(release: None, control_plane: ControlPlane, tmp_path: Path) -> None:
    # Every object any revision created: the first revision's full set (an upgrade may have dropped some).
    done = helm_on(control_plane, "get", "manifest", RELEASE, "-n", NAMESPACE, "--revision", "1")
    assert done.returncode == 0, done.stderr
    first = tmp_path / "revision-1.yaml"
    first.write_text(done.stdout)
    current = manifest(control_plane, tmp_path)
    uninstalled = helm_on(control_plane, "uninstall", RELEASE, "-n", NAMESPACE)
    assert uninstalled.returncode == 0, uninstalled.stdout + uninstalled.stderr
    assert existing(control_plane, first) == [] and existing(control_plane, current) == []
    # Nor helm's own record of the release (its Secrets in the namespace).
    listed = helm_on(control_plane, "list", "-n", NAMESPACE, "-a", "-q")
    assert RELEASE not in listed.stdout.split()
