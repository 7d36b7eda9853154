"""The quota recipe (docs/recipes/quotas.md) against the real API server, scheduler and controller manager: a
ResourceQuota on the devices of our DeviceClasses and on the extended resource ``nvidia.com/gpu`` that
gpu.dradriver.dev maps; claims over it refused at creation with the API server's message; a device-plugin style pod
counted in the same quota; a pod whose claim the resource claim controller could not create, and ``dradriver
explain --pod`` naming the quota. Every command of the page is run as written, in a directory holding the page's
files, and must print what the page shows (generated names aside)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster_node import SimNode
from support.control_plane import ControlPlane
from support.kube_rest import ApiError, Kube
from support.recipe_pages import Console, transcript

PAGE = "quotas.md"
NAMESPACE = "team-a"
QUOTA = "gpus"
TIMEOUT = 120.0


GPU_DEVICES_USED = "{.status.used.gpu\\.dradriver\\.dev\\.deviceclass\\.resource\\.k8s\\.io/devices}"
NVIDIA_GPUS_USED = "{.status.used.requests\\.nvidia\\.com/gpu}"


def generated_names(text: str) -> str:
    """Names the API server or a controller made up (a claim's suffix), and the time of an event, made one."""
    text = re.sub(r"\b(trainer-gpu|cuda-pod-gpu[a-z0-9-]*?)-[a-z0-9]{5}\b", r"\1-xxxxx", text)
    return re.sub(r"(?m)^(  last refused at )\S+", r"\1<time>", text)


def end_pods(kube: Kube) -> None:
    """Delete the namespace's pods at once, as a kubelet would confirm (none runs on the simulated nodes)."""
    for pod in kube.list("pods", NAMESPACE):
        name = pod["metadata"]["name"]
        kube.patch("pods", name, {"status": {"phase": "Succeeded"}}, NAMESPACE, sub="status")
        kube.delete("pods", name, NAMESPACE, gracePeriodSeconds="0")


def trainer_claim_was_created(kube: Kube) -> bool:
    """The page's other outcome of the wait for room: the controller's own retry came between the quota's recount
    and the wait, so the trainer's claim took the room (quota admission let it in: the recount had happened) and the
    wait for 0 used timed out."""
    statuses = kube.get("pods", "trainer", NAMESPACE).get("status", {}).get("resourceClaimStatuses") or []
    return bool(statuses and statuses[0].get("resourceClaimName"))


def quota_has_status(kube: Kube) -> bool:
    path = f"/api/v1/namespaces/{NAMESPACE}/resourcequotas/{QUOTA}"
    try:
        return bool(kube.request("GET", path).get("status", {}).get("hard"))
    except ApiError:
        return False


@pytest.fixture
def team_a(control_plane: ControlPlane, kube: Kube, nodes: dict[str, SimNode], tmp_path: Path) -> Iterator[Path]:
    """Namespace team-a with the page's quota in it (once the quota controller has filled in its status, which
    admission needs); a directory holding the page's files. The namespace is deleted again, and waited for."""
    setup = Console(tmp_path, control_plane.kubeconfig, [])
    setup.write_files(PAGE)
    for command in ("kubectl create namespace team-a", "kubectl apply -f gpu-quota.yaml"):
        code, output = setup.run(command)
        assert code == 0, f"$ {command}\n{output}"
    kube.wait("the quota's status", lambda: quota_has_status(kube), TIMEOUT)
    kube.wait("team-a's default ServiceAccount", lambda: kube.find("serviceaccounts", "default", NAMESPACE), TIMEOUT)
    try:
        yield tmp_path
    finally:
        end_pods(kube)
        kube.delete("namespaces", NAMESPACE)
        kube.wait("namespace team-a to go", lambda: kube.find("namespaces", NAMESPACE) is None, TIMEOUT)


def console(control_plane: ControlPlane, directory: Path, section: str) -> Console:
    return Console(directory, control_plane.kubeconfig, transcript(PAGE, section), normalize=generated_names)


def test_claims_over_the_quota_of_their_class_are_refused_at_creation(
    control_plane: ControlPlane, team_a: Path
) -> None:
    shell = console(control_plane, team_a, "## A claim over the quota is refused at creation")
    shell.next("kubectl apply -f two-gpus.yaml")
    refusal = shell.next("kubectl apply -f one-more-gpu.yaml")
    assert "exceeded quota: gpus" in refusal and shell.last_code != 0
    shell.next("kubectl describe resourcequota gpus -n team-a")
    shell.next("kubectl apply -f four-mig-devices.yaml")
    assert "exceeded quota: gpus" in shell.next("kubectl apply -f one-more-mig-device.yaml")
    shell.next("kubectl apply -f profile-class-mig-device.yaml")  # a class of its own: not in the quota
    shell.check()


def test_a_device_plugin_style_pod_counts_in_the_quota_of_the_class_that_maps_its_resource(
    control_plane: ControlPlane, kube: Kube, team_a: Path
) -> None:
    shell = console(control_plane, team_a, "## Device-plugin style pods count in the same quota")
    shell.next("kubectl apply -f two-gpus.yaml")
    assert "exceeded quota: gpus" in shell.next("kubectl apply -f cuda-pod.yaml")
    shell.next("kubectl delete -f two-gpus.yaml")
    # Admission counts against the quota's status: the resource-quota controller's recount must have freed the room.
    shell.next(f"kubectl wait resourcequota/gpus -n team-a --for=jsonpath='{NVIDIA_GPUS_USED}'=0 --timeout=60s")
    shell.next("kubectl apply -f cuda-pod.yaml")
    kube.wait("the scheduler's claim for cuda-pod", lambda: _extended_resource_claim(kube), TIMEOUT)
    shell.next("kubectl describe resourcequota gpus -n team-a")
    shell.check()


def _extended_resource_claim(kube: Kube) -> str | None:
    status = kube.get("pods", "cuda-pod", NAMESPACE).get("status", {})
    name = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    return str(name) if name else None


def test_explain_names_the_quota_that_keeps_a_pods_claim_from_being_created(
    control_plane: ControlPlane, kube: Kube, team_a: Path
) -> None:
    shell = console(control_plane, team_a, "## A pod stuck because its claim could not be created")
    shell.next("kubectl apply -f two-gpus.yaml")
    shell.next("kubectl apply -f trainer.yaml")
    assert "exceeded quota: gpus" in shell.next(
        "kubectl get events -n team-a --field-selector reason=FailedResourceClaimCreation "
        "-o jsonpath={.items[0].message}"
    )
    explained = shell.next("dradriver explain --pod team-a/trainer")
    assert "ResourceQuota team-a/gpus has no room" in explained
    shell.next("echo $?")
    assert kube.get("pods", "trainer", NAMESPACE)["status"].get("phase") == "Pending"
    # Room in the quota, and a change to the pod so the controller tries again now rather than after its back-off.
    shell.next("kubectl delete -f two-gpus.yaml")
    shell.next(
        f"kubectl wait resourcequota/gpus -n team-a --for=jsonpath='{GPU_DEVICES_USED}'=0 --timeout=60s",
        or_else=lambda output: "timed out" in output and trainer_claim_was_created(kube),
    )
    shell.next("kubectl annotate pod trainer -n team-a quota-freed=true")
    claim = shell.next(
        "kubectl get pod trainer -n team-a -o jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}"
    )
    assert kube.find("resourceclaims", claim, NAMESPACE), claim
    try:
        shell.check()
    except AssertionError as err:
        quota = kube.get("resourcequotas", QUOTA, NAMESPACE).get("status")
        raise AssertionError(f"{err}\nthe quota now: {quota}") from None
