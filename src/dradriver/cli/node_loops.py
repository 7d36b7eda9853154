"""What ``dradriver run`` keeps doing while it serves, each on a thread of its own: rediscovery (slices, taints,
MPS daemons and the driver's files follow the node) and the claim re-check (claims deleted behind the kubelet's
back are unprepared). Each outlives any one failure: a thread that died would leave the node unfollowed while
/readyz stays green."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from dradriver.cli.run_assembly import (
    NodeDriver,
    find_driver_root,
    mps_commands,
    offered,
    pools_of,
    use_driver_tools,
)
from dradriver.driver.observe.metrics import DELETED_CLAIMS
from dradriver.driver.prepare.partitions import with_gpu_attributes
from dradriver.driver.prepare.recheck import ClaimLookup, recheck_claims
from dradriver.driver.prepare.vfio import without_passthrough_losses
from dradriver.driver.publish.passthrough import passthrough_slice_specs, share_gpu_counters
from dradriver.driver.publish.slices import build_slice_specs
from dradriver.errors import DradriverError
from dradriver.gpu.inventory import Inventory, discover
from dradriver.plugin.cluster import ClusterError, NotFoundError
from dradriver.plugin.cluster.kube import KubeCluster
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import consumers

log = logging.getLogger("dradriver.run")


class Rescanner:
    """Every --rescan-interval (0: never on its own), and at once on ``refresh`` (a health change): rediscover,
    republish if the devices or their health changed, follow an in-place driver upgrade, check the MPS daemons."""

    def __init__(self, node: NodeDriver, stop: threading.Event) -> None:
        self.node = node
        self.stop = stop
        self.refresh = threading.Event()
        self.thread = threading.Thread(target=self.run, name="rescan", daemon=True)

    def run(self) -> None:
        interval = self.node.options.publishing.rescan_interval or None
        self.label_node()  # at start, in this thread: never before the driver serves
        while not self.stop.is_set():
            self.refresh.wait(interval)
            self.refresh.clear()
            if self.stop.is_set():
                return
            # The thread must outlive any one failure, or slices, taints and MPS daemons silently stop following
            # the node while /readyz stays green.
            try:
                self.rescan()
                # Like a prepare or unprepare: the other pod of a rolling update may be stopping a daemon now.
                with self.node.serialised_with_other_pods():
                    self.node.driver.check_mps_daemons()
            except Exception:
                log.exception("rescan failed unexpectedly; retrying at the next interval or health change")

    def rescan(self) -> None:
        """Rediscover and republish if the devices or their health changed; one bad rescan keeps the last
        inventory."""
        node = self.node
        mig_mode = node.options.gpus.mig_mode
        try:
            fresh = without_passthrough_losses(discover(node.gpus.lib), node.gpus.pci)
            if node.driver.partitions is not None:  # a GPU read anew (back from vfio-pci, found again): its module id
                node.driver.partitions.check_gpus(g.info for g in fresh.gpus)
            node.health.update_inventory(fresh, mig_mode)
            # Withheld while NVIDIA's device plugin is on the node, whichever --device-plugin-coexistence: with
            # refuse, it arrived after the start check.
            offer = offered(node.options, node.cluster, fresh, node.plugin_watch)
            specs = build_slice_specs(offer, node.settings, taints=node.health.taints)
            # The passthrough devices as the last update_inventory read them from sysfs (a rescan later: the next).
            vfio = passthrough_slice_specs(node.driver.passthrough_devices())
            vfio = with_gpu_attributes(vfio, node.settings.gpu_attributes)
            fresh_pools = pools_of(node.name, share_gpu_counters(specs, vfio, shape=node.settings.shape))
        except DradriverError as err:
            log.warning("rediscovery failed; keeping the last inventory error=%s", err)
            return
        if fresh.driver_version != node.gpus.driver_root.version:
            self.follow_driver_upgrade(fresh.driver_version)
        self.label_node(fresh)  # also when the slices did not change: a driver upgrade changes only labels
        if fresh_pools == node.pools:
            return
        log.info(
            "devices or their health changed; republishing gpus=%d mig_devices=%d lost_gpus=%d",
            len(fresh.gpus),
            len(fresh.mig_devices),
            len(fresh.lost_gpus),
        )
        node.pools = fresh_pools
        node.gpus.inventory = fresh  # what /allocations and the usage sampler list
        node.driver.update_inventory(fresh, mig_mode)
        node.publisher.update(fresh_pools)

    def label_node(self, inventory: Inventory | None = None) -> None:
        """Keep GPU Feature Discovery's labels on the Node for ``inventory`` (``--node-labels gfd``; the labeler
        writes only what changed), or, called without one at start, label the inventory found at start or remove
        the labels an earlier run wrote (``none``). Never in the way of serving: the labeler's refusals are
        WARNINGs, and a bug of its own is logged here."""
        try:
            labeler, enabled = self.node.labeler, self.node.options.node_labels.enabled
            if labeler is None:
                return
            if enabled:
                labeler.update(inventory or self.node.gpus.inventory)
            elif inventory is None:
                labeler.remove()
        except Exception:
            log.exception("node labels failed unexpectedly; retrying at the next rescan")

    def follow_driver_upgrade(self, version: str) -> None:
        """NVML reports another driver version than the root was discovered for (an in-place upgrade): find the
        new files for new prepares; claims prepared before keep the old files until their pods restart."""
        node = self.node
        old = node.gpus.driver_root.version
        try:
            fresh = find_driver_root(node.options, version, simulated=node.gpus.simulated)
        except DradriverError as err:
            log.warning(
                "the NVIDIA driver changed but its files are not all there yet; new prepares keep driver %s's "
                "files until they are version=%s error=%s",
                old,
                version,
                err,
            )
            return
        node.gpus.driver_root = fresh
        node.driver.cdi.driver_root = fresh
        use_driver_tools(node.gpus.lib, fresh, simulated=node.gpus.simulated)
        if node.driver.sharing.mps is not None:  # new daemons start the new driver's binary and libraries
            node.driver.sharing.mps.use(
                **mps_commands(
                    node.options.sharing, fresh, simulated=node.gpus.simulated, state_dir=node.options.dirs.state
                )
            )
        prepared = sorted(record.uid for record in node.checkpoint.records())
        log.warning(
            "NVIDIA driver upgraded in place from %s to %s: new prepares use the new files; prepared claims keep "
            "the old driver's files until their pods restart (restart them to use the new driver) claims=%s",
            old,
            version,
            ",".join(prepared) or "-",
        )


class ClaimRechecker:
    """Every --claim-recheck-interval: unprepare the claims deleted behind the kubelet's back, then ask for a
    rescan (``republish``), since freed MIG instances and GPUs are offered again."""

    def __init__(self, node: NodeDriver, stop: threading.Event, *, republish: Callable[[], None]) -> None:
        self.node = node
        self.stop = stop
        self.republish = republish
        self.thread = threading.Thread(target=self.run, name="claim-recheck", daemon=True)

    def run(self) -> None:
        node = self.node

        @contextlib.contextmanager
        def hold(uid: str) -> Iterator[None]:
            # As a kubelet call: the claim's lock, and in rolling-update mode the lock the two pods share; only
            # around the unprepare, never around the API look-ups.
            with node.plugin.claim_locks.hold([uid]), node.serialised_with_other_pods():
                yield

        while not self.stop.wait(node.options.claims.recheck_interval):
            try:
                gone = recheck_claims(node.driver, lambda ref: look_up_claim(node.cluster, ref), hold=hold)
                DELETED_CLAIMS.inc(len(gone))
                if gone:
                    with node.serialised_with_other_pods():
                        node.plugin.remove_unowned_device_metadata({r.uid for r in node.checkpoint.records()})
                    self.republish()  # freed MIG instances and GPUs: republish at once
            except Exception:
                log.exception("claim re-check failed unexpectedly; retrying at the next interval")


def look_up_claim(cluster: KubeCluster, ref: ClaimRef) -> ClaimLookup:
    """The claim as the re-check needs it: gone (or replaced: another UID), there with its pods, or unknown now."""
    try:
        claim = cluster.get_resource_claim(ref.namespace, ref.name)
    except NotFoundError:
        return ClaimLookup(exists=False)
    except ClusterError as err:
        log.warning("claim re-check: cannot tell whether claim %s still exists; keeping it error=%s", ref, err)
        return ClaimLookup(exists=None)
    if claim.get("metadata", {}).get("uid") != ref.uid:
        return ClaimLookup(exists=False)
    status = claim.get("status")
    return ClaimLookup(
        exists=True, consumers=consumers(status.get("reservedFor") if isinstance(status, dict) else None)
    )
