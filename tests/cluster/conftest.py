"""Session fixtures of the `cluster` tests: one real control plane, three simulated GPU nodes served by
`dradriver run`, the DeviceClasses applied with kubectl. See docs/cluster-tests.md."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster_node import SimNode
from support.cluster_pods import kubectl
from support.control_plane import BUILD_SCRIPT, ControlPlane, binaries_dir, missing_binaries
from support.kube_rest import Kube

REPO = Path(__file__).resolve().parents[2]
# CI sets this: there a missing control plane is a failure, not a skip.
REQUIRE = "DRADRIVER_REQUIRE_CLUSTER"
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
def control_plane() -> Iterator[ControlPlane]:
    directory = binaries_dir()
    missing = missing_binaries(directory)
    if missing:
        message = (
            f"the cluster tests need the real control plane: {', '.join(missing)} missing from {directory}; "
            f"build it with `{BUILD_SCRIPT.relative_to(REPO)}` (Go >= 1.26 and the Go module proxy; a cold build "
            "takes a while, see docs/cluster-tests.md; `scripts/test` does it)"
        )
        if os.environ.get(REQUIRE):
            pytest.fail(message)
        pytest.skip(message)
    root = Path(tempfile.mkdtemp(prefix="dra-cp-", dir="/tmp"))  # short: unix socket paths are limited
    plane = ControlPlane(directory, root)
    try:
        plane.start()
    except Exception:
        plane.stop()
        raise
    failed_before = _failures()
    yield plane
    plane.stop()
    if _failures() > failed_before:
        sys.stderr.write(f"\ncluster tests failed: control-plane and driver logs kept in {root}\n")
        plane.discard()
    else:
        shutil.rmtree(root, ignore_errors=True)


_FAILURES: list[int] = [0]


def _failures() -> int:
    return _FAILURES[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        _FAILURES[0] += 1


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.kube


@pytest.fixture(scope="session")
def device_classes(control_plane: ControlPlane) -> None:
    subprocess.run(
        [kubectl(), "--kubeconfig", str(control_plane.kubeconfig), "apply", "--server-side", "-f",
         str(REPO / "manifests" / "deviceclasses")],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


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
