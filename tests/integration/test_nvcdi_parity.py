"""Our CDI specs judged by NVIDIA's own generator: what NVIDIA's spec gives a container, ours gives too.

For every driver layout of ``support.driver_layouts`` (Debian, runfile, RHEL, GPU Operator, GKE, the
``/usr/local/nvidia`` node, and a full 580 file set), with the node's host files of ``support.gpu_host`` (device
nodes made with mknod, ``/proc`` and ``/sys`` stand-ins built from the simulated node, MIG devices included), this
runs NVIDIA's generator (``scripts/build-nvcdi``: the container toolkit's ``pkg/nvcdi`` on go-nvml's mock devices)
and ours on the same root, and compares what a container given one device gets from each: a whole GPU and every
MIG device.

Files are compared by the real file in the root (a library, binary, firmware file, config file or IPC socket),
never by container path: ours puts libraries where a plain image's loader looks, NVIDIA's at their host path, on
purpose (docs/cdi.md). Links made by ``create-symlinks`` are compared by their name in a library directory, device
nodes by their path under ``/dev``, hooks by their subcommand. The test fails on anything NVIDIA gives that we do not
(except what docs/cdi.md says we decline, ``DECLINED`` below), and on anything we give that NVIDIA does not unless
``DELIBERATE`` explains it (the same table as docs/cdi.md's); it prints both lists (``-rP`` shows them).

Needs root (mknod, the generator's private mount namespace), cc, ldconfig, and the builds of scripts/build-nvcdi and
scripts/build-cdi-hook (Go); without them it skips, and under DRADRIVER_REQUIRE_ALL (scripts/test) it fails.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from support import required
from support.driver_layouts import LAYOUTS, VERSION, Layout, build_layout, build_stubs, need_layout_tools
from support.gpu_host import GpuHost, build_gpu_host, need_mknod
from support.nodes import inventory_of
from support.short_dirs import short_dir

from dradriver.gpu.caps import ProcMigCapabilities
from dradriver.gpu.inventory import GpuDevice, MigPartition
from dradriver.gpu.models import DeviceNode
from dradriver.nvidia_install.cdi import CdiWriter, ClaimSpec, cdi_device
from dradriver.nvidia_install.device_nodes import gpu_device_nodes
from dradriver.nvidia_install.driver_root import DriverRoot, discover_driver_root
from dradriver.nvidia_install.root_paths import resolve

REPO = Path(__file__).resolve().parents[2]
INVENTORY = inventory_of("mixed")  # six GPUs; GPU 0 holds three MIG devices
WHOLE_GPU = "gpu-0000-0f-00-0"
CLAIM = "parity"

#: What NVIDIA's spec has and ours leaves out on purpose (docs/cdi.md, "Compared with NVIDIA's generator").
DECLINED = {
    "hook apply-cuda-memory-limits": "needs nvmlDeviceSetMemoryLimits_v1 (R615 drivers on) and cgroup v2; the "
    "container's own NVIDIA_GPU_MEMORY_* variables set the limit, not the claim",
}
#: What ours has and NVIDIA's does not, by pattern on the item, each with its reason (docs/cdi.md's table).
DELIBERATE = {
    r"^link lib:.*\.so\.\d+$": "soname links: a plain image without ldconfig must find libcuda.so.1 and the others "
    "(NVIDIA relies on update-ldcache's ldconfig where the host keeps them in another directory)",
    r"^link lib:.*\.so$": "the development links the host has for each library (NVIDIA only where they sit beside "
    "the versioned file)",
    r"^binary .*/bin/nvidia-[a-z-]+$": "binaries beside the library tree (/usr/local/nvidia/bin, GKE's bin): NVIDIA "
    "looks only in PATH's directories",
    r"^firmware (?!lib/firmware/).*/nvidia/[0-9.]+/gsp[^/]*\.bin$": "GSP firmware beside the library tree (GKE's "
    "firmware/): NVIDIA looks only in /lib/firmware",
}


@dataclass
class Given:
    """What a container given one device gets from a spec, keyed by the real thing."""

    files: dict[str, set[str]] = field(default_factory=dict)  # "<kind> <root-relative file>" → container paths
    links: set[str] = field(default_factory=set)  # "link lib:<name in a library directory>" or "link <path>"
    nodes: set[str] = field(default_factory=set)  # "node /dev/…"
    hooks: set[str] = field(default_factory=set)  # "hook <subcommand>" (create-symlinks: links)
    env: set[str] = field(default_factory=set)

    def items(self) -> set[str]:
        return set(self.files) | self.links | self.nodes | self.hooks


@dataclass(frozen=True)
class World:
    base: Path
    host: GpuHost
    layouts: dict[str, Layout]
    nvcdi: Path
    hook: Path
    node_file: Path


def built(script: str, what: str) -> Path:
    """What ``scripts/<script> --print`` names, if it was built (by scripts/test, not here); else need it."""
    done = subprocess.run(
        [str(REPO / "scripts" / script), "--print"], capture_output=True, text=True, timeout=60, check=False
    )
    path = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    if path is None or not path.is_file():
        required.need(what, "the comparison runs NVIDIA's generator and names NVIDIA's real hook",
                      f"run scripts/{script} (Go and the module proxy; `scripts/test` does)")  # fmt: skip
    return path


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    need_layout_tools()
    need_mknod()
    nvcdi, hook = built("build-nvcdi", "NVIDIA's CDI generator"), built("build-cdi-hook", "nvidia-cdi-hook")
    with short_dir("dra-nvcdi-") as base:
        stubs = build_stubs(base / "stubs", VERSION)
        layouts = {name: build_layout(name, base / "roots", stubs) for name in LAYOUTS}
        node_file = base / "node.json"
        node_file.write_text(json.dumps(mock_node()))
        yield World(base, build_gpu_host(base / "node", INVENTORY), layouts, nvcdi, hook, node_file)


def mock_node() -> dict[str, Any]:
    """The simulated node as NVML would describe it to NVIDIA's generator (tools/nvcdi's node file)."""
    migs: dict[str, list[dict[str, Any]]] = {}
    for partition in INVENTORY.mig_devices:
        mig = partition.existing
        assert mig is not None
        slices = int(partition.profile.name.split("g.", 1)[0].split(".")[-1])
        entry = {"uuid": mig.uuid, "gi": mig.gpu_instance_id, "ci": mig.compute_instance_id, "slices": slices}
        migs.setdefault(partition.parent.uuid, []).append(entry)
    gpus = [
        {"uuid": g.uuid, "minor": g.info.minor, "pciBusId": f"0000{g.info.pci_bus_id}", "migs": migs.get(g.uuid, [])}
        for g in INVENTORY.gpus
    ]
    return {"driverVersion": VERSION, "gpus": gpus}


def nvidia_spec(world: World, layout: Layout) -> dict[str, Any]:
    """NVIDIA's spec for every device, with the host fixture's /proc/driver and /sys/bus/pci/devices bound on the
    paths the toolkit reads (in the generator's private mount namespace)."""
    command = [
        str(world.nvcdi),
        f"-node={world.node_file}",
        f"-driver-root={layout.driver_root}",
        f"-dev-root={world.host.dev_root}",
        f"-hook={world.hook}",
        f"-bind={world.host.proc / 'driver'}:/proc/driver",
        f"-bind={world.host.sys / 'bus/pci/devices'}:/sys/bus/pci/devices",
    ]
    # A fixed PATH (the toolkit looks for binaries in it, under the root) and no XDG_DATA_DIRS (its config search).
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    spec: dict[str, Any] = json.loads(done.stdout)
    return spec


def our_spec(world: World, root: DriverRoot) -> dict[str, Any]:
    """Our spec for the whole GPU and every MIG device, its device nodes as prepare finds them on this host."""
    host = world.host
    devices = [cdi_device(gpu, gpu_device_nodes(gpu.info, sys_root=host.sys, dev_root=host.dev)) for gpu in gpus()]
    capabilities = ProcMigCapabilities(host.proc)
    for partition in INVENTORY.mig_devices:
        mig = partition.existing
        assert mig is not None
        minor = partition.parent.info.minor
        nodes = capabilities.device_nodes(minor, mig.gpu_instance_id, mig.compute_instance_id)
        devices.append(cdi_device(partition, (DeviceNode(f"/dev/nvidia{minor}"), *nodes)))
    writer = CdiWriter(
        world.base / "cdi",
        node_exists=lambda path: (host.dev_root / path.lstrip("/")).exists(),
        driver_root=root,
    )
    return writer.render(ClaimSpec(CLAIM, tuple(devices)))


def gpus() -> list[GpuDevice]:
    return [gpu for gpu in INVENTORY.gpus if gpu.name == WHOLE_GPU]


def compared_devices() -> list[GpuDevice | MigPartition]:
    return [*gpus(), *INVENTORY.mig_devices]


# --- reading a spec --------------------------------------------------------------------------------------------


def given(spec: dict[str, Any], device_name: str, *, driver_root: Path, dev_root: Path) -> Given:
    """What a container given ``device_name`` gets from ``spec``: the spec-wide edits and the device's."""
    [device] = [d for d in spec["devices"] if d["name"] == device_name]
    edits = [spec.get("containerEdits") or {}, device["containerEdits"]]
    result = Given()
    for edit in edits:
        for mount in edit.get("mounts", []):
            key = file_key(mount["hostPath"], mount["containerPath"], driver_root)
            result.files.setdefault(key, set()).add(mount["containerPath"])
        for node in edit.get("deviceNodes", []):
            result.nodes.add(f"node {under_dev(node.get('hostPath') or node['path'], dev_root)}")
        result.env |= set(edit.get("env", []))
    library_dirs = {
        str(PurePosixPath(path).parent)
        for key, paths in result.files.items()
        if key.startswith("library ")
        for path in paths
    }
    for edit in edits:
        for hook in edit.get("hooks", []):
            args = hook["args"][2:] if hook["args"][:2] == ["nvidia-ctk", "hook"] else hook["args"][1:]
            if args[0] != "create-symlinks":
                result.hooks.add(f"hook {args[0]}")
                continue
            for target_link in args[2::2]:
                result.links.add(link_key(under_dev(target_link.split("::", 1)[1], dev_root), library_dirs))
    return result


def under_dev(path: str, dev_root: Path) -> str:
    """A host path in the dev root as the container sees it (``<dev root>/dev/nvidia0`` → ``/dev/nvidia0``)."""
    pure = PurePosixPath(path)
    return str(PurePosixPath("/") / pure.relative_to(dev_root)) if pure.is_relative_to(dev_root) else path


def file_key(host_path: str, container_path: str, driver_root: Path) -> str:
    """``<kind> <root-relative real file>``; a file from outside the root is named with its container path."""
    path = PurePosixPath(host_path)
    if not path.is_relative_to(driver_root):
        return f"mount {host_path} at {container_path}"
    real = resolve(driver_root, path.relative_to(driver_root))
    if real is None:
        return f"missing {host_path}"
    return f"{file_kind(driver_root / real)} {real}"


def file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    if stat.S_ISSOCK(mode):
        return "socket"
    if "firmware" in path.parts:
        return "firmware"
    if re.search(r"\.so(\.|$)", path.name) or path.parent.name in ("drivers", "extensions"):
        return "library"
    if mode & 0o111:
        return "binary"
    return "config"


def link_key(link: str, library_dirs: set[str]) -> str:
    """A link by its name in the deepest library directory holding it (``lib:libcuda.so.1``,
    ``lib:gbm/nvidia-drm_gbm.so``), else by its path."""
    holders = [d for d in library_dirs if link.startswith(d + "/")]
    if not holders:
        return f"link {link}"
    return f"link lib:{link[len(max(holders, key=len)) + 1 :]}"


def reason(item: str) -> str | None:
    return next((why for pattern, why in DELIBERATE.items() if re.search(pattern, item)), None)


# --- the comparison --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_every_file_nvidia_mounts_we_mount(world: World, layout_name: str) -> None:
    layout = world.layouts[layout_name]
    root = discover_driver_root(host_root=str(layout.driver_root), version=VERSION, cdi_hook=str(world.hook))
    theirs, ours = nvidia_spec(world, layout), our_spec(world, root)
    missing: dict[str, list[str]] = {}
    extra: dict[str, list[str]] = {}
    env: set[str] = set()
    for device in compared_devices():
        assert device.uuid is not None
        nvidia = given(theirs, device.uuid, driver_root=layout.driver_root, dev_root=world.host.dev_root)
        mine = given(ours, f"{CLAIM}-{device.name}", driver_root=layout.driver_root, dev_root=world.host.dev_root)
        for item in sorted(nvidia.items() - mine.items()):
            missing.setdefault(item, []).append(device.name)
        for item in sorted(mine.items() - nvidia.items()):
            extra.setdefault(item, []).append(device.name)
        env |= {v.split("=", 1)[0] for v in nvidia.env} - {v.split("=", 1)[0] for v in mine.env}
    report(layout_name, missing, extra)
    # Reported, not compared: variables are no files (docs/cdi.md says why NVIDIA_CTK_LIBCUDA_DIR is left out).
    print(f"== {layout_name}: variables NVIDIA's spec sets and ours does not: {', '.join(sorted(env)) or '-'}")
    assert not [item for item in missing if item not in DECLINED], f"NVIDIA gives, we do not: {sorted(missing)}"
    assert not [item for item in extra if reason(item) is None], "we give, NVIDIA does not, and no reason says why"


def report(layout: str, missing: dict[str, list[str]], extra: dict[str, list[str]]) -> None:
    every = len(compared_devices())

    def which(devices: list[str]) -> str:
        return "every device" if len(devices) == every else ", ".join(devices)

    print(f"\n== {layout}: NVIDIA's spec gives and ours does not ({len(missing)})")
    for item, devices in missing.items():
        print(f"  {item}  [{which(devices)}]  {DECLINED.get(item, 'MISSING')}")
    print(f"== {layout}: ours gives and NVIDIA's does not ({len(extra)})")
    for item, devices in extra.items():
        print(f"  {item}  [{which(devices)}]  {reason(item) or 'UNEXPLAINED'}")
