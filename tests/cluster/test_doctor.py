"""`dradriver doctor --kubeconfig` against the real API server: its version and the DRA API it serves; in a pod,
the same through the service account."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.control_plane import ControlPlane

from dradriver.cli.main import main


def test_doctor_reads_the_api_servers_version_and_dra_api(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["doctor", "--gpu-backend", "sim", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["API server"]["status"] == "OK" and checks["API server"]["detail"].startswith("Kubernetes v1.")
    assert checks["DRA API"]["status"] == "OK" and "v1" in checks["DRA API"]["detail"].split(" ", 1)[1].split(", ")


def test_doctor_says_an_unreachable_api_server_fails(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    assert main(["doctor", "--gpu-backend", "sim", "--kubeconfig", str(config), "-o", "json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["API server"]["status"] == "FAIL" and "--kubeconfig" in checks["API server"]["fix"]


def test_doctor_reports_the_api_servers_dra_feature_gates(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["doctor", "--gpu-backend", "sim", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"])
    check = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "DRA features")
    # The test control plane turns on every DRA gate the driver uses (support/control_plane.py).
    assert check["status"] == "OK", check
    assert {"DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints"} <= set(
        check["detail"].removeprefix("on: ").split(", ")
    )


def test_in_a_pod_doctor_checks_the_api_server_through_the_service_account(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # `kubectl exec ds/dradriver-kubelet-plugin -- dradriver doctor`: no kubeconfig, the pod's service account (a
    # token of an account without RBAC rules: discovery is open to every account, /metrics is not).
    kube = control_plane.kube
    if kube.find("serviceaccounts", "doctor", "default") is None:
        kube.create("serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "doctor"}},
                    "default")  # fmt: skip
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token = kube.request("POST", "/api/v1/namespaces/default/serviceaccounts/doctor/token", request)
    (tmp_path / "token").write_text(token["status"]["token"])
    code = (
        "from dradriver.plugin.cluster import transport; "
        f"transport.SERVICE_ACCOUNT_TOKEN = {str(tmp_path / 'token')!r}; "
        f"transport.SERVICE_ACCOUNT_CA = {str(control_plane.pki.ca_cert)!r}; "
        "import runpy; runpy.run_module('dradriver', run_name='__main__', alter_sys=True)"
    )
    env = {k: v for k, v in os.environ.items() if k != "DRADRIVER_KUBECONFIG"}
    env |= {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(control_plane.port)}
    done = subprocess.run([sys.executable, "-c", code, "doctor", "--gpu-backend", "sim", "-o", "json"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)  # fmt: skip
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["API server"]["status"] == "OK" and checks["API server"]["detail"].startswith("Kubernetes v1.")
    assert checks["DRA API"]["status"] == "OK", checks["DRA API"]
    gates = checks["DRA features"]
    assert gates["status"] == "SKIP" and "403" in gates["detail"] and "/metrics" in gates["fix"], gates
