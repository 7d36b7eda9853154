"""The `node` tests: pods with our claims on a real kubelet and containerd (the ``node`` fixture of
support/cluster_fixtures.py). See docs/node-tests.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.node_pods import Workloads
from support.real_node import RealNode


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)
            # The worker that runs the cluster tests: one control plane per suite.
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture
def workloads(node: RealNode) -> Workloads:
    return Workloads(node)
