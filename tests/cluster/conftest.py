"""Session fixtures of the `cluster` tests: three simulated GPU nodes served by `dradriver run` on the real
control plane (``control_plane``, ``kube`` and ``device_classes`` come from support/cluster_fixtures.py, shared
with the node tests). See docs/cluster-tests.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster_node import SimNode
from support.control_plane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
# The simulated nodes every example claim is tried against: (node, profile, MIG mode).
NODES = (
    ("gpu-dgx", "dgx-a100-80gb", "dynamic"),
    ("gpu-mixed", "mixed", "static"),
    ("gpu-nvl", "h100-nvl-pairs", "none"),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
            # One xdist worker takes every cluster test, so the suite starts one control plane, not one per worker.
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
def nodes(control_plane: ControlPlane, device_classes: None) -> Iterator[dict[str, SimNode]]:
    started: dict[str, SimNode] = {}
    try:
        for name, profile, mig_mode in NODES:
            started[name] = SimNode.start(
                control_plane.kube,
                control_plane.kubeconfig,
                control_plane.root / name,
                name,
                profile=profile,
                mig_mode=mig_mode,
            )
        yield started
    finally:
        for node in started.values():
            (control_plane.logs / f"dradriver-{node.name}.log").write_text(node.driver.log)
            node.stop()
