"""``dradriver explain --pod`` end to end: the real ``kubernetes`` client against the API server stand-in."""

from __future__ import annotations

import copy
import functools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.apiserver import FakeApiServer

from dradriver.cli.explain_cluster import KubernetesReader
from dradriver.cli.explain_node import NodeSettings
from dradriver.cli.main import main
from dradriver.plugin.cluster import ClusterError

ROOT = Path(__file__).resolve().parents[2]
GPU_CLASS = "gpu.dradriver.dev"
NS = "ml"


@functools.cache
def _sim_slices(profile: str) -> tuple[dict[str, Any], ...]:
    # Building a simulated node takes ~0.5 s; every test reuses (copies of) the same slices.
    return tuple(NodeSettings(mig_mode="none").slices(profile, "gpu.dradriver.dev"))


def node_slices(profile: str, node: str) -> list[dict[str, Any]]:
    """The driver's own ResourceSlices of a simulated ``profile`` node, renamed to ``node``."""
    renamed = []
    for index, original in enumerate(_sim_slices(profile)):
        slice_ = copy.deepcopy(original)
        slice_["metadata"] = {"name": f"{node}-{GPU_CLASS}-{index}"}
        slice_["spec"]["nodeName"] = node
        slice_["spec"]["pool"]["name"] = node
        renamed.append(slice_)
    return renamed


def claim_spec(count: int = 1, selector: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


class Cluster:
    """The stand-in with our DeviceClasses, plus helpers to add nodes, claims and pods and run explain."""

    def __init__(self, server: FakeApiServer, kubeconfig: Path) -> None:
        self.server = server
        self.kubeconfig = kubeconfig
        for path in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    server.create("deviceclasses", doc)

    def add_node(self, name: str, profile: str = "dgx-a100-80gb") -> list[dict[str, Any]]:
        return [self.server.create("resourceslices", s) for s in node_slices(profile, name)]

    def add_claim(
        self, name: str, spec: dict[str, Any], *, namespace: str = NS, allocation: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        obj: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
        if allocation:
            obj["status"] = {"allocation": allocation}
        return self.server.create("resourceclaims", obj, namespace=namespace)

    def add_template(self, name: str, spec: dict[str, Any]) -> None:
        self.server.create("resourceclaimtemplates", {"metadata": {"name": name}, "spec": {"spec": spec}}, namespace=NS)

    def add_pod(self, name: str, *claims: dict[str, str], statuses: list[dict[str, str]] | None = None) -> None:
        pod: dict[str, Any] = {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "trainer:1"}], "resourceClaims": list(claims)},
            "status": {"phase": "Pending"},
        }
        if statuses:
            pod["status"]["resourceClaimStatuses"] = statuses
        self.server.create("pods", pod, namespace=NS)

    def explain(self, pod: str, *extra: str) -> int:
        return main(["explain", "--pod", pod, "--kubeconfig", str(self.kubeconfig), *extra])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeApiServer() as server:
        yield Cluster(server, server.write_kubeconfig(tmp_path / "kubeconfig"))


def allocation_of(node: str, devices: list[str]) -> dict[str, Any]:
    return {
        "devices": {
            "results": [{"request": "gpus", "driver": GPU_CLASS, "pool": node, "device": device} for device in devices]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
    }


def gpu_names(slices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"]["devices"]]


# -- (1) the pod's claim fits ------------------------------------------------------------------------


def test_claim_generated_from_a_template_fits_and_names_the_node(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    cluster.add_template("two-gpus", claim_spec(2))
    cluster.add_claim("trainer-gpus-x7k2p", claim_spec(2))
    cluster.add_pod(
        "trainer",
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
        statuses=[{"name": "gpus", "resourceClaimName": "trainer-gpus-x7k2p"}],
    )
    mark = cluster.server.mark()
    assert cluster.explain("ml/trainer") == 0
    out = capsys.readouterr().out
    assert "ResourceClaim ml/trainer-gpus-x7k2p (pod ml/trainer claim gpus): fits on node node-a" in out
    assert "allocated: gpu-0000-07-00-0, gpu-0000-0f-00-0" in out
    requests = cluster.server.requests_since(mark)
    assert requests and all(r.method == "GET" and r.authorized for r in requests)


def test_claim_not_yet_generated_is_explained_from_its_template_but_not_called_a_fit(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    cluster.add_template("two-gpus", claim_spec(2))
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimTemplateName": "two-gpus"})
    assert cluster.explain("ml/trainer") == 1  # no claim for the scheduler to place yet
    out = capsys.readouterr().out
    assert "claim gpus: no ResourceClaim generated yet from ResourceClaimTemplate ml/two-gpus" in out
    assert "  ResourceClaimTemplate ml/two-gpus (pod ml/trainer claim gpus): fits on node node-a" in out


def test_standalone_claim_fits_and_json_names_the_node(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_node("node-a")
    cluster.add_claim("shared-gpu", claim_spec(1))
    cluster.add_pod("trainer", {"name": "gpu", "resourceClaimName": "shared-gpu"})
    assert cluster.explain("ml/trainer", "-o", "json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["errors"] == []
    (claim,) = data["claims"]
    assert (claim["podClaim"], claim["name"], claim["fits"], claim["node"]) == ("gpu", "ml/shared-gpu", True, "node-a")


def test_already_allocated_claim_is_reported_with_its_node(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    cluster.add_claim("ready", claim_spec(1), allocation=allocation_of("node-a", ["gpu-0000-07-00-0"]))
    cluster.add_pod("trainer", {"name": "gpu", "resourceClaimName": "ready"})
    assert cluster.explain("ml/trainer") == 0
    assert "claim gpu: ResourceClaim ml/ready is already allocated on node node-a" in capsys.readouterr().out


# -- (2) the pod's claim cannot fit ------------------------------------------------------------------


def test_selector_matching_no_device_does_not_fit_and_says_why(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    selector = 'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA H100 80GB HBM3"'
    cluster.add_claim("h100", claim_spec(1, selector))
    cluster.add_pod("trainer", {"name": "gpu", "resourceClaimName": "h100"})
    assert cluster.explain("ml/trainer") == 1
    out = capsys.readouterr().out
    assert "ResourceClaim ml/h100 (pod ml/trainer claim gpu): does NOT fit on node node-a" in out
    assert "why: no device passes request gpus selector #0" in out
    assert 'gpu.dradriver.dev/productName is "NVIDIA A100-SXM4-80GB" (8)' in out


def test_devices_allocated_to_a_claim_in_another_namespace_are_not_available(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = gpu_names(cluster.add_node("node-a"))
    cluster.add_claim("busy", claim_spec(7), namespace="other-team", allocation=allocation_of("node-a", gpus[:7]))
    cluster.add_claim("two", claim_spec(2))
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimName": "two"})
    assert cluster.explain("ml/trainer") == 1
    out = capsys.readouterr().out
    assert "ResourceClaim ml/two (pod ml/trainer claim gpus): does NOT fit on node node-a" in out
    assert "       1 not allocated to other claims" in out
    assert "allocated to other claims" in out.split("why:", 1)[1]


def test_claim_naming_a_missing_device_class_is_the_schedulers_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    spec = claim_spec(1)
    spec["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nvidia.com"
    cluster.add_claim("typo", spec)
    cluster.add_pod("trainer", {"name": "gpu", "resourceClaimName": "typo"})
    assert cluster.explain("ml/trainer") == 1
    out = capsys.readouterr().out
    assert "ResourceClaim ml/typo (pod ml/trainer claim gpu): ERROR" in out
    assert "device class nvidia.com not found" in out


# -- (3) objects that do not exist -------------------------------------------------------------------


def test_missing_pod_is_one_line_naming_it(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster.explain("ml/ghost") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "dradriver explain: error: pod ml/ghost does not exist (check the namespace and name)"
    ]


def test_missing_claim_is_one_line_naming_it(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_node("node-a")
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimName": "nope"})
    assert cluster.explain("ml/trainer") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("error: pod ml/trainer claim gpus: ResourceClaim ml/nope does not exist")
    assert "spec.resourceClaims[0].resourceClaimName" in line


def test_missing_template_is_an_error_but_the_other_claims_are_still_explained(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a")
    cluster.add_claim("one", claim_spec(1))
    cluster.add_pod(
        "trainer",
        {"name": "gpu", "resourceClaimName": "one"},
        {"name": "more", "resourceClaimTemplateName": "gone"},
    )
    assert cluster.explain("ml/trainer") == 2
    captured = capsys.readouterr()
    assert "ResourceClaim ml/one (pod ml/trainer claim gpu): fits on node node-a" in captured.out
    (line,) = captured.err.splitlines()
    assert "claim more: ResourceClaimTemplate ml/gone does not exist" in line


# -- (4) several nodes -------------------------------------------------------------------------------


def test_claim_that_fits_on_one_of_two_nodes_is_explained_per_node(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.add_node("node-a", "mixed")  # A100 40GB and L4
    cluster.add_node("node-b", "dgx-a100-80gb")
    selector = 'device.capacity["gpu.dradriver.dev"].memory.compareTo(quantity("80Gi")) >= 0'
    cluster.add_claim("big", claim_spec(2, selector))
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimName": "big"})
    assert cluster.explain("ml/trainer") == 0
    out = capsys.readouterr().out
    assert "ResourceClaim ml/big (pod ml/trainer claim gpus): fits on node node-b" in out
    other = out.split("  other nodes:\n", 1)[1].splitlines()
    assert other[0].startswith("    node-a: does not fit: request gpus: no device passes request gpus selector #0")

    assert cluster.explain("ml/trainer", "-o", "json") == 0
    (claim,) = json.loads(capsys.readouterr().out)["claims"]
    assert claim["node"] == "node-b"
    assert list(claim["otherNodes"]) == ["node-a"]


def test_claim_that_fits_nowhere_reports_every_node(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_node("node-a", "mixed")
    cluster.add_node("node-b", "dgx-a100-80gb")
    cluster.add_claim("nine", claim_spec(9))
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimName": "nine"})
    assert cluster.explain("ml/trainer", "-o", "json") == 1
    (claim,) = json.loads(capsys.readouterr().out)["claims"]
    assert not claim["fits"]
    assert {claim["node"], *claim["otherNodes"]} == {"node-a", "node-b"}


# -- the reader ---------------------------------------------------------------------------------------


def test_reader_follows_list_pages_across_namespaces(cluster: Cluster) -> None:
    cluster.add_node("node-a")
    cluster.add_node("node-b")
    for namespace in ("a", "b", "c"):
        cluster.add_claim("claim", claim_spec(1), namespace=namespace)
    reader = KubernetesReader(str(cluster.kubeconfig), None, page_size=2)
    mark = cluster.server.mark()
    try:
        claims = reader.list_claims()
        slices = reader.list_resource_slices()
    finally:
        reader.close()
    assert sorted(c["metadata"]["namespace"] for c in claims) == ["a", "b", "c"]
    assert {c["kind"] for c in claims} == {"ResourceClaim"}
    assert sorted(s["spec"]["nodeName"] for s in slices) == ["node-a", "node-b"]
    assert [r.query.get("continue") for r in cluster.server.requests_since(mark)] == [None, "2", None]


def test_forbidden_list_names_the_rbac_explain_needs(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_claim("one", claim_spec(1))
    cluster.add_pod("trainer", {"name": "gpu", "resourceClaimName": "one"})
    cluster.server.fail_next("GET", "/resourceslices", 403, message="resourceslices.resource.k8s.io is forbidden")
    assert cluster.explain("ml/trainer") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "HTTP 403: resourceslices.resource.k8s.io is forbidden" in line
    assert "list on deviceclasses, resourceslices, resourceclaims and devicetaintrules cluster-wide" in line


@pytest.mark.parametrize("status", [401, 403])
def test_events_the_reader_may_not_list_are_a_refusal_naming_the_rbac(cluster: Cluster, status: int) -> None:
    cluster.server.fail_next("GET", "/namespaces/ml/events", status, message="events is forbidden")
    reader = KubernetesReader(str(cluster.kubeconfig), None)
    try:
        with pytest.raises(ClusterError) as refused:
            reader.list_pod_events("ml", "uid-trainer", "FailedResourceClaimCreation")
    finally:
        reader.close()
    assert refused.value.status == status
    assert f"HTTP {status}: events is forbidden" in str(refused.value)
    assert "list on events in the pod's namespace" in str(refused.value)


def test_events_a_server_does_not_serve_are_none(cluster: Cluster) -> None:
    reader = KubernetesReader(str(cluster.kubeconfig), None)
    mark = cluster.server.mark()
    try:
        assert reader.list_pod_events("ml", "uid-trainer", "FailedResourceClaimCreation") == []
    finally:
        reader.close()
    [request] = cluster.server.requests_since(mark)
    assert request.query["fieldSelector"] == "involvedObject.uid=uid-trainer,reason=FailedResourceClaimCreation"


def test_a_pod_whose_events_may_not_be_read_says_so(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.add_node("node-a")
    cluster.add_template("two-gpus", claim_spec(2))
    cluster.add_pod("trainer", {"name": "gpus", "resourceClaimTemplateName": "two-gpus"})
    cluster.server.fail_next("GET", "/namespaces/ml/events", 403, message="events is forbidden")
    assert cluster.explain("ml/trainer") == 1
    out = capsys.readouterr().out
    assert "  why it has not been created is not known: the pod's events could not be read: " in out
    assert "HTTP 403: events is forbidden; dradriver explain --pod needs get on pods" in out


def test_unreachable_api_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # bound but not listening: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "gone",
                    "clusters": [{"name": "gone", "cluster": {"server": url}}],
                    "users": [{"name": "gone", "user": {"token": "t"}}],
                    "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}],
                }
            )
        )
        assert main(["explain", "--pod", "ml/trainer", "--kubeconfig", str(kubeconfig)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"cannot reach the API server at {url} to read Pod ml/trainer" in line
