"""Workloads on the real node (support/real_node.py): manifests pinned to it, applied with kubectl, waited for
through the API server, their containers' output read with ``kubectl logs`` (the API server asks the kubelet)."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.cluster_pods import kubectl
from support.kube_rest import ApiError, Kube
from support.real_node import TAINT_KEY, RealNode, wait_for

POD_TIMEOUT = 120.0
WORKLOAD_KINDS = ("Pod", "Deployment", "Job")


def pod_spec_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") == "Pod":
        spec: dict[str, Any] = doc["spec"]
        return spec
    if doc.get("kind") in ("Deployment", "Job"):
        template: dict[str, Any] = doc["spec"]["template"]["spec"]
        return template
    return None


def pin_to(doc: dict[str, Any], node: str) -> dict[str, Any]:
    """``doc`` with its pods pinned to ``node`` (a node selector and a toleration of its taint) and their
    images never pulled (there is no registry: the node has only the images imported into it)."""
    doc = copy.deepcopy(doc)
    spec = pod_spec_of(doc)
    if spec is None:
        return doc
    spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
    spec.setdefault("tolerations", []).append({"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    spec.setdefault("terminationGracePeriodSeconds", 1)
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        container["imagePullPolicy"] = "Never"
    return doc


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def on_busybox(docs: Iterable[dict[str, Any]], script: str) -> None:
    """Makes each Pod's one container run ``sh -c script`` in busybox, its args dropped: the node has busybox and no
    registry, so of a manifest as fetched only the image and command are replaced."""
    for doc in docs:
        if doc["kind"] == "Pod":
            [container] = doc["spec"]["containers"]
            container["image"], container["command"] = "docker.io/library/busybox:1.36", ["sh", "-c", script]
            container.pop("args", None)


@dataclass
class Workloads:
    """Applies manifests to the node's cluster and deletes them again."""

    node: RealNode

    @property
    def kube(self) -> Kube:
        return self.node.kube

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 180) -> str:
        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(self.node.control_plane.kubeconfig), *args],
            capture_output=True, text=True, timeout=timeout, input=input, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def apply(self, docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        pinned = [pin_to(doc, self.node.name) for doc in docs]
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(pinned))
        return pinned

    def delete(self, docs: Iterable[dict[str, Any]], timeout: float = 120) -> None:
        self.kubectl("delete", "--ignore-not-found", "--wait=true", f"--timeout={int(timeout)}s", "-f", "-",
                     input=yaml.safe_dump_all(list(docs)), timeout=timeout + 20)  # fmt: skip

    def pods_of(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        namespace = doc["metadata"].get("namespace", "default")
        if doc["kind"] == "Pod":
            found = self.kube.find("pods", doc["metadata"]["name"], namespace)
            return [found] if found else []
        labels = ",".join(f"{k}={v}" for k, v in doc["spec"]["selector"]["matchLabels"].items())
        return self.kube.list("pods", namespace, labelSelector=labels)

    def wait_running(self, doc: dict[str, Any], timeout: float = POD_TIMEOUT) -> list[dict[str, Any]]:
        """The workload's pods once each is Running with every container ready (or Succeeded)."""
        spec = pod_spec_of(doc)
        assert spec is not None
        want = doc["spec"].get("replicas", 1) if doc["kind"] == "Deployment" else 1

        def started() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods_of(doc) if not p["metadata"].get("deletionTimestamp")]
            if len(pods) < want or not all(running(p) for p in pods):
                return None
            return pods

        try:
            pods: list[dict[str, Any]] = wait_for(f"{doc['kind']} {doc['metadata']['name']} to run", started, timeout)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe(doc)}\n{self.node.tails(30)}") from None
        return pods

    def describe(self, doc: dict[str, Any]) -> str:
        parts = []
        for pod in self.pods_of(doc):
            events = self.events(pod)
            parts.append(f"pod {pod['metadata']['name']}: status {json.dumps(pod.get('status'))}\nevents: {events}")
        return "\n".join(parts)

    def events(self, pod: dict[str, Any]) -> list[str]:
        namespace = pod["metadata"]["namespace"]
        selector = f"involvedObject.uid={pod['metadata']['uid']}"
        return [f"{e.get('reason')}: {e.get('message')}" for e in
                self.kube.list("events", namespace, fieldSelector=selector)]  # fmt: skip

    def logs(self, pod: dict[str, Any]) -> str:
        """Every container's output (init containers too), each line prefixed by kubectl with its container."""
        return self.kubectl("-n", pod["metadata"]["namespace"], "logs", pod["metadata"]["name"], "--all-containers",
                            "--prefix")  # fmt: skip


def running(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    if status.get("phase") == "Succeeded":
        return True
    statuses = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)


def wait_gone(kube: Kube, plural: str, name: str, namespace: str, timeout: float = POD_TIMEOUT) -> None:
    wait_for(f"{plural}/{name} to be gone", lambda: kube.find(plural, name, namespace) is None, timeout)


def claim_names(pod: dict[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named directly, or generated from its templates."""
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    generated = {s["name"]: s.get("resourceClaimName") for s in statuses}
    names = []
    for entry in pod["spec"].get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        if name:
            names.append(name)
    return names


def claims_of(kube: Kube, pod: dict[str, Any]) -> list[dict[str, Any]]:
    namespace = pod["metadata"]["namespace"]
    return [kube.get("resourceclaims", name, namespace) for name in claim_names(pod)]


def status_devices(kube: Kube, claim: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        fresh = kube.get("resourceclaims", claim["metadata"]["name"], claim["metadata"]["namespace"])
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise
    devices: list[dict[str, Any]] = fresh.get("status", {}).get("devices") or []
    return devices


def cdi_specs_of(node: RealNode, claim_uid: str) -> list[Path]:
    return [p for p in node.cdi_dir.glob("*.json") if claim_uid in p.name]


def unprepared(node: RealNode, claim_uid: str) -> bool:
    """Whether the node's driver finished unpreparing the claim: its CDI spec goes first, its checkpoint record
    last (after, say, its MPS daemon stopped), so only both gone means done."""
    return not cdi_specs_of(node, claim_uid) and claim_uid not in node.prepared_claims()
