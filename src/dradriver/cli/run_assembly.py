"""The parts of ``dradriver run``, one builder each, and :class:`NodeDriver`, the GPU driver of a node they make.

``cli/run.py`` calls them in order: :func:`connect` (the API server, its slice layout: before anything is
started), :func:`open_gpus` (the GPUs and the driver's files, waited for while missing), then :func:`assemble`:
health, the checkpoint, the driver, the kubelet plugin (its instance lock taken), start-up reconciliation, the
slices and their publisher, and the usage sampler.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from dradriver.cli import cd_node
from dradriver.cli.flags.sharing import SharingOptions
from dradriver.cli.run_options import RunOptions
from dradriver.driver.checks.device_plugin import FIX, DevicePluginFound, find_device_plugin
from dradriver.driver.observe.allocations import Allocation, allocations
from dradriver.driver.observe.health import GpuHealth
from dradriver.driver.observe.metrics import InstrumentedHandler
from dradriver.driver.observe.usage import Device as UsageDevice
from dradriver.driver.observe.usage import UsageSampler, pod_uid_of_pid
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.mps import DEFAULT_COMMAND, MpsControl
from dradriver.driver.prepare.partitions import with_gpu_attributes
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions, NodeFeatures
from dradriver.driver.prepare.vfio import (
    Passthrough,
    PassthroughCatalog,
    PassthroughSteps,
    nvml_counts,
    nvml_holders,
    nvml_sees,
    without_passthrough_losses,
)
from dradriver.driver.publish.node_labeler import HostFacts, NodeLabeler, NodeLabelerOptions
from dradriver.driver.publish.passthrough import passthrough_slice_specs, share_gpu_counters
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs, release_problem, shape_for
from dradriver.errors import ConfigError
from dradriver.gpu.backend import (
    attach_simulated_sysfs,
    simulated_fabric_manager,
    simulated_imex_commands,
    simulated_mps_command,
)
from dradriver.gpu.fabric_manager import FabricManager
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import Inventory, MigMode, discover
from dradriver.gpu.nvfm import LIBRARY_NAMES as NVFM_LIBRARY_NAMES
from dradriver.gpu.nvfm import NvfmFabricManager
from dradriver.gpu.nvml import NvidiaSmi, NvmlGpuLib
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.driver_root import DriverRoot, find_library
from dradriver.nvidia_install.library_links import library_links
from dradriver.nvidia_install.pci_binding import HostPci, SysfsWriter
from dradriver.plugin.cluster import ClusterError, NotFoundError, kubernetes_minor_version
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.cluster.kube import KubeCluster
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.lifecycle import exclusive
from dradriver.plugin.kubeletplugin.plugin import SERIALIZE_LOCK_NAME, KubeletPlugin, KubeletPluginOptions
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec

if TYPE_CHECKING:  # loaded by cd_node.start only with --compute-domains (docs/reliability.md, memory)
    from dradriver.computedomain.plugin import ComputeDomainPlugin

#: The PATH a root shell on a Linux host has, after which a driver tool's own directory is searched.
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

log = logging.getLogger("dradriver.run")

Pools = dict[str, list[SliceSpec]]

#: The host's sysfs as the driver's pod sees it (every container's /sys is the host's, read-only).
HOST_SYSFS = Path("/sys")


@dataclass(kw_only=True)
class Gpus:
    """The GPU backend, open; the node's GPUs as last discovered; the driver's files for their driver version (both
    follow the node as rescans find it). ``pod_of_pid`` maps a GPU process to its pod."""

    lib: GpuLib
    simulated: bool
    pod_of_pid: Callable[[int], str | None]
    inventory: Inventory
    driver_root: DriverRoot
    #: The host's PCI devices, with ``--passthrough`` (on a simulated node, its own sysfs tree).
    pci: HostPci | None = None
    #: Fabric Manager, with ``--fabric-manager-partitions`` (on a simulated node, its stand-in).
    fabric_manager: FabricManager | None = None

    def close(self) -> None:
        """Close Fabric Manager's client (its library shut down by its last client), then the GPU backend."""
        try:
            close_fabric_manager(self.fabric_manager)
        finally:
            self.lib.close()


@dataclass(kw_only=True)
class NodeDriver:
    """The GPU driver of one node, assembled: what the loops, the probes and the stop act on. ``pools`` are the
    slices as last published (kept as the publisher keeps them: JSON text, shared with it)."""

    options: RunOptions
    gpus: Gpus
    cluster: KubeCluster
    settings: SliceSettings
    health: GpuHealth
    checkpoint: CheckpointStore
    driver: GpuDriver
    plugin: KubeletPlugin
    publisher: Publisher
    pools: Pools
    plugin_watch: DevicePluginWatch
    usage: UsageSampler | None = None
    labeler: NodeLabeler | None = None

    @property
    def name(self) -> str:
        """The node's name, which is also its one pool's."""
        return self.options.node.name

    def allocations(self) -> list[Allocation]:
        """Which pod holds which device, from the checkpoint."""
        return allocations(self.checkpoint.records())

    def usage_devices(self) -> list[UsageDevice]:
        """Every GPU and MIG device of the last inventory, and MIG devices carved for claims since."""
        inventory = self.gpus.inventory
        devices = [UsageDevice(g.name, g.uuid, g.uuid) for g in inventory.gpus]
        devices += [UsageDevice(m.name, m.uuid, m.parent.uuid) for m in inventory.mig_devices if m.uuid]
        known = {d.uuid for d in devices}
        for a in self.allocations():
            if a.uuid not in known:
                known.add(a.uuid)
                devices.append(UsageDevice(a.device, a.uuid, a.gpu_uuid))
        return devices

    def serialised_with_other_pods(self) -> contextlib.AbstractContextManager[None]:
        """See :func:`serialised_with_other_pods` (rolling-update mode only)."""
        return serialised_with_other_pods(self.plugin.plugin_dir, enabled=self.options.node.rolling_update)


def open_gpus(options: RunOptions) -> Gpus:
    """Open the GPU backend, discover the GPUs, then the driver's files for their driver version. Raises
    LibraryNotFound, DriverNotLoaded or DriverFilesMissing while the driver is not there, FabricManagerNotReady while
    Fabric Manager is (nothing left open)."""
    lib, simulated = options.gpus.open_backend(
        node_name=options.node.name, nvml_library=options.driver_root.nvml_library(options.gpus.backend)
    )
    fabric_manager: FabricManager | None = None
    try:
        # Before discovery: NVML does not see a GPU an earlier run left bound to vfio-pci.
        attach = (lambda root: attach_simulated_sysfs(simulated, root)) if simulated is not None else None
        pci = host_pci(options, attach) if options.passthrough.enabled else None
        stand_in = (lambda: simulated_fabric_manager(simulated)) if simulated is not None else None
        fabric_manager = open_fabric_manager(options, stand_in) if options.fabric_manager.enabled else None
        inventory = without_passthrough_losses(discover(lib), pci)
        log.info(
            "discovered gpus=%d mig_devices=%d driver=%s backend=%s",
            len(inventory.gpus),
            len(inventory.mig_devices),
            inventory.driver_version,
            options.gpus.backend,
        )
        driver_root = find_driver_root(options, inventory.driver_version, simulated=simulated is not None)
        use_driver_tools(lib, driver_root, simulated=simulated is not None)
    except BaseException:
        try:
            close_fabric_manager(fabric_manager)
        finally:
            lib.close()
        raise
    return Gpus(
        lib=lib,
        simulated=simulated is not None,
        # A simulated node's PIDs are nobody's: it says itself which pod each process runs for.
        pod_of_pid=simulated.pod_of_pid if simulated is not None else pod_uid_of_pid,
        inventory=inventory,
        driver_root=driver_root,
        pci=pci,
        fabric_manager=fabric_manager,
    )


def open_fabric_manager(options: RunOptions, stand_in: Callable[[], FabricManager] | None) -> FabricManager:
    """Fabric Manager for ``--fabric-manager-partitions``: a simulated node's stand-in, else the host's FM through
    its client library in the driver root, asked once for its partitions, so that a node whose FM is missing, not
    running or not in shared-NVSwitch mode stops at start saying what to install or start (FabricManagerNotReady
    where FM is not there yet or still starting: a start waits for it as for the driver)."""
    if stand_in is not None:
        return stand_in()
    root = Path(options.driver_root.container_driver_root or options.driver_root.driver_root or "/")
    fm = options.fabric_manager
    client = NvfmFabricManager(fabric_manager_library(root), address=fm.address_in(root), timeout_ms=fm.timeout_ms)
    try:
        partitions = client.supported_partitions()
    except BaseException:
        client.close()
        raise
    log.info(
        "connected to Fabric Manager address=%s library=%s partitions=%d active=%s",
        client.address,
        client.library_path,
        len(partitions),
        [p.id for p in partitions if p.active],
    )
    return client


def close_fabric_manager(fabric_manager: FabricManager | None) -> None:
    """End the host FM client's library session (``fmLibShutdown`` by its last client); a stand-in has none."""
    if isinstance(fabric_manager, NvfmFabricManager):
        fabric_manager.close()


def fabric_manager_library(root: Path) -> str:
    """FM's client library in the driver root ``root``, found as its loader would (linker cache, ld.so.conf, the
    usual directories), as NVML is; ``ConfigError`` naming the package to install when it is not there."""
    for name in NVFM_LIBRARY_NAMES:
        found, how = find_library(root, name)
        if found is not None:
            log.info("loading Fabric Manager's client library path=%s found_by=%s", root / found, how)
            return str(root / found)
    raise ConfigError(
        f"--fabric-manager-partitions: Fabric Manager's client library ({NVFM_LIBRARY_NAMES[0]}) is not in the driver "
        f"root {root}: install Fabric Manager's SDK package of the driver's branch where the driver is "
        "(nvidia-fabricmanager-dev-<branch> on Debian and Ubuntu, nvidia-fabricmanager-devel-<branch> on RPM "
        "distributions) "
        "beside Fabric Manager itself (nvidia-fabricmanager-<branch>), or run without --fabric-manager-partitions"
    )


def host_pci(options: RunOptions, attach_simulated: Callable[[Path], SysfsWriter] | None) -> HostPci:
    """The host's sysfs for VFIO passthrough: ``--passthrough-host-root``, else ``/``; a simulated node's tree in the
    plugin directory, written through its simulated kernel. Refused where the kernel has no IOMMU groups, or where
    the host's ``/proc`` is not there to read."""
    root = options.passthrough.host_root
    if attach_simulated is not None:
        root = root or options.dirs.plugin / "sim-host"
        return HostPci(root, attach_simulated(root))
    pci = HostPci(root or Path("/"))
    if not pci.iommu_enabled():
        raise ConfigError(
            f"--passthrough: {pci.sys / 'kernel/iommu_groups'} is empty, so no GPU can be passed through; turn the "
            "IOMMU on (intel_iommu=on or amd_iommu=on on the kernel command line, VT-d or AMD-Vi in the firmware) "
            "or run without --passthrough"
        )
    if not pci.proc_listable():
        # Prepare reads it for processes holding a GPU before the unbind, and refuses every claim without it.
        raise ConfigError(
            f"--passthrough: {pci.root / 'proc'} lists no process, or only a container's own, so which processes "
            "hold a GPU cannot be told before it leaves the nvidia driver; mount the host's /proc there (the chart's "
            "host-proc volume at /host/proc) or run without --passthrough"
        )
    return pci


def find_driver_root(options: RunOptions, version: str, *, simulated: bool) -> DriverRoot:
    """The driver's files for driver ``version`` (at start, and after an in-place driver upgrade)."""
    return options.driver_root.discover(version, simulated=simulated, plugin_dir=options.dirs.plugin)


def connect(options: RunOptions) -> tuple[KubeCluster, SliceSettings]:
    """The API server, and the slice settings its release takes (refused with a ConfigError if it cannot)."""
    cluster = options.kube.connect()
    try:
        release = options.publishing.kubernetes_version or _detect_kubernetes_version(cluster)
        settings = SliceSettings(
            driver=options.driver_name,
            mig_mode=options.gpus.mig_mode,
            shape=shape_for(release),
            gpu_sharing=options.sharing.gpu_sharing,
            consumable_shares=options.sharing.consumable_shares,
            list_attributes=options.publishing.list_attributes,
        )
        problem = release_problem(release, settings)
        if problem is not None:
            raise ConfigError(problem)
    except BaseException:
        cluster.close()
        raise
    return cluster, settings


@dataclass
class DevicePluginWatch:
    """What one look for NVIDIA's device plugin leaves to the next: whether the GPUs are withheld (a Node that
    cannot be read then keeps them so: one failed read is no sign the plugin left) and the Node read error last
    warned about (a WARNING once per distinct error, not at every rescan)."""

    withholding: bool = False
    unread_warned: str = ""

    def note_unread(self, found: DevicePluginFound) -> None:
        """Warn once that the Node could not be read (only the kubelet's socket decides then)."""
        if found.node_unread and found.node_unread != self.unread_warned:
            log.warning(
                "device plugin check: the Node cannot be read for NVIDIA's device plugin's resources; only the "
                "kubelet's socket directory decides (give the service account get on nodes) reason=%s",
                found.node_unread,
            )
        self.unread_warned = found.node_unread


def check_device_plugin(options: RunOptions, cluster: KubeCluster) -> DevicePluginFound:
    """Refuse to start (a ConfigError: one line, exit 2) where NVIDIA's device plugin is on the node, unless told
    the node is being migrated (``--device-plugin-coexistence withhold``: then the GPUs are withheld, see
    :func:`offered`). Run before any port is bound or file written."""
    found = look_for_device_plugin(options, cluster)
    if found.found and not options.device_plugin.withhold:
        raise ConfigError(f"{found.describe()}; both would hand out the same GPUs; {FIX}")
    if found.node_unread:  # a WARNING when publishing first (offered): a failure to start stays its one line
        log.debug("device plugin check: only the kubelet's socket directory was looked at reason=%s", found.node_unread)
    return found


def look_for_device_plugin(options: RunOptions, cluster: KubeCluster) -> DevicePluginFound:
    """NVIDIA's device plugin's sockets in the kubelet's directory and its resources on this node's Node."""
    node = options.node.name
    return find_device_plugin(options.device_plugin.settings(node), lambda: cluster.get_node(node))


def offered(options: RunOptions, cluster: KubeCluster, inventory: Inventory, watch: DevicePluginWatch) -> Inventory:
    """What to publish of ``inventory``: all of it, or, while NVIDIA's device plugin is on the node, no GPU and no
    MIG device. Looked at when publishing first and at every rescan, in both modes: with ``withhold`` the node is
    being migrated; with ``refuse`` the plugin arrived after the start check (an ERROR, not an exit: pods already
    prepared keep running). The plugin advertises counts, not which GPUs it hands out: every GPU is withheld while
    it advertises any, and published at the first rescan after it is gone (not while the Node cannot be read)."""
    found = look_for_device_plugin(options, cluster)
    watch.note_unread(found)
    kept = watch.withholding and not found.found and bool(found.node_unread)
    watch.withholding = found.found or kept
    if not watch.withholding:
        return inventory
    if kept:
        log.warning(
            "keeping every GPU withheld from the slices: the Node cannot be read to tell whether NVIDIA's device "
            "plugin is gone reason=%s",
            found.node_unread,
        )
    elif options.device_plugin.withhold:
        log.warning(
            "withholding every GPU from the slices (--device-plugin-coexistence withhold): %s (%d advertised; which "
            "GPUs it holds cannot be told); they are published once it is gone from the node",
            found.describe(),
            found.advertised_gpus,
        )
    else:
        log.error(
            "withholding every GPU from the slices: %s, arrived while the driver runs; both would hand out the same "
            "GPUs (pods already prepared keep theirs); they are published again once it is gone; %s",
            found.describe(),
            FIX,
        )
    return replace(inventory, gpus=(), mig_devices=())


def assemble(options: RunOptions, gpus: Gpus, cluster: KubeCluster, settings: SliceSettings) -> NodeDriver:
    """Build every part, take the plugin's instance lock and reconcile; nothing serves yet (see ``cli/run.py``).
    A failure releases what was built."""
    health = build_health(options, gpus)
    # In rolling-update mode the old and the new pod share the checkpoint (their calls are serialised).
    checkpoint = CheckpointStore.open(options.dirs.state, shared=options.node.rolling_update)
    try:
        driver = build_driver(options, gpus, health=health, checkpoint=checkpoint, cluster=cluster)
        plugin = build_plugin(options, driver=driver, cluster=cluster, health=health, checkpoint=checkpoint)
        # Refused here, a second instance has not touched the running one's claims, CDI specs or MIG devices.
        plugin.lock()
        try:
            reconcile_at_start(options, gpus, driver=driver, plugin=plugin, health=health, cluster=cluster)
            # Built once, from the inventory as reconciliation left it; the publisher validates them once too.
            # Kept as the publisher keeps them (JSON text, shared with it): the dict form would hold about 2 MB
            # more for the driver's whole life (docs/reliability.md, memory).
            plugin_watch = DevicePluginWatch()  # kept for every rescan's look (node_loops.py)
            offer = offered(options, cluster, gpus.inventory, plugin_watch)
            settings = replace(settings, gpu_attributes=driver.partition_attributes())
            specs = build_slice_specs(offer, settings, taints=health.taints)
            vfio = with_gpu_attributes(passthrough_slice_specs(driver.passthrough_devices()), settings.gpu_attributes)
            pools = pools_of(options.node.name, share_gpu_counters(specs, vfio, shape=settings.shape))
            publisher = build_publisher(options, cluster=cluster, settings=settings, pools=pools)
        except BaseException:
            plugin.stop()
            raise
    except BaseException:
        checkpoint.close()
        raise
    node = NodeDriver(
        options=options,
        gpus=gpus,
        cluster=cluster,
        settings=settings,
        health=health,
        checkpoint=checkpoint,
        driver=driver,
        plugin=plugin,
        publisher=publisher,
        pools=pools,
        plugin_watch=plugin_watch,
    )
    node.usage = build_usage_sampler(node)
    node.labeler = build_node_labeler(options, cluster, simulated=gpus.simulated)
    return node


def build_health(options: RunOptions, gpus: Gpus) -> GpuHealth:
    """The device health monitor; what it knows survives restarts in the plugin directory."""
    return GpuHealth(
        inventory=gpus.inventory,
        mig_mode=options.gpus.mig_mode,
        pool=options.node.name,
        policy=options.health.policy,
        state_path=options.dirs.plugin / "health.json",
    )


def build_driver(
    options: RunOptions, gpus: Gpus, *, health: GpuHealth, checkpoint: CheckpointStore, cluster: KubeCluster
) -> GpuDriver:
    """The GPU driver: its CDI writer, its MPS control, the health and cluster questions it asks."""
    # A simulated node has no /dev/nvidia*: bind /dev/null so a real runtime can still inject the spec.
    cdi = CdiWriter(
        options.dirs.cdi,
        host_path=(lambda _path: "/dev/null") if gpus.simulated else lambda _path: None,
        driver_root=gpus.driver_root,
    )
    mps = MpsControl(
        root=options.dirs.state / "mps",
        shm_size=options.sharing.mps_shm_size,
        **mps_commands(options.sharing, gpus.driver_root, simulated=gpus.simulated, state_dir=options.dirs.state),
    )
    name, node = options.driver_name, options.node.name
    return GpuDriver(
        GpuDriverOptions(
            driver_name=name,
            pool=node,
            mig_mode=options.gpus.mig_mode,
            consumable_shares=options.sharing.consumable_shares,
            features=NodeFeatures(passthrough=passthrough_of(gpus), fabric_manager=gpus.fabric_manager),
        ),
        inventory=gpus.inventory,
        cdi=cdi,
        gpulib=gpus.lib,
        checkpoint=checkpoint,
        mps=mps,
        device_problem=health.problem,
        holder_released=lambda ref, device: holder_released(cluster, name, node, ref, device),
    )


def passthrough_of(gpus: Gpus) -> Passthrough | None:
    """VFIO passthrough's devices and step (``--passthrough``), over the GPU backend's NVML."""
    if gpus.pci is None:
        return None
    lib = gpus.lib
    steps = PassthroughSteps(
        gpus.pci,
        nvml_sees=nvml_sees(lib),
        holders=nvml_holders(lib),
        nvml_counts=nvml_counts(lib),
        release=lib.released,  # NVML holds every GPU open: let go for each unbind from nvidia
    )
    return Passthrough(PassthroughCatalog(gpus.pci), steps)


def build_plugin(
    options: RunOptions, *, driver: GpuDriver, cluster: KubeCluster, health: GpuHealth, checkpoint: CheckpointStore
) -> KubeletPlugin:
    """The kubelet plugin serving ``driver`` (instrumented for /metrics), writing claim status if asked."""
    name, node = options.driver_name, options.node.name
    plugin_options = KubeletPluginOptions(
        driver_name=name,
        node_name=node,
        registry_dir=options.dirs.registry,
        plugin_dir=options.dirs.plugin,
        device_metadata_cdi_dir=options.dirs.cdi,
        device_metadata=options.claims.device_metadata,
        pod_uid=options.node.pod_uid,
    )
    return KubeletPlugin(
        plugin_options,
        handler=InstrumentedHandler(driver),
        claim_source=cluster,
        health_source=health,
        claim_status=ClaimStatusWriter(cluster, driver_name=name, node_name=node)
        if options.claims.device_status
        else None,
        # The default state directory is the plugin directory: deleted with it, the checkpoint is written back.
        on_plugin_dir_recreated=checkpoint.ensure_written,
    )


def reconcile_at_start(
    options: RunOptions,
    gpus: Gpus,
    *,
    driver: GpuDriver,
    plugin: KubeletPlugin,
    health: GpuHealth,
    cluster: KubeCluster,
) -> None:
    """Before the kubelet can call: finish what a crash left half done, drop what is gone, destroy orphans."""
    with serialised_with_other_pods(plugin.plugin_dir, enabled=options.node.rolling_update):
        driver.reconcile(lambda ref: claim_exists(cluster, ref))
        prepared = {record.uid for record in driver.checkpoint.records()}
        plugin.remove_unowned_device_metadata(prepared)
    mig_mode = options.gpus.mig_mode
    if mig_mode is MigMode.DYNAMIC or gpus.pci is not None:
        # Reconciliation may have destroyed MIG instances, or given a GPU back from vfio-pci to nvidia.
        gpus.inventory = without_passthrough_losses(discover(gpus.lib), gpus.pci)
        driver.update_inventory(gpus.inventory, mig_mode)
        health.update_inventory(gpus.inventory, mig_mode)


def build_publisher(options: RunOptions, *, cluster: KubeCluster, settings: SliceSettings, pools: Pools) -> Publisher:
    """The slice publisher of this node's pool, owned by its Node (garbage-collected with it)."""
    publishing = PublisherOptions(
        driver=options.driver_name,
        node_name=options.node.name,
        node_uid=node_uid(cluster, options.node.name),
        shape=settings.shape,
        withdraw_tainted_if_dropped=options.health.withdraw_tainted,
    )
    return Publisher(cluster, publishing, pools=pools)


def build_usage_sampler(node: NodeDriver) -> UsageSampler | None:
    """The NVML usage sampler, when a status server shows what it samples and --usage-interval is not 0."""
    if not node.options.status.samples_usage:
        return None
    return UsageSampler(node.gpus.lib, node.usage_devices, node.allocations, pod_of_pid=node.gpus.pod_of_pid)


def build_node_labeler(options: RunOptions, cluster: KubeCluster, *, simulated: bool) -> NodeLabeler:
    """What keeps GPU Feature Discovery's labels on the Node (``--node-labels gfd``) or removes them (``none``).
    MPS sharing, for ``nvidia.com/mps.capable``: claims may share a GPU through MPS daemons. A simulated node has
    no host whose machine type or PCI classes could be read."""
    sharing = options.sharing
    labeler_options = NodeLabelerOptions(
        driver_name=options.driver_name,
        node_name=options.node.name,
        mig_strategy=options.node_labels.mig_strategy,
        mps_sharing=sharing.gpu_sharing == "consumable" or sharing.consumable_shares is not None,
    )
    return NodeLabeler(cluster, labeler_options, host=HostFacts(None if simulated else HOST_SYSFS))


def host_imex_ctl(gpus: Gpus) -> list[str]:
    """The host's ``nvidia-imex-ctl`` (``--imex-mode hostManaged``): run inside the driver root, as NVIDIA's plugin
    does (its libraries are the driver's); the stand-in's on a simulated node."""
    if gpus.simulated:
        return simulated_imex_commands()[1]
    root = gpus.driver_root
    found = [f for f in root.binaries if f.path.name == "nvidia-imex-ctl"]
    return ["chroot", str(root.container_root), f"/{found[0].path}" if found else "nvidia-imex-ctl"]


def start_compute_domains(node: NodeDriver) -> ComputeDomainPlugin:
    """Serve ComputeDomains beside the GPU driver (``--compute-domains``)."""
    root = node.gpus.driver_root
    # The IMEX daemon pods run the host driver's nvidia-imex and nvidia-imex-ctl (versions must match it).
    imex = [
        (root.host_path(f), path)
        for f in root.binaries
        if f.path.name.startswith("nvidia-imex")
        for path in f.container_paths
    ]
    return cd_node.start(
        node.options,
        imex_binaries=imex,
        imex_ctl=host_imex_ctl(node.gpus),
        gpulib=node.gpus.lib,
        simulated=node.gpus.simulated,
        cluster=node.cluster,
        node_uid=node_uid(node.cluster, node.name),
        shape=node.settings.shape,
    )


def use_driver_tools(lib: GpuLib, driver_root: DriverRoot, *, simulated: bool) -> None:
    """NVML's backend runs the driver root's ``nvidia-smi`` (GPU reset, time-slice) with the root's NVML preloaded:
    the image's loader finds no libnvidia-ml.so.1 of its own (at start, and after an in-place driver upgrade)."""
    if not simulated and isinstance(lib, NvmlGpuLib):
        lib.use_nvidia_smi(nvidia_smi_of(driver_root))


def nvidia_smi_of(driver_root: DriverRoot) -> NvidiaSmi:
    """The driver root's ``nvidia-smi`` as this process runs it, with the root's ``libnvidia-ml`` in LD_PRELOAD
    (what NVIDIA's DRA driver does too; never LD_LIBRARY_PATH, whose directory may hold the host's C library); the
    one on PATH where the root has none."""
    binary = next((b.path for b in driver_root.binaries if b.path.name == "nvidia-smi"), None)
    if binary is None:
        return NvidiaSmi()
    nvml = next((f.path for f in driver_root.libraries if f.path.name.startswith("libnvidia-ml.so")), None)
    preload = (str(driver_root.container_root / nvml),) if nvml is not None else ()
    return NvidiaSmi((str(driver_root.container_root / binary),), preload)


def mps_commands(
    sharing: SharingOptions, driver_root: DriverRoot, *, simulated: bool, state_dir: Path
) -> dict[str, Any]:
    """MpsControl's commands and daemon environment for ``driver_root`` (at start, and after an in-place driver
    upgrade). The daemon loads libcuda like any CUDA program, from a directory of links to the driver root's
    libraries alone (nvidia_install/library_links.py: the directories they came from may hold the host's C
    library, which the image's processes started with the same environment must never load)."""
    env = {} if simulated else {"LD_LIBRARY_PATH": str(library_links(driver_root, state_dir, host=False))}
    wrapper = list(sharing.mps_daemon_wrapper)
    daemon = _mps_daemon_command(sharing, driver_root, simulated=simulated, state_dir=state_dir, wrapped=bool(wrapper))
    return {
        "command": _mps_command(sharing, driver_root, simulated=simulated),
        "daemon_command": daemon,
        "wrapper": wrapper,
        "env": env,
    }


def _mps_daemon_command(
    sharing: SharingOptions, driver_root: DriverRoot, *, simulated: bool, state_dir: Path, wrapped: bool
) -> list[str]:
    """How a claim's daemon starts ([]: as the control command). It starts ``nvidia-cuda-mps-server`` for its first
    client, found on its PATH: the control binary's directory goes first there, in the daemon's environment only
    (on the driver's own PATH it would also pick the host's ``nsenter`` or ``unshare`` over the image's). After
    --mps-daemon-wrapper it runs in the host's namespaces, where the driver root is at its host path: the binary
    and its libraries are named there (a simulated node's stand-in, or an explicit --mps-control-command, are
    taken as given)."""
    if simulated or sharing.mps_control_command:
        return _mps_command(sharing, driver_root, simulated=simulated) if wrapped else []
    binary = _mps_binary(driver_root)
    if not wrapped:
        if binary is None:
            return []
        located = driver_root.container_root / binary
        return ["env", f"PATH={located.parent}:{os.environ.get('PATH', STANDARD_PATH)}", str(located)]
    libraries = f"LD_LIBRARY_PATH={library_links(driver_root, state_dir, host=True)}"
    if binary is None:
        return ["env", libraries, *DEFAULT_COMMAND]
    host = driver_root.host_root / binary
    return ["env", libraries, f"PATH={host.parent}:{STANDARD_PATH}", str(host)]


def _mps_binary(driver_root: DriverRoot) -> PurePosixPath | None:
    """The root-relative path of the driver root's MPS control binary, None when it has none."""
    return next((b.path for b in driver_root.binaries if b.path.name == DEFAULT_COMMAND[0]), None)


def _mps_command(sharing: SharingOptions, driver_root: DriverRoot, *, simulated: bool) -> list[str]:
    if sharing.mps_control_command:
        return list(sharing.mps_control_command)
    if simulated:
        return simulated_mps_command()
    binary = _mps_binary(driver_root)
    if binary is not None:
        return [str(driver_root.container_root / binary), *DEFAULT_COMMAND[1:]]
    return list(DEFAULT_COMMAND)


@contextlib.contextmanager
def serialised_with_other_pods(plugin_dir: Path, *, enabled: bool) -> Iterator[None]:
    """In rolling-update mode, hold the lock the pods' prepare and unprepare calls take (SerializedHandler), so
    reconciliation never rolls back a prepare the other pod is in the middle of."""
    if not enabled:
        yield
        return
    plugin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with exclusive(plugin_dir / SERIALIZE_LOCK_NAME):
        yield


def pools_of(node: str, specs: list[dict[str, Any]]) -> Pools:
    """The one pool a node publishes, named after the node."""
    return {node: [SliceSpec.of(s.get("devices", ()), s.get("sharedCounters", ())) for s in specs]}


def claim_exists(cluster: KubeCluster, ref: ClaimRef) -> bool | None:
    """Whether the API server still has the claim (False also when it was replaced); None when it cannot say."""
    try:
        uid = cluster.get_resource_claim(ref.namespace, ref.name).get("metadata", {}).get("uid")
    except NotFoundError:
        return False
    except ClusterError as err:
        log.warning("cannot tell whether claim %s still exists; keeping it error=%s", ref, err)
        return None
    return bool(uid == ref.uid)


def holder_released(cluster: KubeCluster, driver: str, pool: str, ref: ClaimRef, device: str) -> bool:
    """Whether the API server no longer allocates ``device`` of this node to the claim ``ref``: it was deleted,
    replaced or deallocated (so its pods are gone). False when it cannot say."""
    try:
        claim = cluster.get_resource_claim(ref.namespace, ref.name)
    except NotFoundError:
        return True
    except ClusterError as err:
        log.warning("cannot tell whether claim %s still holds device %s; keeping it error=%s", ref, device, err)
        return False
    if claim.get("metadata", {}).get("uid") != ref.uid:
        return True
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return not any(r.get("driver") == driver and r.get("pool") == pool and r.get("device") == device for r in results)


def _detect_kubernetes_version(cluster: KubeCluster) -> str:
    """The cluster's ``1.N`` from the API server's /version (the slice layout depends on it)."""
    try:
        version = kubernetes_minor_version(cluster.server_version())
    except ClusterError as err:
        raise ConfigError(
            f"cannot read the API server's version to choose the ResourceSlice layout: {err}; "
            "fix the API server connection or set --kubernetes-version (DRADRIVER_KUBERNETES_VERSION)"
        ) from err
    log.info("detected Kubernetes version=%s (override with --kubernetes-version)", version)
    return version


def node_uid(cluster: KubeCluster, node: str) -> str | None:
    """The Node's UID for the slices' owner reference (so they are garbage-collected with the Node)."""
    try:
        uid = cluster.get_node(node).get("metadata", {}).get("uid")
        return str(uid) if uid else None
    except ClusterError as err:
        log.warning("cannot read Node %s; slices get no owner reference error=%s", node, err)
        return None
