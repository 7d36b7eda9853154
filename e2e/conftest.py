"""The end-to-end suite, on one of two backends with the same test bodies:

- kind: a real cluster made with README's "Try it on kind" commands (e2e/kind_backend.py), the chart installed
  with the sim preset as users install it (the image its only other value), its DaemonSet on a simulated GPU
  node. Docker where its daemon answers, else podman; the node image scripts/build-kind made, else the public
  kindest one. A scenario for another node configuration gets it by `helm upgrade` of the release (and back);
  one that needs the NIC driver gets it as a DaemonSet beside ours (kindutil.Cluster, e2e/nic_driver_kind.py).
  e2e/run-kind.sh runs it; scripts/test too (E2E_BACKEND=kind), after the rest.
- the local node: the `node` tests' real kubelet and containerd (scripts/build-node) on the real control plane
  (scripts/build-control-plane), `dradriver run` on a simulated GPU node as a host process, restarted with other
  flags for a scenario's node, the NIC driver a host process beside it. Without those binaries it skips, or fails
  where the suite demands them (tests/support/required.py: DRADRIVER_REQUIRE_ALL=1 or DRADRIVER_REQUIRE_NODE=1).

E2E_BACKEND=kind or E2E_BACKEND=local picks one; unset, kind where a Docker daemon and kind exist, else local.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import kind_backend
import pytest
from kindutil import Backend
from local_backend import LocalCluster


def backend() -> str:
    return kind_backend.backend()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.node if backend() == "local" else pytest.mark.e2e)
            # The local backend shares the worker (and so the control plane and node) of the cluster and node tests.
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
def kind_run(request: pytest.FixtureRequest) -> Iterator[kind_backend.KindRun]:
    """README's kind quickstart up to the chart's install, on a cluster of its own; its logs kept (path printed)
    when a test failed, the cluster deleted afterwards (unless E2E_KEEP_CLUSTER=1)."""
    if backend() != "kind":
        pytest.skip("README's kind quickstart runs on the kind backend (E2E_BACKEND=kind)")
    # A directory of its own, not pytest's (whose old numbered directories other pytest runs remove): the podman
    # wrapper and containers.conf must outlive the cluster; the logs of a failed run stay there.
    with kind_backend.kind_cluster(Path(tempfile.mkdtemp(prefix="dradriver-kind-"))) as kind:
        failed_before = request.session.testsfailed
        yield kind
        if request.session.testsfailed > failed_before:
            print(f"kind e2e: logs of cluster {kind.name} in {kind.collect_logs()}")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if backend() == "local":
        yield LocalCluster(request.getfixturevalue("node"))
        return
    kind: kind_backend.KindRun = request.getfixturevalue("kind_run")
    yield kind.cluster()
