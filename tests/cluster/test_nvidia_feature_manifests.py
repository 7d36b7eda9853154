"""NVIDIA's own example manifests for passthrough and IMEX (tests/fixtures/nvidia-passthrough and nvidia-imex, as
NVIDIA ships them) on the real control plane, with a node running `dradriver run --compat nvidia --passthrough true`
and the DeviceClasses the chart installs with compat=nvidia and passthrough.enabled.

- The passthrough manifests: `dradriver explain --pod` finds the pod fitting, the real scheduler allocates its claim
  a passthrough device of class vfio.gpu.nvidia.com, and the plugin prepares it through the kubelet's gRPC calls
  (the GPU moved to vfio-pci) and unprepares it. Their pods are applied as written but for a scheduling gate, so
  explain is asked before the scheduler decides (pods never start in this tier: their images do not matter).
- The IMEX channel-injection manifests apply as written once the chart's ComputeDomain parts are rendered with
  compat=nvidia (NVIDIA's CRDs, RBAC of resource.nvidia.com, NVIDIA's DeviceClasses; a release of their own here),
  and `dradriver cd-controller --compat nvidia`, on that release's account, serves them in NVIDIA's names: finalizer,
  claim templates, DaemonSet, status, and a deletion that leaves nothing. imex-test1.yaml's channel claims name a
  DeviceClass no chart installs, which the scheduler and `dradriver explain --pod` both name.
The NVIDIA Fabric Manager example runs on the real kubelet in tests/node/test_partitions.py, the passthrough ones
there too in tests/node/test_passthrough.py, the IMEX channel-injection ones in
tests/node/test_nvidia_imex_examples.py."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cd_cluster import ControllerRun, account_token, install_nvidia_chart_parts, refusals
from support.cluster_node import SimNode, remove_nodes
from support.cluster_pods import GATE, NAMESPACE, TIMEOUT, allocated_devices, kubectl
from support.control_plane import ControlPlane, write_kubeconfig
from support.kube_rest import ApiError, Kube

from dradriver.cli.explain import EXIT_DOES_NOT_FIT, EXIT_FITS
from dradriver.cli.main import main
from dradriver.computedomain import api as cd_api
from dradriver.driver.prepare.presets import NVIDIA
from dradriver.plugin.kubeletplugin.kubelet_client import Claim

REPO = Path(__file__).resolve().parents[2]
VFIO = REPO / "tests/fixtures/nvidia-passthrough"
IMEX = REPO / "tests/fixtures/nvidia-imex"
VFIO_CLASSES = REPO / "src/dradriver/cli/data/deviceclasses/passthrough-nvidia.yaml"
NODE = "nv-vfio"
FM_NODE = "nv-fm"
FM = REPO / "tests/fixtures/nvidia-fabric-manager/fm-partition.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def nvidia_classes(kube: Kube) -> Iterator[None]:
    # NVIDIA's classes as in tests/cluster/test_nvidia_compat.py (less the extended resource name the session's
    # class already maps), and vfio.gpu.nvidia.com as the chart installs it with passthrough.enabled.
    created: list[str] = []
    try:
        for device_class in [*NVIDIA.device_classes(), *documents(VFIO_CLASSES)]:
            device_class["spec"].pop("extendedResourceName", None)
            if kube.find("deviceclasses", device_class["metadata"]["name"]) is None:
                created.append(kube.create("deviceclasses", device_class)["metadata"]["name"])
        yield
    finally:
        for name in created:
            kube.delete("deviceclasses", name)


@contextlib.contextmanager
def compat_node(plane: ControlPlane, name: str, profile: str, *flags: str) -> Iterator[SimNode]:
    """A node of its own running `dradriver run --compat nvidia --passthrough true FLAGS` on ``profile``."""
    node = SimNode.start(
        plane.kube,
        plane.kubeconfig,
        plane.root / name,
        name,
        profile=profile,
        mig_mode="none",
        extra=("--compat", "nvidia", "--passthrough", "true", *flags),
    )
    try:
        yield node
    finally:
        remove_nodes([node], plane.kube, plane.logs)


@pytest.fixture(scope="module")
def vfio_node(control_plane: ControlPlane, nvidia_classes: None) -> Iterator[SimNode]:
    with compat_node(control_plane, NODE, "mixed") as node:
        yield node


@pytest.fixture(scope="module")
def fm_node(control_plane: ControlPlane, nvidia_classes: None) -> Iterator[SimNode]:
    with compat_node(control_plane, FM_NODE, "hgx-h100-80gb", "--fabric-manager-partitions", "true") as node:
        yield node


def run_kubectl(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def explain_pod(plane: ControlPlane, namespace: str, name: str) -> tuple[int, Any]:
    """`dradriver explain --pod NAMESPACE/NAME -o json` against the cluster: its exit status and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", "--pod", f"{namespace}/{name}", "--kubeconfig", str(plane.kubeconfig), "-o", "json"])
    return code, json.loads(out.getvalue())


def scheduled(kube: Kube, namespace: str, name: str) -> bool:
    """Lift the pod's gate and wait for the scheduler: True once bound, False once reported unschedulable."""
    kube.patch("pods", name, {"spec": {"schedulingGates": None}}, namespace)

    def outcome() -> str | None:
        pod = kube.get("pods", name, namespace)
        if pod["spec"].get("nodeName"):
            return "bound"
        conditions = pod.get("status", {}).get("conditions") or []
        # SchedulingGated, the reason while the gate held it, may linger a moment after the gate is lifted.
        done = ("Unschedulable", "SchedulerError")
        return next((c["reason"] for c in conditions if c["type"] == "PodScheduled" and c.get("reason") in done), None)

    return kube.wait(f"the scheduler to decide on pod {namespace}/{name}", outcome, TIMEOUT) == "bound"


def end_pod(kube: Kube, namespace: str, name: str) -> None:
    """End the pod as a kubelet would (phase Succeeded) and delete it at once: no kubelet runs here."""
    kube.patch("pods", name, {"status": {"phase": "Succeeded"}}, namespace, sub="status")
    kube.delete("pods", name, namespace, gracePeriodSeconds="0")


def remove_namespace(kube: Kube, namespace: str) -> None:
    """Delete the namespace and wait until it is gone (the namespace controller deletes what it holds)."""
    for pod in kube.list("pods", namespace):
        end_pod(kube, namespace, pod["metadata"]["name"])
    kube.delete("namespaces", namespace)
    kube.wait(f"namespace {namespace} to be gone", lambda: kube.find("namespaces", namespace) is None, TIMEOUT)


def held(pod: dict[str, Any]) -> dict[str, Any]:
    """The manifest's pod as written, behind the scheduling gate every pod of this tier waits at."""
    return {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": GATE}]}}


def explained_and_allocated(kube: Kube, plane: ControlPlane, pod: dict[str, Any]) -> tuple[dict[str, Any], Claim]:
    """Create ``pod`` held at the gate; explain finds it fitting; the scheduler binds it. The bound pod and its one
    claim, as the kubelet names it."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    kube.create("pods", held(pod), namespace)

    def generated() -> str | None:  # the claim controller makes the claim of a held pod too; explain reads it
        statuses = kube.get("pods", name, namespace).get("status", {}).get("resourceClaimStatuses") or []
        return next((s.get("resourceClaimName") for s in statuses), None)

    claim_name = kube.wait(f"the claim of pod {namespace}/{name}", generated, TIMEOUT)
    code, explained = explain_pod(plane, namespace, name)
    assert code == EXIT_FITS, explained
    assert scheduled(kube, namespace, name)
    bound = kube.get("pods", name, namespace)
    claim = kube.get("resourceclaims", claim_name, namespace)
    return bound, Claim(namespace, claim["metadata"]["name"], claim["metadata"]["uid"])


def devices_of(kube: Kube, claim: Claim) -> list[tuple[str, str, str]]:
    return allocated_devices(kube.get("resourceclaims", claim.name, claim.namespace))


def assert_prepared_on_vfio(node: SimNode, kube: Kube, plane: ControlPlane, pod: dict[str, Any]) -> list[str]:
    """Explain finds the held pod fitting; the scheduler gives its claim a passthrough device of our node; the
    plugin prepares it (its CDI spec gives the GPU's VFIO group node) and unprepares it. The spec's device nodes."""
    bound, claim = explained_and_allocated(kube, plane, pod)
    [(driver, pool, device)] = devices_of(kube, claim)
    assert (driver, pool) == (NVIDIA.driver_name, NODE) and device.endswith("-vfio"), device
    prepared = node.kubelet.prepare(bound)[claim.uid]
    assert prepared.error == "", prepared.error
    spec = json.loads(next(node.cdi_dir.glob("*.json")).read_text())
    paths = [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes") or []]
    assert any(p.startswith("/dev/vfio/") and p != "/dev/vfio/vfio" for p in paths), paths
    assert node.kubelet.unprepare([claim]) == {claim.uid: ""}
    return paths


def test_nvidias_passthrough_manifest_is_explained_allocated_and_prepared(
    vfio_node: SimNode, control_plane: ControlPlane, kube: Kube
) -> None:
    """gpu-test-vfiopci.yaml as written (its pod held at the gate)."""
    docs = {d["kind"]: d for d in documents(VFIO / "gpu-test-vfiopci.yaml")}
    namespace = docs["Namespace"]["metadata"]["name"]
    try:
        kube.create("namespaces", docs["Namespace"])
        kube.create("resourceclaimtemplates", docs["ResourceClaimTemplate"], namespace)
        assert_prepared_on_vfio(vfio_node, kube, control_plane, docs["Pod"])
    finally:
        remove_namespace(kube, namespace)


def test_nvidias_vfio_config_manifest_runs_once_its_pod_is_in_the_namespace_it_makes(
    vfio_node: SimNode, control_plane: ControlPlane, kube: Kube
) -> None:
    """gpu-test-vfio-config.yaml: its claim template, with a VfioDeviceConfig, as written; its pod, which names a
    namespace the file does not make, in the one it does (as tests/node/test_passthrough.py runs it)."""
    path = VFIO / "gpu-test-vfio-config.yaml"
    docs = {d["kind"]: d for d in documents(path)}
    namespace = docs["Namespace"]["metadata"]["name"]
    try:
        kube.create("namespaces", docs["Namespace"])
        # As written, the API server refuses its pod: it names a namespace (gpu-test-vfiopci) the file never makes.
        applied = run_kubectl(control_plane, "apply", "--dry-run=server", "-f", str(path))
        assert applied.returncode != 0
        assert applied.stderr.count("Error from server") == 1, applied.stderr
        assert 'namespaces "gpu-test-vfiopci" not found' in applied.stderr, applied.stderr
        template = docs["ResourceClaimTemplate"]
        assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] == "VfioDeviceConfig"
        kube.create("resourceclaimtemplates", template, namespace)
        pod = docs["Pod"]
        paths = assert_prepared_on_vfio(
            vfio_node, kube, control_plane, {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}
        )
        assert paths[-1] == "/dev/vfio/vfio"  # its config's iommu.enableAPIDevice: true
    finally:
        remove_namespace(kube, namespace)


def active_partitions(node: SimNode) -> list[int]:
    """The partitions the node's Fabric Manager stand-in holds active (its state beside the simulated node's)."""
    path = node.root / "sim.json.fabric-manager.json"
    return list(json.loads(path.read_text())["active"]) if path.exists() else []


def test_nvidias_partition_example_is_explained_and_activates_one_partition(
    fm_node: SimNode, control_plane: ControlPlane, kube: Kube
) -> None:
    """fm-partition.yaml (NVIDIA's resourceClaimTemplates.yaml and pod.yaml) as written, in the namespace it leaves
    unnamed: two passthrough devices aligned on gpu.nvidia.com/partition2, whose prepare activates exactly one 2-GPU
    Fabric Manager partition and whose unprepare deactivates it."""
    docs = {d["kind"]: d for d in documents(FM)}
    template, pod = docs["ResourceClaimTemplate"], docs["Pod"]
    kube.create("resourceclaimtemplates", template, NAMESPACE)
    try:
        bound, claim = explained_and_allocated(
            kube, control_plane, {**pod, "metadata": {**pod["metadata"], "namespace": NAMESPACE}}
        )
        allocated = devices_of(kube, claim)
        assert len(allocated) == 2 and all(d.endswith("-vfio") for _, _, d in allocated), allocated
        assert {(driver, pool) for driver, pool, _ in allocated} == {(NVIDIA.driver_name, FM_NODE)}
        assert fm_node.kubelet.prepare(bound)[claim.uid].error == ""
        [partition] = active_partitions(fm_node)
        assert partition in (3, 4, 5, 6)  # hgx-h100-80gb's 2-GPU partitions (docs/partitions.md)
        assert fm_node.kubelet.unprepare([claim]) == {claim.uid: ""}
        assert active_partitions(fm_node) == []
    finally:
        if kube.find("pods", pod["metadata"]["name"], NAMESPACE) is not None:
            end_pod(kube, NAMESPACE, pod["metadata"]["name"])
        kube.delete("resourceclaimtemplates", template["metadata"]["name"], NAMESPACE)


# Passthrough devices each node publishes when none is in use: mixed has 6 GPUs, hgx-h100-80gb 8.
VFIO_DEVICES = {NODE: 6, FM_NODE: 8}


def published_vfio_devices(kube: Kube, node: str) -> int:
    found = kube.list("resourceslices", fieldSelector=f"spec.nodeName={node}")
    return sum(1 for s in found for d in s["spec"].get("devices") or [] if d["name"].endswith("-vfio"))


@pytest.mark.parametrize(
    ("manifest", "node"),
    [(VFIO / "gpu-test-vfiopci.yaml", NODE), (VFIO / "gpu-test-vfio-config.yaml", NODE), (FM, FM_NODE)],
    ids=["vfiopci", "vfio-config", "fm-partition"],
)
@pytest.mark.usefixtures("vfio_node", "fm_node")
def test_offline_explain_finds_each_file_fitting_on_the_slices_its_node_publishes(
    manifest: Path, node: str, control_plane: ControlPlane, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dradriver explain FILE` reads the manifest as written; `explain --sim-profile` makes no passthrough devices,
    so it is given what a user dumps with `kubectl get resourceslices -o yaml` and `… deviceclasses …`."""
    kube, want = control_plane.kube, VFIO_DEVICES[node]
    kube.wait(f"{want} passthrough devices published by {node}", lambda: published_vfio_devices(kube, node) == want)
    dumped = {}
    for kind in ("resourceslices", "deviceclasses"):
        dump = run_kubectl(control_plane, "get", kind, "-o", "yaml")
        assert dump.returncode == 0, dump.stderr
        dumped[kind] = tmp_path / f"{kind}.yaml"
        dumped[kind].write_text(dump.stdout)
    args = ["--compat", "nvidia", "--slices", str(dumped["resourceslices"]), "--classes", str(dumped["deviceclasses"])]
    args += ["--node", node]
    code = main(["explain", *args, str(manifest)])
    out, err = capsys.readouterr()
    assert code == EXIT_FITS, out + err
    assert f"fits on node {node}" in out
    assert re.search(r"allocated: gpu-\S+-vfio(, gpu-\S+-vfio)?$", out, re.MULTILINE), out


# compat=nvidia's ComputeDomain parts in a release and namespace of their own, beside the session's chart parts.
NV_RELEASE, NV_NAMESPACE, NV_USERS = "dradriver-nv", "dradriver-nv", "nv-imex-users"


@pytest.fixture(scope="module")
def nvidia_domains(control_plane: ControlPlane) -> Iterator[ControllerRun]:
    """The chart's ComputeDomain parts rendered with compat=nvidia, and `dradriver cd-controller --compat nvidia`
    on the token of that release's controller account (a rule missing from its RBAC shows in its log)."""
    rendered = install_nvidia_chart_parts(control_plane, NV_RELEASE, NV_NAMESPACE)
    kube = control_plane.kube
    token = account_token(kube, NV_NAMESPACE, f"{NV_RELEASE}-compute-domain-controller", expiration_s=3600)
    kubeconfig = write_kubeconfig(
        control_plane.root / f"{NV_RELEASE}-controller.kubeconfig", control_plane.server, control_plane.pki.ca_cert,
        token=token,
    )  # fmt: skip
    kube.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NV_USERS}})
    controller = ControllerRun(
        kubeconfig, control_plane.logs / "cd-controller-nvidia.log", NV_RELEASE,
        extra=("--namespace", NV_NAMESPACE, "--compat", "nvidia",
               "--daemon-service-account", f"{NV_RELEASE}-compute-domain-daemon"),
    )  # fmt: skip
    try:
        yield controller
    finally:
        controller.stop()
        remove_namespace(kube, NV_USERS)
        run_kubectl(control_plane, "delete", "--ignore-not-found", "--wait=false", "-f", str(rendered))
        kube.delete("namespaces", NV_NAMESPACE)


def nvidia_domain(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The ComputeDomain of NVIDIA's group, or None."""
    try:
        found: dict[str, Any] = kube.request(
            "GET", f"/apis/{cd_api.NVIDIA.api_version}/namespaces/{namespace}/computedomains/{name}"
        )
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return found


@pytest.mark.parametrize("name", ["channel-injection", "channel-injection-all"])
def test_nvidias_compute_domain_applies_as_written_and_is_served_in_nvidias_names(
    name: str, nvidia_domains: ControllerRun, control_plane: ControlPlane, kube: Kube
) -> None:
    """The file as written (`kubectl apply -n`): the controller adds NVIDIA's finalizer, makes the channel claim
    template NVIDIA's controller makes (its class, driver, opaque config and labels), from which the pod's claim is
    generated, and a DaemonSet of IMEX daemons for the nodes labelled with NVIDIA's domain label; the domain waits,
    NotReady, for its daemon (no node serves compute-domain.nvidia.com here). Deleting the file leaves nothing."""
    path = IMEX / f"{name}.yaml"
    docs = {d["kind"]: d for d in documents(path)}
    domain_name, pod_name = docs["ComputeDomain"]["metadata"]["name"], docs["Pod"]["metadata"]["name"]
    applied = run_kubectl(control_plane, "apply", "-n", NV_USERS, "-f", str(path))
    assert applied.returncode == 0, applied.stderr
    try:
        domain = kube.wait(
            "NVIDIA's finalizer on the domain",
            lambda: (
                (d := nvidia_domain(kube, NV_USERS, domain_name))
                and cd_api.NVIDIA.finalizer in (d["metadata"].get("finalizers") or [])
                and d
            ),
            TIMEOUT,
        )
        uid = domain["metadata"]["uid"]
        template_name = docs["ComputeDomain"]["spec"]["channel"]["resourceClaimTemplate"]["name"]
        template = kube.wait(
            "the channel claim template", lambda: kube.find("resourceclaimtemplates", template_name, NV_USERS), TIMEOUT
        )
        want = cd_api.workload_claim_template(domain, cd_api.NVIDIA)
        devices, wanted = template["spec"]["spec"]["devices"], want["spec"]["spec"]["devices"]
        assert devices["config"] == wanted["config"]  # NVIDIA's driver and opaque config
        assert devices["requests"][0]["exactly"]["deviceClassName"] == cd_api.NVIDIA.channel_class
        assert template["metadata"]["labels"] == want["metadata"]["labels"]
        daemonset = kube.wait(
            "the domain's DaemonSet",
            lambda: kube.find("daemonsets", cd_api.daemon_object_name(uid), NV_NAMESPACE),
            TIMEOUT,
        )
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {cd_api.NVIDIA.domain_label: uid}
        claim_name = kube.wait(
            "the pod's channel claim",
            lambda: next(
                (s.get("resourceClaimName") for s in kube.get("pods", pod_name, NV_USERS).get("status", {}).get(
                    "resourceClaimStatuses") or []),
                None,
            ),
            TIMEOUT,
        )  # fmt: skip
        claim = kube.get("resourceclaims", claim_name, NV_USERS)
        assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == cd_api.NVIDIA.channel_class
        status = kube.wait(
            "the domain's status", lambda: (nvidia_domain(kube, NV_USERS, domain_name) or {}).get("status"), TIMEOUT
        )
        assert status["status"] == "NotReady"
    finally:
        end_pod(kube, NV_USERS, pod_name)
        deleted = run_kubectl(
            control_plane, "delete", "-n", NV_USERS, "--ignore-not-found", "--wait=false", "-f", str(path)
        )
        assert deleted.returncode == 0, deleted.stderr
    kube.wait("the domain to be gone", lambda: nvidia_domain(kube, NV_USERS, domain_name) is None, TIMEOUT)
    kube.wait(
        "its DaemonSet and templates to be gone",
        lambda: (
            not kube.list("daemonsets", NV_NAMESPACE, labelSelector=cd_api.NVIDIA.domain_label)
            and not kube.list("resourceclaimtemplates", NV_USERS)
        ),
        TIMEOUT,
    )
    assert refusals(nvidia_domains.log.read_text()) == []


def test_objects_nvidias_controller_finalized_go_with_their_domain(
    nvidia_domains: ControllerRun, control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    """A domain's claim templates and DaemonSet as NVIDIA's controller leaves them, with its finalizer (which it
    takes off itself before deleting them): the controller takes the finalizer off too, on its account's RBAC, so
    deleting the domain leaves nothing Terminating."""
    [domain] = [d for d in documents(IMEX / "channel-injection.yaml") if d["kind"] == "ComputeDomain"]
    domain["metadata"]["name"] = "left-by-nvidia"
    domain["spec"]["channel"]["resourceClaimTemplate"]["name"] = "left-by-nvidia-ch"
    manifest = tmp_path / "domain.yaml"
    manifest.write_text(yaml.safe_dump(domain))
    applied = run_kubectl(control_plane, "apply", "-n", NV_USERS, "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    try:
        served = kube.wait("the domain", lambda: nvidia_domain(kube, NV_USERS, "left-by-nvidia"), TIMEOUT)
        daemon_name = cd_api.daemon_object_name(served["metadata"]["uid"])
        made = [
            ("resourceclaimtemplates", "left-by-nvidia-ch", NV_USERS),
            ("resourceclaimtemplates", daemon_name, NV_NAMESPACE),
            ("daemonsets", daemon_name, NV_NAMESPACE),
        ]
        for plural, name, namespace in made:
            found = kube.wait(f"{plural} {name}", lambda p=plural, n=name, ns=namespace: kube.find(p, n, ns), TIMEOUT)
            # A PUT of compact JSON, as NVIDIA's Go controller writes them: the API server keeps an opaque config's
            # bytes as written, and refuses a patch of a template or a write back in other bytes.
            found["metadata"]["finalizers"] = [cd_api.NVIDIA.finalizer]
            kube.request("PUT", kube.path(plural, name, namespace), json.dumps(found, separators=(",", ":")).encode())
    finally:
        deleted = run_kubectl(control_plane, "delete", "-n", NV_USERS, "--wait=false", "-f", str(manifest))
        assert deleted.returncode == 0, deleted.stderr
    kube.wait("the domain to be gone", lambda: nvidia_domain(kube, NV_USERS, "left-by-nvidia") is None, TIMEOUT)
    kube.wait(
        "its DaemonSet and templates to be gone",
        lambda: not any(kube.find(plural, name, namespace) for plural, name, namespace in made),
        TIMEOUT,
    )
    assert refusals(nvidia_domains.log.read_text()) == []


def test_nvbandwidths_compute_domain_is_taken_and_only_its_mpi_job_refused(
    nvidia_domains: ControllerRun, control_plane: ControlPlane
) -> None:
    """nvbandwidth-test-job.yaml: its ComputeDomain is of a group served now; its MPIJob needs Kubeflow's MPI
    operator, which this cluster lacks."""
    applied = run_kubectl(
        control_plane, "apply", "-n", NV_USERS, "--dry-run=server", "-f", str(IMEX / "nvbandwidth-test-job.yaml")
    )
    assert applied.returncode != 0
    assert 'no matches for kind "MPIJob" in version "kubeflow.org/v2beta1"' in applied.stderr
    assert "ComputeDomain" not in applied.stderr, applied.stderr
    assert "computedomain.resource.nvidia.com/nvbandwidth-test-compute-domain created (server dry run)" in (
        applied.stdout
    ), applied.stdout


def test_imex_test1s_pods_stay_pending_on_a_device_class_no_chart_installs(
    vfio_node: SimNode, control_plane: ControlPlane, kube: Kube
) -> None:
    path = IMEX / "imex-test1.yaml"
    try:
        applied = run_kubectl(control_plane, "apply", "-f", str(path))
        assert applied.returncode == 0, applied.stderr  # the API server takes every object of it

        def pending_pod() -> str | None:
            for pod in kube.list("pods", "imex-test1"):
                conditions = pod.get("status", {}).get("conditions") or []
                if any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions):
                    return str(pod["metadata"]["name"])
            return None

        name = kube.wait("a pod of imex-test1 reported unschedulable", pending_pod, TIMEOUT)
        code, explained = explain_pod(control_plane, "imex-test1", name)
        assert code == EXIT_DOES_NOT_FIT, explained
        outcomes = {c["podClaim"]: c for c in explained["claims"]}
        assert outcomes["gpus"]["fits"], outcomes["gpus"]  # its GPU claim, of NVIDIA's class gpu.nvidia.com, fits
        assert outcomes["imex-channel"]["error"].endswith(
            "request channel: device class imex.nvidia.com not found; create it or fix deviceClassName"
        )
        # The scheduler says the same in the pod's condition.
        [condition] = [
            c for c in kube.get("pods", name, "imex-test1")["status"]["conditions"] if c["type"] == "PodScheduled"
        ]
        assert "imex.nvidia.com" in condition["message"], condition
    finally:
        run_kubectl(control_plane, "delete", "--wait=false", "-f", str(path))
        kube.wait("namespace imex-test1 to be gone", lambda: kube.find("namespaces", "imex-test1") is None, TIMEOUT)
