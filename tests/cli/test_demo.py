"""`dradriver demo` runs the whole driver on a simulated node and cleans up after itself."""

import re
from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_demo_allocates_prepares_and_unprepares_the_default_claim(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for step in (
        "1. Discovered node demo-node (simulated: dgx-a100-80gb)",
        "2. Published",
        "3. Allocated claim default/two-nvlinked-gpus from the built-in example (--claim FILE for yours)",
        "4. Registered",
        "5. NodePrepareResources",
        "6. NodeUnprepareResources",
    ):
        assert f"==> {step}" in out
    assert "DeviceClasses: the chart's (--classes FILE|DIR for your cluster's)" in out
    assert "the kubelet chose v1.DRAPlugin" in out
    assert "CDI spec removed: True" in out


def test_demo_prints_the_cdi_spec_and_claim_status_shortened_and_whole_with_full(capsys):
    """By default a line per CDI device and one for the edits of every device (steps 1-4 stay on one screen);
    --full prints the spec and status.devices whole."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    spec = out[out.index("CDI spec k8s.gpu.dradriver.dev-claim_") : out.index("claim status.devices:")]
    lines = spec.splitlines()
    assert lines[1] == "  kind k8s.gpu.dradriver.dev/claim, cdiVersion 0.5.0, 2 devices"
    assert lines[2].startswith("  device …-gpu-0000-07-00-0: device node /dev/nvidia0; env DRADRIVER_DEVICE_GPU_")
    assert (
        lines[4].startswith("  every device: 4 device nodes; ")
        and "mounts (/usr/lib/x86_64-linux-gnu/libcuda.so." in lines[4]
    )
    assert lines[4].endswith("; env NVIDIA_VISIBLE_DEVICES=void") and lines[5] == "  … (--full for the whole spec)"
    [status] = [line for line in out.splitlines() if line.startswith("  gpu-0000-07-00-0: ")]
    assert (
        status.startswith("  gpu-0000-07-00-0: Ready (Prepared); uuid GPU-") and "sharing.strategy Exclusive" in status
    )
    assert len(out[: out.index("==> 5.")].splitlines()) <= 25  # steps 1-4 on one screen, with room to spare
    assert len(out.splitlines()) <= 40

    assert main(["demo", "--full"]) == 0
    out = capsys.readouterr().out
    assert '"NVIDIA_VISIBLE_DEVICES=void"' in out
    assert '"DRADRIVER_DEVICE_GPU_' in out and '"hostPath": "/dev/null"' in out and "/libcuda.so." in out
    assert '"type": "Ready"' in out and '"uuid": "GPU-' in out  # the claim's status.devices
    assert "--full for the whole spec" not in out


def test_demo_prepares_an_existing_mig_device_from_a_claim_file_and_names_the_file(capsys):
    claim = ROOT / "examples/claims/mig-static.yaml"
    assert main(["demo", "--sim-profile", "mixed", "--mig-mode", "static", "--claim", str(claim)]) == 0
    out = capsys.readouterr().out
    step = f"==> 3. Allocated claim default/mig-static-demo from ResourceClaimTemplate default/mig-static of {claim} #1"
    assert f"{step} as the scheduler would" in out
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


def test_demo_help_names_the_backend_it_uses(capsys):
    assert main(["demo", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: sim)" in out and "(default: nvml)" not in out
    assert "[env DRADRIVER_GPU_BACKEND]" not in out and "[env DRADRIVER_SIM_STATE]" not in out
    for flag in ("--compat", "--classes FILE|DIR", "--full", "--sim-state PATH", "--gpu-sharing"):
        assert flag in out


def test_a_claim_of_nvidia_s_names_demos_with_compat_nvidia_and_says_so_without(capsys):
    claim = ROOT / "examples/nvidia/01-one-gpu-per-pod.yaml"
    assert main(["demo", "--sim-profile", "mixed", "--mig-mode", "none", "--claim", str(claim)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "DeviceClass gpu.nvidia.com does not exist" in line and line.endswith(
        "pass it with --classes (a class of NVIDIA's driver: add --compat nvidia)"
    )
    assert (
        main(["demo", "--sim-profile", "mixed", "--mig-mode", "none", "--compat", "nvidia", "--claim", str(claim)]) == 0
    )
    out = capsys.readouterr().out
    assert "DeviceClasses: the chart's with compat: nvidia" in out
    assert "plugin gpu.nvidia.com, " in out and "request gpu: gpu-0000-" in out
    assert "CDI spec removed: True" in out


def test_the_built_in_claim_uses_the_compat_preset_s_names(capsys):
    assert main(["demo", "--compat", "nvidia"]) == 0
    out = capsys.readouterr().out
    assert out.count("request gpus: gpu-0000-") == 2 and "plugin gpu.nvidia.com, " in out


CLASS = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: fast-gpu.example.com}
spec:
  selectors:
  - cel: {expression: "device.driver == 'gpu.dradriver.dev' && device.attributes['gpu.dradriver.dev'].type == 'gpu'"}
"""
CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: fast, namespace: team-a}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: fast-gpu.example.com}}]}}
"""


def test_classes_replace_the_chart_s_and_the_claim_file_s_are_added(tmp_path, capsys):
    classes = tmp_path / "classes"
    classes.mkdir()
    (classes / "fast.yaml").write_text(CLASS)
    claim = tmp_path / "claim.yaml"
    claim.write_text(CLAIM)
    assert main(["demo", "--classes", str(classes), "--claim", str(claim)]) == 0
    out = capsys.readouterr().out
    assert f"==> 3. Allocated claim team-a/fast from {claim} #1 as the scheduler would" in out
    assert f"DeviceClasses: from --classes {classes}\n" in out and "request gpu: gpu-0000-07-00-0" in out

    # Without --classes the chart's have no such class: the hint names the flag demo now has.
    assert main(["demo", "--claim", str(claim)]) == 2
    assert "DeviceClass fast-gpu.example.com does not exist" in capsys.readouterr().err

    # A class in the claim file is added to the chart's.
    claim.write_text(CLASS + "---\n" + CLAIM)
    assert main(["demo", "--claim", str(claim)]) == 0
    assert "DeviceClasses: the chart's (--classes FILE|DIR for your cluster's), and 1 from the --claim file" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no DeviceClass there; give your cluster's DeviceClasses"),
        (CLASS.replace("selectors", "selector"), "selector"),
        (CLAIM, "kind 'ResourceClaim' is not one of DeviceClass"),
    ],
)
def test_classes_that_are_not_valid_device_classes_are_one_line_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "classes.yaml"
    path.write_text(text)
    assert main(["demo", "--classes", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"dradriver demo: error: --classes {path}") and message in line


def test_the_first_of_several_claims_is_demoed_and_said_to_be(tmp_path, capsys):
    claim = tmp_path / "two.yaml"
    claim.write_text(
        CLAIM.replace("fast-gpu.example.com", "gpu.dradriver.dev") + "---\n" + CLAIM.replace("fast,", "slow,")
    )
    assert main(["demo", "--claim", str(claim)]) == 0
    assert f"from {claim} #1 (the first of its 2 claims) as the scheduler would" in capsys.readouterr().out


def test_a_device_plugin_style_pod_gets_the_claim_the_scheduler_makes_for_it(capsys):
    pod = ROOT / "examples/scenarios/11-device-plugin-style.yaml"
    assert main(["demo", "--claim", str(pod)]) == 0
    out = capsys.readouterr().out
    assert (
        "==> 3. Allocated claim default/device-plugin-style-extended-resources from the extended resources of Pod "
        f"default/device-plugin-style in {pod} #1 (KEP-5004) as the scheduler would"
    ) in out
    assert "request container-0-request-0: gpu-0000-" in out


def test_sim_state_is_the_node_s_hardware_kept_across_runs(tmp_path, capsys):
    """A MIG device destroyed with `dradriver sim` is gone for demo too; demo leaves the state as it found it."""
    state = tmp_path / "sim.json"
    node = ["--sim-profile", "mixed", "--node-name", "demo-node", "--sim-state", str(state)]
    assert main(["sim", *node, "mig-destroy", "0", "3"]) == 0
    claim = ROOT / "examples/claims/mig-static.yaml"
    assert main(["demo", *node, "--mig-mode", "static", "--claim", str(claim)]) == 0
    out = capsys.readouterr().out
    assert f"==> 1. Discovered node demo-node (simulated: mixed, state in {state})" in out
    assert "-mig-3g20gb-0 " in out and "-mig-2g10gb-4 " in out and "-mig-1g5gb-6 " not in out
    assert main(["sim", *node, "show"]) == 0
    shown = capsys.readouterr().out
    assert "GI 1  3g.20gb" in shown and "GI 2  2g.10gb" in shown and "GI 3" not in shown


def test_demo_in_a_driver_s_pod_takes_neither_its_gpus_nor_its_state_file(tmp_path, monkeypatch, capsys):
    """The chart's DaemonSet sets DRADRIVER_GPU_BACKEND and DRADRIVER_SIM_STATE for the running driver: `kubectl exec
    … dradriver demo` demos a node in memory, never the node's GPUs or the live state file."""
    state = tmp_path / "live.json"
    monkeypatch.setenv("DRADRIVER_GPU_BACKEND", "nvml")
    monkeypatch.setenv("DRADRIVER_SIM_STATE", str(state))
    assert main(["demo"]) == 0
    assert "==> 1. Discovered node demo-node (simulated: dgx-a100-80gb)\n" in capsys.readouterr().out
    assert not state.exists()


def test_demo_destroys_unowned_mig_devices_only_on_its_own_node_in_memory(capsys):
    claim = ROOT / "examples/claims/mig-same-parent.yaml"
    assert main(["demo", "--sim-profile", "mixed", "--mig-mode", "dynamic", "--claim", str(claim)]) == 0
    assert "dynamic MIG: destroyed 3 MIG devices no claim owns" in capsys.readouterr().out


def test_demo_leaves_the_mig_devices_of_a_state_file_alone_and_names_those_in_the_way(tmp_path, monkeypatch, capsys):
    """A MIG device in --sim-state may be a running driver's: dynamic mode does not destroy it; the prepare it blocks
    fails, and demo says which device is in the way and how to destroy it."""
    state = tmp_path / "st.json"
    sim = ["sim", "--sim-state", str(state), "--node-name", "demo-node"]
    for action in (["mig-mode", "0", "enable"], ["reset", "0"], ["mig-create", "0", "1g.10gb"]):
        assert main([*sim, *action]) == 0
    capsys.readouterr()
    monkeypatch.setenv("DRADRIVER_MIG_MODE", "dynamic")
    assert main(["demo", "--sim-state", str(state)]) == 1
    out = capsys.readouterr().out
    assert "destroyed" not in out and "dynamic MIG: 1 MIG device already there, left alone" in out
    assert "in the way: MIG devices the demo did not make, left alone: gpu-0000-07-00-0-mig-1g10gb-0\n" in out
    assert f"destroy them (dradriver sim --sim-state {state} --node-name demo-node mig-destroy 0000:07:00.0 1)" in out
    assert main([*sim, "show"]) == 0
    assert "GI 1  1g.10gb" in capsys.readouterr().out


def test_sim_state_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    state = tmp_path / "file" / "sim.json"  # its directory is a file
    assert main(["demo", "--sim-state", str(state)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(
        f"dradriver demo: error: --sim-state's directory {state.parent}"
    )


def test_a_state_file_that_cannot_be_made_is_one_line_naming_it(capsys):
    """Root passes the permission check on /proc, which takes no file: opening the node says so, as run does."""
    assert main(["demo", "--sim-state", "/proc/x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("dradriver demo: error: --sim-state /proc/x")


SCENARIOS = sorted((ROOT / "examples/scenarios").glob("*.yaml")) + sorted((ROOT / "examples/nvidia").glob("*.yaml"))
# 10 needs a second driver (a NIC's DeviceClass and slices), which a demo node does not have.
DEMOABLE = [p for p in SCENARIOS if not p.name.startswith("10-")]


@pytest.mark.parametrize("path", DEMOABLE, ids=[f"{p.parent.name}/{p.stem}" for p in DEMOABLE])
def test_every_scenario_and_nvidia_example_demos_on_the_node_it_names(path, capsys):
    node = re.search(r"^# Node: (\S+)(?: --mig-mode (\S+))?(.*)$", path.read_text(), re.M)
    assert node, path.name
    compat = ["--compat", "nvidia"] if path.parent.name == "nvidia" else []
    args = ["--sim-profile", node.group(1), "--mig-mode", node.group(2) or "none", *node.group(3).split(), *compat]
    assert main(["demo", *args, "--claim", str(path)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f" from {path} #" in out or f" of {path} #" in out or f" in {path} #" in out
    assert "CDI spec removed: True" in out
