"""The API server's checks called with injected reads: version, DRA API and feature gates; and when there is no
API server to read."""

from __future__ import annotations

import json

import pytest

from dradriver.driver.checks.cluster import (
    api_server_checks,
    api_server_checks_through,
    api_version_checks,
    feature_gate_check,
    feature_gates,
)
from dradriver.driver.checks.settings import ClusterSettings
from dradriver.plugin.cluster.transport import Endpoint

METRICS = """# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRAConsumableCapacity",stage="BETA"} 1
kubernetes_feature_enabled{name="DRADeviceTaints",stage="BETA"} 0
kubernetes_feature_enabled{name="DRAPartitionableDevices",stage="BETA"} 0
kubernetes_feature_enabled{name="SomethingElse",stage=""} 1
"""


def test_dra_feature_gates_off_warn_and_fail_where_the_mig_mode_needs_them() -> None:
    assert feature_gates(METRICS) == {
        "DRAConsumableCapacity": True,
        "DRADeviceTaints": False,
        "DRAPartitionableDevices": False,
        "SomethingElse": True,
    }
    dynamic = feature_gate_check(lambda: METRICS, "dynamic")
    assert dynamic.status == "FAIL" and "DRAPartitionableDevices" in dynamic.fix and "--mig-mode static" in dynamic.fix
    static = feature_gate_check(lambda: METRICS, "static")
    assert static.status == "WARN" and static.detail.startswith(
        "on: DRAConsumableCapacity; off: DRAPartitionableDevices"
    )
    assert "withdrawn from the slices" in static.detail  # what the driver does without device taints


def test_a_forbidden_metrics_endpoint_skips_the_feature_check_with_the_fix() -> None:
    def forbidden() -> str:
        raise RuntimeError("(403)\nReason: Forbidden")

    check = feature_gate_check(forbidden, "dynamic")
    assert check.status == "SKIP" and "(403)" in check.detail and "/metrics" in check.fix


@pytest.mark.parametrize(
    ("minor", "served", "status", "words"),
    [
        ("37", ["v1", "v1beta2"], "OK", "resource.k8s.io v1, v1beta2"),
        ("33", ["v1beta2", "v1beta1"], "OK", "the driver speaks v1beta2"),
        ("32", ["v1beta1"], "OK", "the driver speaks v1beta1"),
        ("32", [], "FAIL", "not served in v1, v1beta2 or v1beta1"),
    ],
)
def test_the_dra_api_check_accepts_every_version_the_driver_speaks(
    minor: str, served: list[str], status: str, words: str
) -> None:
    version = {"major": "1", "minor": minor, "gitVersion": f"v1.{minor}.0"}
    versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in served]
    groups = {"kind": "APIGroupList", "groups": [{"name": "resource.k8s.io", "versions": versions}]}
    server, dra = api_version_checks(lambda: version, lambda: groups)
    assert server.status == "OK"
    assert dra.status == status and words in dra.detail, dra
    if status == "FAIL":
        assert "--runtime-config=resource.k8s.io/v1beta1=true" in dra.fix


def test_an_api_server_older_than_1_32_fails_with_the_upgrade() -> None:
    version = {"major": "1", "minor": "31", "gitVersion": "v1.31.4"}
    server, _ = api_version_checks(lambda: version, lambda: {"kind": "APIGroupList", "groups": []})
    assert server.status == "FAIL" and server.fix == "upgrade to 1.32 or newer"


def test_every_api_check_reads_through_the_injected_get() -> None:
    answers = {
        "/version": json.dumps({"major": "1", "minor": "34", "gitVersion": "v1.34.1"}).encode(),
        "/apis": json.dumps({"groups": [{"name": "resource.k8s.io", "versions": [{"version": "v1"}]}]}).encode(),
        "/metrics": b'kubernetes_feature_enabled{name="DRAPartitionableDevices",stage="BETA"} 1\n',
    }
    checks = list(api_server_checks_through(answers.__getitem__, mig_mode="dynamic"))
    assert [(c.name, c.status) for c in checks] == [("API server", "OK"), ("DRA API", "OK"), ("DRA features", "OK")]


def test_an_unreachable_api_server_fails_and_its_metrics_are_skipped() -> None:
    def refused(path: str) -> bytes:
        raise ConnectionRefusedError(111, "Connection refused")

    server, features = api_server_checks_through(refused, mig_mode="static")
    assert server.status == "FAIL" and server.detail.startswith("unreachable: ")
    assert features.status == "SKIP"


def test_without_a_client_configuration_the_api_server_is_skipped() -> None:
    [skipped] = api_server_checks(ClusterSettings(endpoint=None, mig_mode="static"))
    assert skipped.status == "SKIP" and "pass --kubeconfig" in skipped.detail


def test_the_api_server_check_names_the_configuration_it_went_through() -> None:
    # (An unusable kubeconfig never gets here: doctor refuses it first, exit 2, as every command does.)
    nowhere = Endpoint("https://127.0.0.1:1")
    settings = ClusterSettings(endpoint=nowhere, source="$KUBECONFIG /home/me/kubeconfig", mig_mode="static")
    server, _features = api_server_checks(settings)
    assert server.status == "FAIL" and server.detail.startswith("unreachable: ")
    assert server.detail.endswith("(through $KUBECONFIG /home/me/kubeconfig)")
