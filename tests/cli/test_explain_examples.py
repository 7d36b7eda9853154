"""Every example claim is explained (and fits) against the profile its leading comment names, and every
example and DeviceClass manifest is a valid Kubernetes 1.37 object."""

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples/claims").glob("*.yaml"))
MANIFESTS = sorted((ROOT / "manifests/deviceclasses").glob("*.yaml"))
FIXTURE_SLICES = sorted((ROOT / "tests/fixtures/slices").glob("*.yaml"))


def profile_of(path: Path) -> tuple[str, str, list[str]]:
    match = re.search(r"^# Profile: (\S+)(?: --mig-mode (\S+))?((?: --[a-z-]+ \S+)*)", path.read_text(), re.M)
    assert match, f"{path.name} must start with a '# Profile: NAME [--mig-mode MODE] [FLAG VALUE]...' comment"
    return match.group(1), match.group(2) or "none", match.group(3).split()


def test_there_are_examples():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_fits_its_profile(path, capsys):
    profile, mig_mode, flags = profile_of(path)
    code = main(
        [
            "explain",
            str(path),
            "--sim-profile",
            profile,
            "--mig-mode",
            mig_mode,
            "--classes",
            str(ROOT / "manifests/deviceclasses"),
            *flags,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert " fits on node " in out


@pytest.mark.parametrize(
    "path", EXAMPLES + MANIFESTS + FIXTURE_SLICES, ids=[p.name for p in EXAMPLES + MANIFESTS + FIXTURE_SLICES]
)
def test_object_is_valid_for_kubernetes_1_37(path):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)  # raises on the first invalid one


SCENARIOS = sorted((ROOT / "examples/scenarios").glob("*.yaml"))
# 10 needs a second driver's DeviceClass and slices; 11 asks for GPUs by extended resource only (no claim).
EXPLAINABLE = [p for p in SCENARIOS if not p.name.startswith(("10-", "11-"))]


@pytest.mark.parametrize("path", EXPLAINABLE, ids=[p.stem for p in EXPLAINABLE])
def test_scenario_with_its_workload_is_explained_on_its_node(path, capsys):
    """Pods, Deployments and the like beside the claims are skipped with a note, not counted as bad input."""
    node = re.search(r"^# Node: (\S+)(?: --mig-mode (\S+))?(.*)$", path.read_text(), re.M)
    assert node, path.name
    args = ["explain", str(path), "--sim-profile", node.group(1), "--classes", str(ROOT / "manifests/deviceclasses")]
    code = main([*args, "--mig-mode", node.group(2) or "none", *node.group(3).split()])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert "error:" not in captured.err
    assert "note: " in captured.err and "skipped " in captured.err
