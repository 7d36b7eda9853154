"""CDI specs: one transient spec file per prepared claim, which the container runtime reads to inject GPUs.

Each claim gets ``<cdi-dir>/k8s.gpu.dradriver.dev-claim_<claim-uid>.json`` with one CDI device per allocated
device, named ``<claim-uid>-<device>`` so an id is never reused by another claim. Files are written atomically
(temp file + rename) because runtimes watch the directory and may read at any moment.

What a spec holds (see docs/cdi.md):

- spec-wide edits, applied once to a container that gets any device of the claim: the driver root's libraries,
  firmware, binaries and loader files mounted read-only where a plain image finds them, the control device nodes,
  NVIDIA's hooks (``create-symlinks``, ``enable-cuda-compat``, ``disable-device-node-modification``,
  ``update-ldcache``, ``update-application-profile`` where the hook has it) where a ``nvidia-cdi-hook`` is
  available, ``NVIDIA_VISIBLE_DEVICES=void`` and NVIDIA's void volume mount;
- per-device edits, applied only to containers given that device: its device nodes (a MIG device: the parent's
  ``/dev/nvidia<minor>`` and its capability nodes; a GPU's DRI nodes with their ``/dev/dri/by-path`` links) and its
  own environment variable, so each container of a pod sees only the devices of the requests it names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.atomic_files import storage_fix
from dradriver.errors import DeviceError
from dradriver.gpu.inventory import GpuDevice, MigPartition
from dradriver.gpu.models import DeviceNode
from dradriver.nvidia_install.cdi_hook import hook_at_least
from dradriver.nvidia_install.device_nodes import dri_by_path_links
from dradriver.nvidia_install.driver_root import DriverRoot

CDI_VENDOR = "k8s.gpu.dradriver.dev"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"

# Marks a device given with admin access (monitoring): the container may see it, and it stays shareable.
ADMIN_ACCESS_ENV = "DRA_ADMIN_ACCESS=true"

# NVIDIA's container runtime in legacy mode injects the GPUs this variable names (CUDA images set it to "all"):
# "void" means none, so only the devices our spec gives reach the container. NVIDIA's own specs do the same.
NVIDIA_VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"
# NVIDIA's runtime, with its volume-mounts device list strategy, reads the devices to inject from mounts under this
# directory: a "void" entry means none, as the variable above (NVIDIA's specs add it too).
VOID_DEVICE_LIST_MOUNT = {
    "hostPath": "/dev/null",
    "containerPath": "/var/run/nvidia-container-devices/void",
    "options": ["ro", "nosuid", "nodev", "bind"],
}
# The first hook release with update-application-profile.
APPLICATION_PROFILE_HOOK = (1, 20, 0)
# Each device names itself in DRADRIVER_DEVICE_<NAME>=<UUID>: a key per device, because env edits of two
# devices with one key would overwrite each other in a container that gets both.
DEVICE_ENV_PREFIX = "DRADRIVER_DEVICE_"

# Device nodes every CUDA container needs besides its GPUs (the control nodes).
COMMON_DEVICE_NODES = tuple(
    DeviceNode(path) for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
)
# Mount options NVIDIA's toolkit uses for driver files, and for the daemons' sockets.
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
SOCKET_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")

_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CdiDevice:
    """What one allocated device adds to a container."""

    name: str  # the device's name in the pool, e.g. gpu-0000-07-00-0
    device_nodes: tuple[DeviceNode, ...]  # e.g. /dev/nvidia0; MIG devices add their /dev/nvidia-caps nodes
    env: tuple[str, ...] = ()  # "KEY=VALUE"
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path): e.g. a claim's MPS pipe directory
    links: tuple[tuple[str, str], ...] = ()  # (target, link) the hook makes: its DRI nodes' /dev/dri/by-path links


def device_env_name(device_name: str) -> str:
    """``gpu-0000-07-00-0`` → ``DRADRIVER_DEVICE_GPU_0000_07_00_0``."""
    return DEVICE_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", device_name.upper())


def cdi_device(
    device: GpuDevice | MigPartition, device_nodes: Sequence[DeviceNode], *, admin_access: bool = False
) -> CdiDevice:
    """The per-device edits of one resolved GPU or MIG device: its nodes, its DRI nodes' links and its own
    environment."""
    env = [f"{device_env_name(device.name)}={device.uuid}"] if device.uuid else []
    if admin_access:
        env.append(ADMIN_ACCESS_ENV)
    pci_bus_id = device.info.pci_bus_id if isinstance(device, GpuDevice) else device.parent.info.pci_bus_id
    links = dri_by_path_links(pci_bus_id, list(device_nodes))
    return CdiDevice(name=device.name, device_nodes=tuple(device_nodes), env=tuple(env), links=links)


@dataclass(frozen=True)
class ClaimSpec:
    claim_uid: str
    devices: tuple[CdiDevice, ...]
    env: tuple[str, ...] = field(default=())  # spec-wide, added after NVIDIA_VISIBLE_DEVICES=void


class CdiWriter:
    """Writes and removes the per-claim CDI spec files in ``cdi_dir``.

    ``host_path`` maps a device node's container path to the host path to bind (None: the same path). A simulated
    node maps every GPU node to ``/dev/null`` so that a real runtime can still inject the spec. ``node_exists``
    tells whether a host node is there: the common nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm*``) are left out
    when missing (the uvm module loads on first use), since the runtime fails a container over a missing node.
    ``driver_root``, when given, adds the driver's files (mounts and hooks) to every spec.
    """

    def __init__(
        self,
        cdi_dir: Path,
        *,
        host_path: Callable[[str], str | None] = lambda _path: None,
        node_exists: Callable[[str], bool] = os.path.exists,
        driver_root: DriverRoot | None = None,
    ) -> None:
        self.cdi_dir = cdi_dir
        self._host_path = host_path
        self._node_exists = node_exists
        self.driver_root = driver_root

    def spec_path(self, claim_uid: str) -> Path:
        # The CDI library's transient spec name: vendor-class_<id>, with '/' in the id replaced by '_'.
        return self.cdi_dir / f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid.replace('/', '_')}.json"

    @staticmethod
    def device_id(claim_uid: str, device_name: str) -> str:
        """The fully qualified CDI id the kubelet hands to the runtime."""
        return f"{CDI_KIND}={claim_uid}-{device_name}"

    def write(self, claim: ClaimSpec) -> list[str]:
        """Write the claim's spec (replacing any earlier one) and return its CDI ids, one per device."""
        spec = self.render(claim)
        path = self.spec_path(claim.claim_uid)
        tmp: str | None = None
        try:
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cdi_dir, prefix=f".{path.stem}.", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                # One line, so json's C encoder writes it (an indent falls back to the pure-Python encoder, which
                # took the whole-GPU prepare from ~1.2x to ~1.5x its floor); `jq . <spec>` shows it indented.
                out.write(json.dumps(spec))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except OSError as err:
            if tmp is not None:
                # Every kubelet retry would otherwise leave one more temp file in the CDI directory.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise DeviceError(
                f"unable to write CDI spec {path} for claim {claim.claim_uid}: {err}; {storage_fix(err, '--cdi-dir')}"
            ) from err
        return [self.device_id(claim.claim_uid, device.name) for device in claim.devices]

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's spec; a missing file is fine (unprepare must be idempotent)."""
        try:
            self.spec_path(claim_uid).unlink(missing_ok=True)
        except ValueError:
            return  # a UID with a NUL byte names no file: there is none to remove
        except OSError as err:
            raise DeviceError(
                f"unable to remove CDI spec {self.spec_path(claim_uid)}: {err}; {storage_fix(err, '--cdi-dir')}"
            ) from err

    def remove_temp_files(self) -> list[str]:
        """Delete our temp files a crash left mid-write (never another driver's): start-up calls it."""
        if not self.cdi_dir.is_dir():
            return []
        removed = []
        for path in self.cdi_dir.glob(f".{CDI_VENDOR}-{CDI_CLASS}_*.tmp"):
            if path.is_dir() and not path.is_symlink():
                continue  # not a file we wrote: never ours to remove
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as err:
                log.error("cannot remove a CDI temp file a crash left file=%s error=%s", path, err)
                continue
            removed.append(path.name)
        return removed

    def claim_uids(self) -> list[str]:
        """Claims that have a spec file here (start-up removes those the checkpoint does not know)."""
        prefix = f"{CDI_VENDOR}-{CDI_CLASS}_"
        if not self.cdi_dir.is_dir():
            return []
        return sorted(
            p.name.removeprefix(prefix).removesuffix(".json")
            for p in self.cdi_dir.glob(f"{prefix}*.json")
            if p.is_symlink() or not p.is_dir()  # a directory under such a name is no spec of ours
        )

    def render(self, claim: ClaimSpec) -> dict[str, Any]:
        """The spec document, with the lowest ``cdiVersion`` that supports what it uses."""
        if not claim.devices:
            raise DeviceError(f"claim {claim.claim_uid} has no devices for this driver; a CDI spec needs at least one")
        devices = []
        for device in claim.devices:
            name = f"{claim.claim_uid}-{device.name}"
            if not _CDI_NAME.fullmatch(name):
                raise DeviceError(
                    f"CDI device name {name!r} of claim {claim.claim_uid} is not valid: use letters, "
                    "digits and '-_.:' only"
                )
            edits: dict[str, Any] = {"deviceNodes": [self._node(node) for node in device.device_nodes]}
            if device.env:
                edits["env"] = list(device.env)
            if device.links and self.driver_root is not None and self.driver_root.cdi_hook:
                edits["hooks"] = [hook(self.driver_root.cdi_hook, "create-symlinks", *link_args(device.links))]
            if device.mounts:
                edits["mounts"] = [
                    {
                        "hostPath": host,
                        "containerPath": inside,
                        "options": ["rw", "nosuid", "nodev", "noexec", "rbind", "rprivate"],
                    }
                    for host, inside in device.mounts
                ]
            devices.append({"name": name, "containerEdits": edits})
        present = [node for node in COMMON_DEVICE_NODES if self._node_exists(self._host_path(node.path) or node.path)]
        common: dict[str, Any] = {
            "env": [NVIDIA_VISIBLE_DEVICES_VOID, *claim.env],
            "deviceNodes": [self._node(node) for node in present],
        }
        if self.driver_root is not None:
            common.update(driver_root_edits(self.driver_root))
        common["mounts"] = [*common.get("mounts", []), dict(VOID_DEVICE_LIST_MOUNT)]
        spec: dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": devices, "containerEdits": common}
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec

    def _node(self, node: DeviceNode) -> dict[str, Any]:
        rendered: dict[str, Any] = {"path": node.path}
        host = self._host_path(node.path)
        if host is not None and host != node.path:
            rendered["hostPath"] = host
        elif node.major is not None and node.minor is not None:
            # Fully described, so the runtime creates it even where the host has no node at that path.
            rendered.update({"type": "c", "major": node.major, "minor": node.minor})
            if node.file_mode is not None:
                rendered["fileMode"] = node.file_mode
        return rendered


def driver_root_edits(root: DriverRoot) -> dict[str, Any]:
    """The mounts and hooks that give a container the driver's user-space files.

    Host paths name the host's driver root (the runtime binds them on the host); container paths are where a plain
    image's loader and PATH look (docs/cdi.md, "Container paths"), whatever the host's layout. With NVIDIA's hook,
    ``create-symlinks`` makes the soname and development links, ``enable-cuda-compat`` lets an image's newer CUDA
    forward-compatibility libraries take over, ``disable-device-node-modification`` keeps CUDA from creating
    device nodes of other GPUs, and ``update-ldcache`` puts the library directories into the container's linker
    cache, as NVIDIA's specs do, and a hook of 1.20 or newer ``update-application-profile`` (EGL and Vulkan then see
    only the GPUs the container has). Without it, the library is also bind-mounted under each soname
    the host has (a bind follows the link, so the container gets a file of that name): ``dlopen("libcuda.so.1")``
    then works from the loader's default search path alone.
    """
    mounts: list[dict[str, Any]] = []

    def mount(host: str, container: str, options: Sequence[str]) -> None:
        mounts.append({"hostPath": host, "containerPath": container, "options": list(options)})

    for file in (*root.libraries, *root.xorg_modules, *root.firmware, *root.binaries, *root.config_files):
        for inside in file.container_paths:
            mount(root.host_path(file), inside, FILE_MOUNT_OPTIONS)
    for file in root.sockets:
        for inside in file.container_paths:
            mount(root.host_path(file), inside, SOCKET_MOUNT_OPTIONS)
    hooks: list[dict[str, Any]] = []
    if root.cdi_hook:
        if root.symlinks:
            hooks.append(hook(root.cdi_hook, "create-symlinks", *link_args((s.target, s.link) for s in root.symlinks)))
        # Before update-ldcache, which then takes in the compat directory's ld.so.conf.d entry.
        hooks.append(hook(root.cdi_hook, "enable-cuda-compat", f"--host-driver-version={root.version}"))
        # The container's view of /proc/driver/nvidia/params says ModifyDeviceFiles: 0, so CUDA in it never
        # creates /dev/nvidia* nodes of GPUs the claim did not give it.
        hooks.append(hook(root.cdi_hook, "disable-device-node-modification"))
        folders = [arg for folder in root.library_dirs for arg in ("--folder", folder)]
        hooks.append(hook(root.cdi_hook, "update-ldcache", *folders))
        if hook_at_least(root.cdi_hook_version, APPLICATION_PROFILE_HOOK):
            # An EGL application profile that names the GPUs of the container's /dev/nvidia<minor> nodes: EGL and
            # Vulkan enumerate only those (it writes nothing where the container has none).
            hooks.append(hook(root.cdi_hook, "update-application-profile"))
    else:
        for link in root.symlinks:
            if link.library is not None:
                mount(str(root.host_root / link.library), link.link, FILE_MOUNT_OPTIONS)
    edits: dict[str, Any] = {"mounts": mounts}
    if hooks:
        edits["hooks"] = hooks
    return edits


def hook(path: str, subcommand: str, *args: str) -> dict[str, Any]:
    """A createContainer hook running ``subcommand`` of NVIDIA's hook at ``path`` (argv[0] its name; ``nvidia-ctk
    hook`` when the path is nvidia-ctk, which has the hooks as subcommands of ``hook``)."""
    argv0 = ["nvidia-ctk", "hook"] if Path(path).name == "nvidia-ctk" else [Path(path).name]
    return {"hookName": "createContainer", "path": path, "args": [*argv0, subcommand, *args]}


def link_args(links: Iterable[tuple[str, str]]) -> list[str]:
    """``create-symlinks``' arguments for (target, link) pairs."""
    return [arg for target, link in links for arg in ("--link", f"{target}::{link}")]


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The lowest CDI version that can express ``spec``, as the CDI library computes it.

    Runtimes reject versions newer than their library knows (podman 4.3 refuses 0.6.0), so never claim more.
    Only the features we emit are checked: hostPath on device nodes and device names starting with a digit need
    0.5.0; a typed mount needs 0.4.0; annotations or a '.' in the class would need 0.6.0. Mounts without a type
    and hooks are 0.3.0 features.
    """
    vendor_class = spec["kind"].split("/", 1)[1]
    if spec.get("annotations") or "." in vendor_class or any(d.get("annotations") for d in spec["devices"]):
        return "0.6.0"
    edits: Sequence[dict[str, Any]] = [
        spec.get("containerEdits") or {},
        *(d["containerEdits"] for d in spec["devices"]),
    ]
    if any("hostPath" in node for e in edits for node in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(d["name"][:1].isdigit() for d in spec["devices"]):
        return "0.5.0"
    if any(mount.get("type") for e in edits for mount in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"
