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
