"""The chart's guard against changing ``compat`` on a release whose ComputeDomains it would orphan
(templates/computedomain/compat-guard.yaml), judged on the real API server: ``helm template --dry-run=server`` runs
its lookups there, as an upgrade does, and installs nothing. The release's controller Deployment (what the guard reads
the release's compat from) and a ComputeDomain of our group are made by hand; nothing of the chart is installed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cd_cluster import CRDS
from support.cluster_pods import kubectl
from support.control_plane import ControlPlane
from support.helm import CHART, run_helm

RELEASE = "guardtest"
NAMESPACE = "guard-test"
DOMAIN = "guarded-job"


def _kubectl(plane: ControlPlane, *args: str, stdin: str = "") -> None:
    done = subprocess.run([kubectl(), "--kubeconfig", str(plane.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"


def _controller(compat: str) -> dict[str, object]:
    """The release's controller Deployment as the chart renders it with ``compat`` (the part the guard reads)."""
    env = [{"name": "DRADRIVER_COMPAT", "value": "nvidia"}] if compat == "nvidia" else []
    labels = {"app": "guard"}
    container = {"name": "controller", "image": "localhost/dradriver", "env": env}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{RELEASE}-dradriver-compute-domain-controller", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


@pytest.fixture
def served_domain(control_plane: ControlPlane, tmp_path: Path) -> Iterator[None]:
    """A release that ran with compat none (its controller Deployment) and one ComputeDomain of our group."""
    _kubectl(control_plane, "apply", "--server-side", "-f", str(CRDS))
    _kubectl(control_plane, "wait", "--for=condition=Established", "crd/computedomains.resource.dradriver.dev")
    domain = {
        "apiVersion": "resource.dradriver.dev/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": DOMAIN, "namespace": NAMESPACE},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{DOMAIN}-ch"}}},
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _kubectl(control_plane, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(namespace))
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump_all([_controller("none"), domain]))
    _kubectl(control_plane, "apply", "--server-side", "-f", str(objects))
    yield
    # The namespace stays (empty): the next test's would otherwise wait on its termination.
    _kubectl(control_plane, "delete", "--ignore-not-found", "-f", str(objects))


def _upgrade_render(control_plane: ControlPlane, compat: str) -> subprocess.CompletedProcess[str]:
    return run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--is-upgrade", "--dry-run=server",
        "--kubeconfig", str(control_plane.kubeconfig),
        "--set", "computeDomains.enabled=true", "--set", f"compat={compat}",
    )  # fmt: skip


def test_changing_compat_with_computedomains_of_the_served_group_is_refused_naming_them(
    served_domain: None, control_plane: ControlPlane
) -> None:
    refused = _upgrade_render(control_plane, "nvidia")
    assert refused.returncode != 0
    assert "compat=nvidia would orphan" in refused.stderr
    assert f"{NAMESPACE}/{DOMAIN}" in refused.stderr
    assert "which this release served with compat=none" in refused.stderr
    assert "kubectl delete computedomains.resource.dradriver.dev --all -A" in refused.stderr


def test_an_upgrade_that_keeps_compat_is_not_refused(served_domain: None, control_plane: ControlPlane) -> None:
    kept = _upgrade_render(control_plane, "none")
    assert kept.returncode == 0, kept.stderr
