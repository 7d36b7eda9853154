"""Every driver install layout gives a container that runs CUDA, from our CDI spec alone.

For each layout of ``support.driver_layouts`` (real ELF stubs with the driver's sonames, the root's linker cache
made by the real ``ldconfig``), with NVIDIA's real ``nvidia-cdi-hook`` and without any hook: discover the driver
root as ``dradriver run`` does, prepare a claim on the simulated node (its spec written as NodePrepareResources
writes it), and run a bare image (glibc and one program, nothing else)
with podman. The program ``dlopen``s ``libcuda.so.1`` and ``libnvidia-ml.so.1`` by soname, calls a function of
each, then runs ``nvidia-smi -L`` from PATH — for a Debian-family loader and a RHEL-family one.

Needs root, podman, runc, cc and ldconfig; the hook cases need ``scripts/build-cdi-hook`` (Go) and the RHEL
family ``scripts/build-biarch-glibc`` (apt-get). Without them the cases skip; ``scripts/test`` (what ``.ci/run``
runs) builds both and demands them, so there a missing one fails (support/required.py).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from support import required
from support.bare_container import FAMILIES, PROBE, Podman, biarch_glibc, make_rootfs, podman_missing
from support.driver_layouts import LAYOUTS, Layout, Stubs, build_layout, build_stubs, need_layout_tools
from support.nodes import inventory_of
from support.short_dirs import short_dir

from dradriver.cli.flags.driver_root import DriverRootOptions
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.driver_root import DriverRoot, discover_driver_root
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import allocated_claim

REPO = Path(__file__).resolve().parents[2]
INVENTORY = inventory_of("mixed")
VERSION = INVENTORY.driver_version  # the simulated node's driver: the layouts are built for it
DRIVER = "gpu.dradriver.dev"
GPU = "gpu-0000-0f-00-0"


def built_hook() -> Path | None:
    """What scripts/build-cdi-hook built, if it did (built by scripts/test, not here)."""
    done = subprocess.run(
        [str(REPO / "scripts/build-cdi-hook"), "--print"], capture_output=True, text=True, timeout=60, check=False
    )
    path = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    return path if path is not None and path.is_file() else None


def need_hook(hook: Path | None) -> Path:
    if hook is None:
        required.need("nvidia-cdi-hook", "the hook cases run NVIDIA's real hook",
                      "run scripts/build-cdi-hook (Go and the module proxy; `scripts/test` does)")  # fmt: skip
    return hook


def need_rhel_glibc() -> None:
    if biarch_glibc() is None:
        required.need("a RHEL-family glibc", "the RHEL-family cases run its loader",
                      "run scripts/build-biarch-glibc (apt-get; `scripts/test` does)")  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[Path]:
    required.need_tools(podman_missing(), "bare containers run the driver layouts",
                        "apt-get install podman runc util-linux and run as root (`scripts/test` does)")  # fmt: skip
    need_layout_tools()
    with short_dir("dra-layouts-") as base:
        yield base


@pytest.fixture(scope="module")
def stubs(world: Path) -> Stubs:
    return build_stubs(world / "stubs", VERSION)


@pytest.fixture(scope="module")
def hook() -> Path | None:
    return built_hook()


@pytest.fixture(scope="module")
def layouts(world: Path, stubs: Stubs, hook: Path | None) -> dict[str, Layout]:
    return {name: build_layout(name, world / "roots", stubs, hook=hook) for name in LAYOUTS}


@pytest.fixture(scope="module")
def podman(world: Path, stubs: Stubs) -> Podman:
    runner = Podman(world / "podman")
    for family in FAMILIES:
        if family == "rhel" and biarch_glibc() is None:
            continue
        runner.import_rootfs(make_rootfs(world / f"rootfs-{family}", family, stubs.dir / "bin/probe"), family)
    probe = runner.run("debian", [], PROBE)
    if "FAIL libcuda" not in probe.stdout:
        required.need("a podman that runs bare containers", probe.stderr.strip()[-300:],
                      "podman with runc, as root (see the module docstring)")  # fmt: skip
    return runner


def prepare(podman: Podman, root: DriverRoot, uid: str) -> list[str]:
    """Prepare a claim for one whole GPU on the simulated node, as NodePrepareResources does; its CDI ids."""
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC),
        inventory=INVENTORY,
        cdi=CdiWriter(podman.cdi_dir, host_path=lambda _path: "/dev/null", driver_root=root),
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": GPU}
    claim = {
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    prepared = driver.prepare_resource_claims([allocated_claim(claim, ClaimRef("default", uid, uid), DRIVER)])[uid]
    assert prepared.error is None
    return [cdi_id for device in prepared.devices for cdi_id in device.cdi_device_ids]


def layout_root(layout: Layout, hook: Path | None) -> DriverRoot:
    hook_path: str | None = None
    if hook is not None:
        # The GPU Operator's toolkit keeps the hook in its own host directory; elsewhere the plugin ships it.
        hook_path = str(layout.hook_dir / "nvidia-cdi-hook") if layout.hook_dir else str(hook)
    return discover_driver_root(host_root=str(layout.driver_root), version=VERSION, cdi_hook=hook_path)


CASES = [(layout, hook, family) for layout in LAYOUTS for hook in (True, False) for family in FAMILIES]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{layout}-{'hook' if hook else 'no-hook'}-{family}" for layout, hook, family in CASES]
)
def test_a_bare_container_runs_cuda_and_nvidia_smi_on_every_layout(
    podman: Podman, layouts: dict[str, Layout], hook: Path | None, case: tuple[str, bool, str]
) -> None:
    layout_name, with_hook, family = case
    if with_hook:
        need_hook(hook)
    if family == "rhel":
        need_rhel_glibc()
    root = layout_root(layouts[layout_name], hook if with_hook else None)
    ids = prepare(podman, root, f"{layout_name}-{with_hook:d}-{family}")
    done = podman.run(family, ids, PROBE)
    assert done.returncode == 0, f"stdout: {done.stdout}\nstderr: {done.stderr[-1500:]}"
    assert f"OK cuda=13000 driver={VERSION}" in done.stdout
    assert f"GPU 0: NVIDIA H100 80GB HBM3 (stub driver {VERSION})" in done.stdout


def test_a_simulated_node_with_driver_root_slash_finds_the_h100_layout_through_run_s_wiring(
    podman: Podman, layouts: dict[str, Layout], hook: Path | None
) -> None:
    # `--driver-root /` with the layout mounted as the plugin's --container-driver-root, on the simulated backend.
    layout = layouts["h100"]
    options = DriverRootOptions(
        driver_root="/",
        container_driver_root=str(layout.root),
        nvidia_cdi_hook_path=str(hook) if hook else "none",
        cdi_hook_source="none",
    )
    root = options.discover(VERSION, simulated=True, plugin_dir=podman.base / "plugin")
    assert root.host_path(root.libcuda) == f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"
    # The layout stands for the host's /: the runtime here must bind its files where this machine has them.
    ids = prepare(podman, replace(root, host_root=PurePosixPath(layout.root)), "sim-h100-root")
    for family in ("debian", "rhel") if biarch_glibc() else ("debian",):
        done = podman.run(family, ids, PROBE)
        assert done.returncode == 0, f"{family}: {done.stdout}\n{done.stderr[-1500:]}"
        assert f"OK cuda=13000 driver={VERSION}" in done.stdout


def test_the_built_hook_says_its_version(hook: Path | None) -> None:
    # The stamp NVIDIA's release builds carry: logs and bug reports name the hook's version.
    built = need_hook(hook)
    pinned = re.search(r"^version=v(\S+)$", (REPO / "scripts/build-cdi-hook").read_text(), re.M)
    assert pinned
    done = subprocess.run([str(built), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert f"version {pinned[1]}" in done.stdout, done.stdout
