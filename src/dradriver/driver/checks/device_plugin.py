"""NVIDIA's device plugin on this node: the other way GPUs reach pods. Both handing out the same GPU puts two pods
on it, neither knowing, so ``doctor`` shows it and ``run`` refuses to publish (or withholds the GPUs) while it is
there.

Two signs, either enough: the plugin's registration socket in the kubelet's device-plugins directory (NVIDIA's
plugin names it ``nvidia-<resource>.sock`` for each resource it serves, ``nvidia.com/gpu`` →
``nvidia-gpu.sock``, ``nvidia.com/mig-1g.10gb`` → ``nvidia-mig-1g.10gb.sock``, a renamed ``nvidia.com/gpu.shared``
→ ``nvidia-gpu.shared.sock``), and the Node's ``status.capacity`` or ``allocatable`` counting GPU resources
(what the kubelet advertises for the plugin; a resource at 0 is one whose plugin has gone).

Only the GPU plugin's names count: ``nvidia.com/gpu``, ``nvidia.com/gpu.<name>`` and ``nvidia.com/mig-<profile>``
(their sockets likewise). NVIDIA's Network Operator advertises NICs under ``nvidia.com/`` too
(``nvidia.com/hostdev``, ``nvidia.com/sriov_rdma``) on the very GPU nodes that use GPUDirect; those are no sign.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dradriver.driver.checks.cluster import api_getter
from dradriver.driver.checks.result import FAIL, OK, CheckResult
from dradriver.driver.checks.settings import ClusterSettings, DevicePluginSettings

#: The extended resources' domain NVIDIA's plugin advertises under (``nvidia.com/gpu``, ``nvidia.com/mig-*``).
RESOURCE_PREFIX = "nvidia.com/"
#: The GPU plugin's resources, after the domain: ``gpu``, a renamed ``gpu.<name>``, ``mig-<profile>`` (not the
#: Network Operator's NICs, ``hostdev`` or ``sriov_rdma``, advertised under the same domain).
GPU_RESOURCE, RENAMED_GPU_PREFIX, MIG_RESOURCE_PREFIX = "gpu", "gpu.", "mig-"
#: What ``doctor`` says it looked for, in its OK row.
RESOURCE_PATTERNS, SOCKET_PATTERNS = "nvidia.com/gpu* or nvidia.com/mig-*", "nvidia-gpu*.sock or nvidia-mig-*.sock"
#: NVIDIA's plugin's socket: ``nvidia-`` and the resource's name after ``nvidia.com/``, then ``.sock``.
SOCKET_PREFIX, SOCKET_SUFFIX = "nvidia-", ".sock"
#: What to do about it, in ``doctor``'s fix and ``run``'s refusal.
FIX = (
    "remove NVIDIA's device plugin from this node (a nodeSelector or node affinity on its DaemonSet that this "
    "node no longer matches; docs/deployment.md, moving from the device plugin), or, while the node is being "
    "migrated, run with --device-plugin-coexistence withhold (DRADRIVER_DEVICE_PLUGIN_COEXISTENCE; chart value "
    "devicePluginCoexistence) to publish none of the GPUs the plugin advertises"
)

#: Reads this node's Node object (the JSON the API server sends); raises when it cannot.
NodeReader = Callable[[], Mapping[str, Any]]


def is_gpu_resource(name: str) -> bool:
    """Whether ``name`` (after ``nvidia.com/``) is one the GPU device plugin serves: ``gpu``, ``gpu.<name>`` or
    ``mig-<profile>``."""
    if name == GPU_RESOURCE:
        return True
    return any(
        name.startswith(prefix) and len(name) > len(prefix) for prefix in (RENAMED_GPU_PREFIX, MIG_RESOURCE_PREFIX)
    )


@dataclass(frozen=True)
class DevicePluginFound:
    """What was seen: ``sockets`` the plugin's socket files, ``resources`` the GPU plugin's resources the Node
    advertises (name → the larger of its capacity and allocatable, above 0), ``node_unread`` why the Node was not
    read ("" when it was)."""

    sockets: tuple[str, ...] = ()
    resources: dict[str, int] = field(default_factory=dict)
    node_unread: str = ""

    @property
    def found(self) -> bool:
        return bool(self.sockets or self.resources)

    @property
    def advertised_gpus(self) -> int:
        """How many devices the Node counts under the GPU plugin's resources (0: none, or the Node unread)."""
        return sum(self.resources.values())

    def describe(self) -> str:
        """What was found, as one clause: the sockets and the Node's resources."""
        seen = []
        if self.sockets:
            seen.append(f"its kubelet socket {', '.join(self.sockets)}")
        if self.resources:
            counts = ", ".join(f"{name}: {count}" for name, count in sorted(self.resources.items()))
            seen.append(f"the Node advertises {counts}")
        return "NVIDIA's device plugin is on this node: " + "; ".join(seen)


def plugin_sockets(directory: Path) -> tuple[str, ...]:
    """The paths of NVIDIA's plugin's sockets in the kubelet's device-plugins ``directory`` (none when it is not
    there or not readable). Any file so named counts, a socket its plugin left behind too: removing the plugin
    removes it, and the safe answer to a leftover is to say so."""
    try:
        names = sorted(p.name for p in directory.iterdir())
    except OSError:
        return ()
    return tuple(
        str(directory / name)
        for name in names
        if name.startswith(SOCKET_PREFIX)
        and name.endswith(SOCKET_SUFFIX)
        and is_gpu_resource(name[len(SOCKET_PREFIX) : -len(SOCKET_SUFFIX)])
    )


def advertised_resources(node: Mapping[str, Any]) -> dict[str, int]:
    """The GPU plugin's resources (:func:`is_gpu_resource`) in the Node's ``status.capacity`` and ``allocatable``
    counted above 0, each with the larger count (quantities that are not whole numbers are skipped: no device
    plugin advertises those)."""
    status = node.get("status") or {}
    counts: dict[str, int] = {}
    for part in ("capacity", "allocatable"):
        for name, quantity in (status.get(part) or {}).items():
            if not (str(name).startswith(RESOURCE_PREFIX) and is_gpu_resource(str(name)[len(RESOURCE_PREFIX) :])):
                continue
            try:
                count = int(str(quantity))
            except ValueError:
                continue
            if count > 0:
                counts[str(name)] = max(count, counts.get(str(name), 0))
    return counts


def find_device_plugin(settings: DevicePluginSettings, read_node: NodeReader | None) -> DevicePluginFound:
    """Both signs: the sockets under ``settings.device_plugins_dir`` and, through ``read_node`` (None: no API
    server to ask), the Node's resources. A Node that cannot be read leaves the sockets to decide, and says why."""
    sockets = plugin_sockets(settings.device_plugins_dir)
    if read_node is None:
        why = "no API server to read it from" if settings.node_name else "no --node-name (NODE_NAME) to read it by"
        return DevicePluginFound(sockets, node_unread=why)
    try:
        return DevicePluginFound(sockets, advertised_resources(read_node()))
    except Exception as err:  # no answer or an error status: the Node's sign cannot be read, the socket's still can
        return DevicePluginFound(sockets, node_unread=f"cannot read the Node: {str(err).splitlines()[0][:160]}")


def device_plugin_check(found: DevicePluginFound, settings: DevicePluginSettings) -> CheckResult:
    """FAIL, with :data:`FIX`, where the plugin was found; OK saying what was looked at where not."""
    name = "device plugin"
    if found.found:
        return CheckResult(name, FAIL, found.describe(), FIX)
    looked = f"no {SOCKET_PATTERNS} in {settings.device_plugins_dir}"
    node = f"; Node not read ({found.node_unread})" if found.node_unread else f"; no {RESOURCE_PATTERNS} on the Node"
    return CheckResult(name, OK, looked + node)


def device_plugin_row(settings: DevicePluginSettings, cluster: ClusterSettings | None) -> CheckResult:
    """``doctor``'s row: the sockets, and the Node read through ``cluster``'s endpoint where there is one and the
    node's name is known."""
    if cluster is None or cluster.endpoint is None or not settings.node_name:
        return device_plugin_check(find_device_plugin(settings, None), settings)
    from dradriver.plugin.cluster.transport import Transport  # the HTTPS stack only where it is used

    transport = Transport(cluster.endpoint)
    try:
        get = api_getter(transport)
        path = f"/api/v1/nodes/{quote(settings.node_name)}"
        return device_plugin_check(find_device_plugin(settings, lambda: json.loads(get(path))), settings)
    finally:
        transport.close()
