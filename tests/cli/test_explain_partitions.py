"""`dradriver explain` on an HGX profile with Fabric Manager's partitions: a claim aligning its GPUs on partition2
fits with --fabric-manager-partitions and is allocated one pair FM offers; without it, explain names the flag and the
chart value that would make it fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples/claims/nvswitch-partition-pair.yaml")
ARGS = ["explain", EXAMPLE, "--sim-profile", "hgx-h100-80gb", "--mig-mode", "none", "--classes"]
CLASSES = str(ROOT / "manifests/deviceclasses")
PAIRS = [("1b", "43"), ("52", "61"), ("9d", "c3"), ("d1", "df")]  # FM's partitions 3..6 of two GPUs each


def test_with_the_flag_the_claim_gets_the_two_gpus_of_one_partition(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, CLASSES, "--fabric-manager-partitions", "true"]) == 0
    out = capsys.readouterr().out
    assert "--fabric-manager-partitions true (fabricManagerPartitions.enabled)" in out
    allocated = next(line for line in out.splitlines() if "allocated:" in line)
    assert any(f"gpu-0000-{a}-00-0, gpu-0000-{b}-00-0" in allocated for a, b in PAIRS), allocated


def test_without_it_explain_names_the_flag_and_chart_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, CLASSES]) == 1
    out = capsys.readouterr().out
    assert "matchAttribute gpu.dradriver.dev/partition2 over gpus) cannot be met" in out
    assert "would fit with: --fabric-manager-partitions true (chart value fabricManagerPartitions.enabled: true)" in out
