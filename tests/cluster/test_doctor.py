"""`dradriver doctor --kubeconfig` against the real API server: its version and the DRA API it serves."""

from __future__ import annotations

import json

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
