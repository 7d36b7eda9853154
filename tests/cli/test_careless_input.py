"""Careless input, as a new user types it: every subcommand answers a mistake with a line naming the input and
the fix, exit 2, never a traceback or an internal error (exit 70); and output cut short by the reader (`| head -1`)
is never an error. Grown from what trying the commands found; add each new case here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLAIM = str(ROOT / "examples/claims/single-gpu.yaml")
DRADRIVER = str(Path(sys.executable).with_name("dradriver"))

GOOD_CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.dradriver.dev}
"""

GPU_POD = """apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - {name: main, image: i, resources: {limits: {nvidia.com/gpu: 1}}}
"""

#: File contents a careless user hands over, by name.
FILES: dict[str, Callable[[Path], None]] = {
    "empty.yaml": lambda p: p.write_text(""),
    "binary.yaml": lambda p: p.write_bytes(bytes(range(128, 256))),
    "a-directory": lambda p: p.mkdir(),
    "misspelt.yaml": lambda p: p.write_text(GOOD_CLAIM.replace("deviceClassName", "deviceClass")),
    "two-without-separator.yaml": lambda p: p.write_text(GOOD_CLAIM + GOOD_CLAIM),
    "wrong-version.yaml": lambda p: p.write_text(GOOD_CLAIM.replace("resource.k8s.io/v1", "resource.k8s.io/v2")),
    "wrong-group.yaml": lambda p: p.write_text(GOOD_CLAIM.replace("resource.k8s.io/v1", "v1")),
    "a-list.yaml": lambda p: p.write_text("- a\n- b\n"),
    "broken.yaml": lambda p: p.write_text("kind: [\n"),
    "pod.yaml": lambda p: p.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"),
    "containers-a-number.yaml": lambda p: p.write_text(GPU_POD.replace("containers:\n", "containers: 5\n#")),
    "claims-a-string.yaml": lambda p: p.write_text(GPU_POD.replace("limits:", "claims: x, limits:")),
    "resource-claims-a-mapping.yaml": lambda p: p.write_text(GPU_POD + "  resourceClaims: {}\n"),
}

#: (argv with FILE placeholders, the text every error names), each an exit-2 mistake.
CASES = [
    (["explain", "misspelt.yaml", "--sim-profile", "mixed"], 'did you mean "deviceClassName"'),
    (["explain", "two-without-separator.yaml", "--sim-profile", "mixed"], 'duplicate field "apiVersion"'),
    (["explain", "wrong-version.yaml", "--sim-profile", "mixed"], "resource.k8s.io/v1beta1"),
    (["explain", "wrong-group.yaml", "--sim-profile", "mixed"], "apiVersion"),
    (["explain", "binary.yaml", "--sim-profile", "mixed"], "not UTF-8 text"),
    (["explain", "broken.yaml", "--sim-profile", "mixed"], "not valid YAML"),
    (["explain", "a-list.yaml", "--sim-profile", "mixed"], "not a Kubernetes object"),
    (["explain", "empty.yaml", "--sim-profile", "mixed"], "no ResourceClaim or ResourceClaimTemplate found"),
    (["explain", "a-directory", "--sim-profile", "mixed"], "no ResourceClaim or ResourceClaimTemplate found"),
    (["explain", "pod.yaml", "--sim-profile", "mixed"], "no ResourceClaim or ResourceClaimTemplate found"),
    (["explain", "no-such-file.yaml", "--sim-profile", "mixed"], "no such file or directory"),
    (["explain", CLAIM], "no ResourceSlices to allocate from"),
    (["explain", CLAIM, "--slices", "binary.yaml"], "not UTF-8 text"),
    (["explain", CLAIM, "--slices", "misspelt.yaml"], "kind 'ResourceClaim' is not one of ResourceSlice"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--classes", "empty.yaml"], "no DeviceClass found in"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--allocated", "binary.yaml"], "not UTF-8 text"),
    (["explain", CLAIM, "--sim-profile", "a-directory"], "is a directory; pass a file"),
    (["explain", CLAIM, "--sim-profile", "empty.yaml"], "a node profile must be a mapping"),
    (["explain", CLAIM, "--sim-profile", "dgx-z"], "unknown simulated node profile 'dgx-z'"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--mig-mode", "Dynamic"], "invalid choice: 'Dynamic'"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--kubernetes-version", "2.0"], "releases are 1.N"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--kubernetes-version", "1.31"], "DRA needs 1.32 or newer"),
    (["explain", CLAIM, "--sim-profile", "mixed", "--consumable-shares", "0"], "give memory"),
    (["explain", "--selector", "device.attributes[", "--sim-profile", "mixed"], "invalid CEL"),
    (["inventory", "--gpu-backend", "sim", "--sim-profile", "binary.yaml"], "not UTF-8 text"),
    (["inventory", "--gpu-backend", "sim", "--sim-state", "a-directory"], "is a directory; pass a file"),
    (["inventory", "--gpu-backend", "sim", "--sim-state", "binary.yaml"], "not UTF-8 text"),
    (["inventory", "--gpu-backend", "sim", "--kubernetes-version", "1.3x", "-o", "slices"], "not a version like"),
    (
        ["inventory", "--gpu-backend", "sim", "--mig-mode", "dynamic", "--kubernetes-version", "1.32", "-o", "slices"],
        "needs shared counters",
    ),
    (["top", "--address", "host:port"], "is not HOST:PORT"),
    (["top", "--address", "fe80::1:8080"], "write [fe80::1]:8080"),
    (["run", "--node-name", "n", "--mps-control-command", "'x"], "no closing quotation"),
    (["run", "--node-name", "n", "--mps-daemon-wrapper", "nsenter \\"], "no escaped character"),
    (["cd-daemon", "run", "--imex-command", "'x"], "no closing quotation"),
    (["cd-daemon", "check", "--imex-ctl-command", "'x"], "no closing quotation"),
    (["convert", "containers-a-number.yaml"], "field spec.containers: expected a list, got a number"),
    (["convert", "claims-a-string.yaml"], "field spec.containers[0].resources.claims: expected a list, got a string"),
    (["convert", "resource-claims-a-mapping.yaml"], "field spec.resourceClaims: expected a list, got a mapping"),
]


@pytest.mark.parametrize(("argv", "named"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_mistake_gets_a_line_naming_it_and_exit_2(
    argv: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, make in FILES.items():
        make(tmp_path / name)
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    lines = [line for line in captured.err.splitlines() if not line.startswith("note: ")]
    assert lines, "a mistake must be said"
    assert all(named in line or "error" in line for line in lines), captured.err
    assert any(named in line for line in lines), captured.err
    assert "Traceback" not in captured.err and "internal error" not in captured.err


@pytest.mark.parametrize(
    "argv",
    [
        ["inventory", "--gpu-backend", "sim", "--sim-profile", "mixed", "--mig-mode", "dynamic", "-o", "slices"],
        ["inventory", "--gpu-backend", "sim", "-o", "json"],
        ["explain", CLAIM, "--sim-profile", "dgx-a100-80gb", "--mig-mode", "dynamic"],
        ["explain", "--selector", "true", "--sim-profile", "mixed", "--mig-mode", "dynamic"],
        ["explain", "--help"],
    ],
    ids=lambda argv: " ".join(argv[:3]),
)
def test_output_cut_short_by_its_reader_is_not_an_error(argv: list[str]) -> None:
    """`dradriver … | head -1`: the reader closes the pipe after one line; no traceback, exit 0."""
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    process = subprocess.Popen([DRADRIVER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its line
    errors = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0, errors
    assert first and errors == ""


def test_sim_show_whose_reader_is_gone_is_not_a_state_file_error(tmp_path: Path) -> None:
    """The reader gone before `show` writes (`| head -0`): the write fails with EPIPE, which is the closed pipe's
    rule (exit 0, nothing said), not "cannot write the state file"."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    argv = ["sim", "--sim-profile", "mixed", "--sim-state", str(tmp_path / "s.json"), "--node-name", "n", "show"]
    try:
        done = subprocess.run([DRADRIVER, *argv], stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr.decode() == ""
