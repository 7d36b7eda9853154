"""`dradriver demo` runs the whole driver on a simulated node and cleans up after itself."""

from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_allocates_prepares_and_unprepares_the_default_claim(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for step in (
        "1. Discovered",
        "2. Published",
        "3. Allocated",
        "4. Registered",
        "5. NodePrepareResources",
        "6. NodeUnprepareResources",
    ):
        assert f"==> {step}" in out
    assert "the kubelet chose v1.DRAPlugin" in out
    assert '"NVIDIA_VISIBLE_DEVICES=void"' in out
    assert '"DRADRIVER_DEVICE_GPU_' in out and "/libcuda.so." in out
    assert '"type": "Ready"' in out and '"uuid": "GPU-' in out  # the claim's status.devices
    assert "CDI spec removed: True" in out


def test_demo_prepares_an_existing_mig_device_from_a_claim_file(capsys):
    claim = ROOT / "examples/claims/mig-static.yaml"
    assert main(["demo", "--sim-profile", "mixed", "--mig-mode", "static", "--claim", str(claim)]) == 0
    out = capsys.readouterr().out
    assert "gpu-0000-07-00-0-mig-" in out
    assert "MIG-" in out


def test_demo_reports_a_claim_that_does_not_fit(tmp_path, capsys):
    claim = tmp_path / "nine.yaml"
    claim.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: nine, namespace: default}\n"
        "spec:\n  devices:\n    requests:\n    - name: gpus\n      exactly: {deviceClassName: gpu.dradriver.dev, "
        "count: 9}\n"
    )
    assert main(["demo", "--claim", str(claim)]) == 1
    assert "does not fit" in capsys.readouterr().out


def test_demo_rejects_a_file_without_a_claim(tmp_path, capsys):
    empty = tmp_path / "class.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert main(["demo", "--claim", str(empty)]) == 2
    assert "no ResourceClaim or ResourceClaimTemplate" in capsys.readouterr().err


def test_demo_carves_mig_partitions_in_dynamic_mode(capsys):
    claim = ROOT / "examples/claims/mig-same-parent.yaml"
    assert main(["demo", "--sim-profile", "dgx-a100-80gb", "--mig-mode", "dynamic", "--claim", str(claim)]) == 0
    out = capsys.readouterr().out
    assert out.count("-mig-1g10gb-") >= 3
    assert out.count("_MIG_1G10GB_") >= 3 and "=MIG-" in out  # each partition's own DRADRIVER_DEVICE_… env
    assert "CDI spec removed: True" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: c}\n"
            "spec: {devices: {requests: 3}}\n",
            "spec.devices.requests: expected a list, got a number",
        ),
        (
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: [c]\nspec: {}\n",
            "metadata: expected a mapping",
        ),
        (
            "kind: ResourceClaimTemplate\napiVersion: resource.k8s.io/v1\nmetadata: {name: t}\nspec: {spec: x}\n",
            "spec.spec: expected a mapping, got a string",
        ),
        (
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: c}\nspec: {devices: {requests: "
            "[{name: a, exactly: {deviceClassName: gpu.dradriver.dev}}, {name: a, exactly: {deviceClassName: x}}]}}\n",
            "request name 'a' is used twice",
        ),
        (
            "kind: ResourceClaim\napiVersion: resource.k8s.io/v1\nmetadata: {name: c}\nspec: {devices: {requests: "
            "[{name: a, exactly: {deviceClassName: nope.example.com}}]}}\n",
            "DeviceClass nope.example.com does not exist",
        ),
    ],
)
def test_demo_refuses_a_claim_the_api_server_would_refuse(tmp_path, capsys, text, message):
    path = tmp_path / "claim.yaml"
    path.write_text(text)
    assert main(["demo", "--claim", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("special", ["/dev/zero", "/nonexistent/claim.yaml"])
def test_demo_refuses_a_claim_path_that_is_no_file(capsys, special):
    assert main(["demo", "--claim", special]) == 2
    assert f"--claim {special}" in capsys.readouterr().err
