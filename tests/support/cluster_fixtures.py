"""Session fixtures shared by the `cluster` tests, the `node` tests and the e2e suite's local backend: one real
control plane per test process (``control_plane``), the DeviceClasses, and one real node (``node``) on top.
Registered for the whole tree by the repository's root conftest.py. See docs/cluster-tests.md and
docs/node-tests.md."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support import real_node, required
from support.cluster_pods import kubectl
from support.control_plane import BUILD_SCRIPT, ControlPlane, binaries_dir, missing_binaries
from support.kube_rest import Kube

REPO = Path(__file__).resolve().parents[2]

_FAILURES: list[int] = [0]


def failures() -> int:
    """Tests failed so far in this process (logs are kept when a session fixture's tests failed)."""
    return _FAILURES[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        _FAILURES[0] += 1


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    directory = binaries_dir()
    missing = missing_binaries(directory)
    if missing:
        required.need(
            "the real control plane",
            f"the cluster tests run against it; {', '.join(missing)} not in {directory}",
            f"build it with `{BUILD_SCRIPT.relative_to(REPO)}` (Go >= 1.26 and the Go module proxy; a cold build "
            "takes a while, see docs/cluster-tests.md; `scripts/test` does it)",
            tier=required.CLUSTER,
        )
    root = Path(tempfile.mkdtemp(prefix="dra-cp-", dir="/tmp"))  # short: unix socket paths are limited
    yield from running_plane(ControlPlane(directory, root), ControlPlane.start, "cluster tests")


def own_plane(*, needed_by: str, prefix: str, who: str) -> Iterator[ControlPlane]:
    """For a module's fixture: a control plane of the module's own in a new /tmp directory named ``prefix``, run as
    ``running_plane`` runs it for ``who``; without its binaries the tests are skipped or failed, naming
    ``needed_by`` as what runs against it."""
    directory = binaries_dir()
    missing = missing_binaries(directory)
    if missing:
        required.need(
            "the real control plane",
            f"{needed_by} runs against it; {', '.join(missing)} not in {directory}",
            f"build it with `{BUILD_SCRIPT.relative_to(REPO)}` (docs/cluster-tests.md)",
            tier=required.CLUSTER,
        )
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: unix socket paths are limited
    yield from running_plane(ControlPlane(directory, root), ControlPlane.start, who)


def running_plane(plane: ControlPlane, start: Callable[[ControlPlane], None], who: str) -> Iterator[ControlPlane]:
    """``plane`` started with ``start`` for the body of a fixture, stopped after it; its directory removed, or
    kept with its logs (and said where) when a test failed meanwhile."""
    try:
        start(plane)
    except Exception:
        plane.stop()
        raise
    failed_before = failures()
    yield plane
    plane.stop()
    if failures() > failed_before:
        sys.stderr.write(f"\n{who} failed: control-plane and driver logs kept in {plane.root}\n")
        plane.discard()
    else:
        shutil.rmtree(plane.root, ignore_errors=True)


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


@contextmanager
def running_node(control_plane: ControlPlane, **settings: Any) -> Iterator[real_node.RealNode]:
    """A real kubelet and containerd registered with ``control_plane`` and `dradriver run` registered with that
    kubelet (``settings``: RealNode's fields, such as name, profile, driver_args); stopped again on exit, its logs
    kept when a test failed meanwhile."""
    directory = real_node.binaries_dir()
    missing = real_node.missing(directory)
    if missing:
        required.need(
            "a real kubelet and containerd",
            f"the node tests run pods on them; missing {', '.join(missing)}",
            f"build them with `{real_node.BUILD_SCRIPT.relative_to(REPO)}` and install Debian's runc, busybox-static "
            "and containernetworking-plugins (see docs/node-tests.md; `scripts/test` does both)",
            tier=required.NODE,
        )
    root = Path(tempfile.mkdtemp(prefix="dra-n-", dir="/tmp"))  # short: the plugin sockets live below it
    started = real_node.RealNode(directory, root, control_plane, **settings)
    try:
        started.start()
    except Exception as exc:
        tails = started.tails()
        started.stop()
        raise RuntimeError(f"the real node did not start ({exc}); logs in {started.logs}:\n{tails}") from exc
    failed_before = failures()
    try:
        yield started
    finally:
        if failures() > failed_before:
            sys.stderr.write(f"\nnode tests failed: kubelet, containerd and driver logs kept in {started.logs}\n"
                             f"{started.tails(20)}\n")  # fmt: skip
        started.stop()
        if failures() > failed_before:
            started.discard()
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def node(control_plane: ControlPlane, device_classes: None) -> Iterator[real_node.RealNode]:
    """A real kubelet and containerd registered with ``control_plane`` as Node localhost, and `dradriver run`
    (simulated mixed GPUs, dynamic MIG) registered with that kubelet."""
    with running_node(control_plane) as started:
        yield started
