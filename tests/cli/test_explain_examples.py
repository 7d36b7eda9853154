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


def profile_of(path: Path) -> tuple[str, str]:
    match = re.search(r"^# Profile: (\S+)(?: --mig-mode (\S+))?", path.read_text(), re.M)
    assert match, f"{path.name} must start with a '# Profile: NAME [--mig-mode MODE]' comment"
    return match.group(1), match.group(2) or "none"


def test_there_are_examples():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_fits_its_profile(path, capsys):
    profile, mig_mode = profile_of(path)
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
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert " fits on node " in out


@pytest.mark.parametrize(
    "path", EXAMPLES + MANIFESTS + FIXTURE_SLICES, ids=[p.name for p in EXAMPLES + MANIFESTS + FIXTURE_SLICES]
)
def test_object_is_valid_for_kubernetes_1_37(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
