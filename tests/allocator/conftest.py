from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="session")
def whole_gpus() -> list[dict]:
    """node-a: a DGX A100 80GB with 8 whole GPUs on one NVSwitch."""
    return load(ROOT / "tests/fixtures/slices/dgx-a100-80gb.yaml")


@pytest.fixture(scope="session")
def mig_node() -> list[dict]:
    """node-m: two A100 80GB GPUs with every dynamic MIG partition and shared counters."""
    return load(ROOT / "tests/fixtures/slices/dgx-a100-80gb-mig.yaml")


@pytest.fixture(scope="session")
def classes() -> list[dict]:
    return [d for f in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml")) for d in load(f)]


@pytest.fixture(scope="session")
def shared_gpus() -> list[dict]:
    """node-s: three A100s that allow multiple allocations (consumable memory) and one exclusive one."""
    return load(ROOT / "tests/fixtures/slices/shared-gpus-consumable.yaml")
