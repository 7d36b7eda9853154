"""Every output of ours is valid input of ours: the ResourceSlices `inventory -o slices` prints, for every simulated
profile, MIG mode and supported Kubernetes release, are read back by `explain --slices` under that release's rules
(and a release that cannot take a setting is refused by both commands alike); `-o json` and `-o yaml` print one
document each that parses back to the same data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dradriver.cli.main import main
from dradriver.sim.profiles import builtin_profile_names

PROFILES = sorted(builtin_profile_names())
RELEASES = ("1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
MIG_MODES = ("none", "static", "dynamic")


def _inventory(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["inventory", "--gpu-backend", "sim", "--node-name", "node-a", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("profile", PROFILES)
def test_inventory_slices_are_read_back_by_explain_under_their_release(
    profile: str, release: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    read_back = 0
    for mode in MIG_MODES:
        code, out, err = _inventory(
            capsys, "--sim-profile", profile, "--mig-mode", mode, "-o", "slices", "--kubernetes-version", release
        )
        if code == 2:  # a setting the release cannot take: refused with the reason, nothing printed
            assert mode == "dynamic" and release == "1.32", err
            assert out == "" and "needs shared counters" in err
            continue
        assert code == 0, err
        path = tmp_path / f"{mode}.yaml"
        path.write_text(out)
        code = main(["explain", "--slices", str(path), "--kubernetes-version", release, "--selector", "true"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "error" not in captured.err
        read_back += 1
    assert read_back == (2 if release == "1.32" else 3)


@pytest.mark.parametrize("output", ["json", "yaml"])
@pytest.mark.parametrize("profile", PROFILES)
def test_inventory_documents_parse_back_to_the_same_data(
    profile: str, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _inventory(capsys, "--sim-profile", profile, "--mig-mode", "dynamic", "-o", output)
    assert code == 0, err
    document = json.loads(out) if output == "json" else yaml.safe_load(out)
    code, other, err = _inventory(
        capsys, "--sim-profile", profile, "--mig-mode", "dynamic", "-o", "yaml" if output == "json" else "json"
    )
    assert code == 0, err
    assert document == (yaml.safe_load(other) if output == "json" else json.loads(other))
    assert document["gpus"], "a simulated node has GPUs"
