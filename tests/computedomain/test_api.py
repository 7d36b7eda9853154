"""The ComputeDomain API: the CRDs, the DeviceClasses, the generated claim template, and explain on them."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from support.helm import template

from dradriver.cli.main import main
from dradriver.computedomain import api
from dradriver.errors import ClaimError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "computedomains"


def test_the_charts_device_classes_are_the_ones_explain_uses() -> None:
    shipped = [o for o in template("--set", "computeDomains.enabled=true") if o["kind"] == "DeviceClass"]
    assert [(c["metadata"]["name"], c["spec"]) for c in shipped if "compute-domain" in c["metadata"]["name"]] == [
        (c["metadata"]["name"], c["spec"]) for c in api.device_classes()
    ]


def test_the_chart_installs_controller_rbac_and_classes_only_when_enabled() -> None:
    def kinds(*args: str) -> set[tuple[str, str]]:
        return {
            (o["kind"], o["metadata"]["name"]) for o in template(*args) if "compute-domain" in o["metadata"]["name"]
        }

    assert kinds() == set()
    enabled = template("--set", "computeDomains.enabled=true")
    assert kinds("--set", "computeDomains.enabled=true") >= {
        ("Deployment", "dradriver-compute-domain-controller"),
        ("ServiceAccount", "dradriver-compute-domain-daemon"),
        ("ClusterRole", "dradriver-compute-domain-plugin"),
        ("DeviceClass", "compute-domain-daemon.dradriver.dev"),
    }
    plugin = next(o for o in enabled if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "DRADRIVER_COMPUTE_DOMAINS", "value": "true"} in plugin["env"]
    for document in enabled:
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def test_the_rbac_is_cluster_wide_only_where_the_code_spans_namespaces() -> None:
    """Cliques, DaemonSets and daemon pods live in the driver's namespace only: a Role, never a ClusterRole."""

    def resources(kind: str) -> dict[str, set[str]]:
        return {
            o["metadata"]["name"]: {r for rule in o["rules"] for r in rule["resources"]}
            for o in template("--set", "computeDomains.enabled=true")
            if o["kind"] == kind and "compute-domain" in o["metadata"]["name"]
        }

    assert resources("ClusterRole") == {
        "dradriver-compute-domain-controller": {"computedomains", "computedomains/status", "resourceclaimtemplates",
                                                "nodes"},
        "dradriver-compute-domain-plugin": {"computedomains", "nodes"},
    }  # fmt: skip
    assert resources("Role") == {
        "dradriver-compute-domain-controller": {"leases", "computedomaincliques", "daemonsets", "pods"},
        "dradriver-compute-domain-daemon": {"computedomaincliques", "pods"},
        "dradriver-compute-domain-plugin": {"computedomaincliques"},
    }


def test_the_crds_use_nvidias_field_names() -> None:
    crd = yaml.safe_load(
        (ROOT / "deployments/helm/dradriver/crds/resource.dradriver.dev_computedomains.yaml").read_text()
    )
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert set(schema["spec"]["properties"]) == {"numNodes", "channel"}
    assert set(schema["spec"]["properties"]["channel"]["properties"]) == {"resourceClaimTemplate", "allocationMode"}
    assert set(schema["status"]["properties"]["nodes"]["items"]["properties"]) == {
        "name", "ipAddress", "cliqueID", "index", "status"
    }  # fmt: skip
    assert schema["spec"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
    ]


def test_the_examples_are_valid_domains() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "ComputeDomain":
                assert doc["apiVersion"] == api.API_VERSION
                api.parse_spec(doc)


def test_a_domain_without_a_channel_is_refused_naming_the_field() -> None:
    with pytest.raises(ClaimError, match="ComputeDomain ns/x: channel: Field required"):
        api.parse_spec({"metadata": {"name": "x", "namespace": "ns"}, "spec": {"numNodes": 2}})


def test_explain_reads_a_compute_domain_as_its_channel_claim(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", str(EXAMPLES / "two-node-job.yaml"), "--sim-profile", "gb200-nvl72-tray", "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    claim = out["claims"][0] if "claims" in out else out[0]
    assert "ComputeDomain two-node-job" in json.dumps(claim)
    assert "channel-0" in json.dumps(claim)


def test_explain_says_a_node_outside_any_clique_has_no_channel(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", str(EXAMPLES / "two-node-job.yaml"), "--sim-profile", "hgx-h200"])
    assert code == 1
    assert "compute-domain.dradriver.dev/type is (missing)" in capsys.readouterr().out


def test_with_compat_nvidia_the_chart_serves_nvidias_compute_domain_api() -> None:
    """compat nvidia: NVIDIA's CRDs (ours, the group swapped, no short name as NVIDIA's, kept on uninstall),
    DeviceClasses, RBAC, the controller's --compat, the node-labels policy's label and the ResourceSlice policy's
    driver names; the CRDs of crds/ (ours, short name cd) stay, unused."""
    rendered = template("--set", "computeDomains.enabled=true", "--set", "compat=nvidia", "--include-crds")
    ours = {
        crd["metadata"]["name"]: crd
        for crd in (yaml.safe_load(p.read_text()) for p in sorted((ROOT / "deployments/helm/dradriver/crds").iterdir()))
    }
    crds = {o["metadata"]["name"]: o for o in rendered if o["kind"] == "CustomResourceDefinition"}
    assert {name: crds[name] for name in ours} == ours
    crds = {name: crd for name, crd in crds.items() if name not in ours}
    assert set(crds) == {"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"}
    for name, crd in crds.items():
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        spec = ours[name.replace("nvidia.com", "dradriver.dev")]["spec"]
        names = {k: v for k, v in spec["names"].items() if k != "shortNames"}
        assert crd["spec"] == {**spec, "group": "resource.nvidia.com", "names": names}
    assert ours["computedomains.resource.dradriver.dev"]["spec"]["names"]["shortNames"] == ["cd"]
    classes = [o for o in rendered if o["kind"] == "DeviceClass" and "compute-domain" in o["metadata"]["name"]]
    assert [(c["metadata"]["name"], c["spec"]) for c in classes] == [
        (c["metadata"]["name"], c["spec"]) for c in api.device_classes(api.NVIDIA)
    ]
    groups = {g for o in rendered if "compute-domain" in o["metadata"]["name"] for r in o.get("rules") or []
              for g in r["apiGroups"]}  # fmt: skip
    assert "resource.nvidia.com" in groups and "resource.dradriver.dev" not in groups
    controller = next(o for o in rendered if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "DRADRIVER_COMPAT", "value": "nvidia"} in controller["env"]
    policy = next(
        o
        for o in rendered
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == "dradriver-nodes-own-labels"
    )
    keys = next(v for v in policy["spec"]["variables"] if v["name"] == "ownedKeys")
    assert keys["expression"] == '["resource.nvidia.com/computeDomain"]'
    slices = next(o for o in rendered if o["metadata"]["name"] == "dradriver-resourceslices-own-node")
    drivers = '["gpu.nvidia.com", "compute-domain.nvidia.com"]'
    assert [v for v in slices["spec"]["validations"] if drivers in v["expression"]]
    for document in rendered:
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def test_nvidias_names_are_its_drivers() -> None:
    """What NVIDIA's compute-domain controller and plugin name (cmd/compute-domain-*, api/nvidia.com/resource)."""
    names = api.NVIDIA
    assert (names.api_version, names.driver_name, names.cdi_vendor) == (
        "resource.nvidia.com/v1beta1", "compute-domain.nvidia.com", "k8s.compute-domain.nvidia.com"
    )  # fmt: skip
    assert (names.domain_label, names.clique_label, names.target_label, names.finalizer) == (
        "resource.nvidia.com/computeDomain", "resource.nvidia.com/computeDomain.cliqueID",
        "resource.nvidia.com/computeDomainTarget", "resource.nvidia.com/computeDomain",
    )  # fmt: skip
    assert (names.channel_class, names.daemon_class) == (
        "compute-domain-default-channel.nvidia.com", "compute-domain-daemon.nvidia.com"
    )  # fmt: skip
    assert api.names_of("nvidia") is api.NVIDIA and api.names_of("none") is api.OURS


def test_the_claim_template_of_a_domain_under_nvidias_names_is_the_one_nvidias_controller_makes() -> None:
    domain = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "imex", "namespace": "team", "uid": "u1"},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "imex-ch"}, "allocationMode": "All"}},
    }
    template = api.workload_claim_template(domain, api.NVIDIA)
    assert template["metadata"]["labels"] == {
        "resource.nvidia.com/computeDomain": "u1", "resource.nvidia.com/computeDomainTarget": "Workload"
    }  # fmt: skip
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}
    ]
    assert devices["config"][0]["opaque"] == {
        "driver": "compute-domain.nvidia.com",
        "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                       "domainID": "u1", "allocationMode": "All"},
    }  # fmt: skip
    assert api.parse_config(devices["config"][0]["opaque"]["parameters"], api.NVIDIA).domain_id == "u1"


@pytest.mark.parametrize(("names", "other"), [(api.OURS, api.NVIDIA), (api.NVIDIA, api.OURS)])
def test_a_config_of_the_other_group_is_refused_naming_the_group_served(
    names: api.ComputeDomainNames, other: api.ComputeDomainNames
) -> None:
    with pytest.raises(ClaimError, match=f"apiVersion: Input should be '{names.api_version}'"):
        api.parse_config(api.channel_config("u1", "Single", other), names)
