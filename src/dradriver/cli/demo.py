"""``dradriver demo``: the whole driver on a simulated node, no cluster needed.

It runs the real pieces end to end, each for real except the API server (an in-memory one) and the scheduler
(our allocator): discover GPUs, publish ResourceSlices, allocate a claim, register with a kubelet-like client over
the real gRPC sockets, prepare (CDI spec written), unprepare (CDI spec removed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dradriver.allocator import AllocationError, Unsatisfiable, allocate
from dradriver.cli.explain_input import BUILTIN_CLASSES, Inputs, check_claim, load
from dradriver.cli.flags import gpus
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.inventory import render_table
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.driver.publish.slices import SliceSettings, build_slice_specs
from dradriver.errors import ConfigError
from dradriver.gpu.backend import open_gpu_backend, simulated_driver_root
from dradriver.gpu.interface import GpuLib
from dradriver.gpu.inventory import Inventory, MigMode, discover
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.nvidia_install.driver_root import discover_driver_root
from dradriver.plugin.cluster.claim_status import ClaimStatusWriter
from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin, KubeletPluginOptions
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec

DRIVER = "gpu.dradriver.dev"

# Two whole GPUs that share an NVLink domain: what a user would write for a 2-GPU training job.
DEFAULT_CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "two-nvlinked-gpus", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": 2}}],
            "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
        }
    },
}


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Discover a simulated node, publish its ResourceSlices to an in-memory API server, allocate a "
        "claim, then register with a kubelet-like client over real gRPC sockets, prepare the claim "
        "(printing its CDI spec) and unprepare it."
    )
    gpus.add_flags(parser)
    parser.set_defaults(gpu_backend="sim")
    NODE_NAME.add(parser, default="demo-node", help="the simulated node's name")
    parser.add_argument(
        "--claim",
        metavar="FILE",
        help="a ResourceClaim or ResourceClaimTemplate (YAML) to allocate and prepare "
        "(default: two GPUs on one NVLink domain)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    node = args.node_name
    mig_mode = MigMode(args.mig_mode)
    claim = _load_claim(Path(args.claim)) if args.claim else json.loads(json.dumps(DEFAULT_CLAIM))

    gpulib, _ = open_gpu_backend(args.gpu_backend, sim_profile=args.sim_profile, node_name=node)
    try:
        return _demo(node, mig_mode, claim, gpulib, args)
    finally:
        gpulib.close()


def _demo(node: str, mig_mode: MigMode, claim: dict[str, Any], gpulib: GpuLib, args: argparse.Namespace) -> int:
    inventory = discover(gpulib)
    _step(f"1. Discovered node {node} ({args.gpu_backend}: {args.sim_profile})")
    print(render_table(inventory, mig_mode), end="")

    cluster = MemoryCluster()
    cluster.add_node(node)
    specs = build_slice_specs(inventory, SliceSettings(driver=DRIVER, mig_mode=mig_mode))
    publisher = Publisher(
        cluster,
        PublisherOptions(driver=DRIVER, node_name=node, node_uid=cluster.get_node(node)["metadata"]["uid"]),
        pools={node: [SliceSpec.of(s.get("devices", ()), s.get("sharedCounters", ())) for s in specs]},
    )
    publisher.reconcile()
    _step("2. Published ResourceSlices to the (in-memory) API server")
    invalid = publisher.status.invalid_pools
    if invalid:
        print(f"the slices break the API server's rules, nothing was published: {invalid}")
        return 1
    slices = cluster.slice_objects()
    devices = sum(len(s["spec"].get("devices", [])) for s in slices)
    print(
        f"{len(slices)} slice{'s' if len(slices) != 1 else ''}, {devices} devices, pool {node} generation "
        f"{slices[0]['spec']['pool']['generation']}; every slice passed the API server's validation rules"
    )

    _step(f"3. Allocated claim {claim['metadata']['namespace']}/{claim['metadata']['name']} as the scheduler would")
    try:
        allocation = allocate(claim, slices=slices, classes=BUILTIN_CLASSES, node=node)
    except (Unsatisfiable, AllocationError) as err:
        print(f"the claim does not fit this node: {err}\n(try `dradriver explain` for the details)")
        return 1
    claim["status"] = {"allocation": allocation}
    stored = cluster.add_resource_claim(claim)
    for entry in allocation["devices"]["results"]:
        print(f"request {entry['request']}: {entry['device']}")

    root = Path(tempfile.mkdtemp(prefix="dradriver-demo-", dir="/tmp"))
    try:
        return _prepare_and_unprepare(
            root, node, inventory=inventory, gpulib=gpulib, mig_mode=mig_mode, cluster=cluster, claim=stored
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _prepare_and_unprepare(
    root: Path,
    node: str,
    *,
    inventory: Inventory,
    gpulib: GpuLib,
    mig_mode: MigMode,
    cluster: MemoryCluster,
    claim: dict[str, Any],
) -> int:
    stub_root = simulated_driver_root(root / "driver-root", inventory.driver_version)
    driver_root = discover_driver_root(host_root=str(stub_root), version=inventory.driver_version)
    cdi = CdiWriter(root / "cdi", host_path=lambda _path: "/dev/null", driver_root=driver_root)
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool=node, mig_mode=mig_mode), inventory=inventory, cdi=cdi, gpulib=gpulib
    )
    claim_status = ClaimStatusWriter(cluster, driver_name=DRIVER, node_name=node)
    plugin = KubeletPlugin(
        KubeletPluginOptions(
            driver_name=DRIVER, node_name=node, registry_dir=root / "registry", plugin_dir=root / "plugin"
        ),
        handler=driver,
        claim_source=cluster,
        claim_status=claim_status,
    )
    ref = Claim(claim["metadata"]["namespace"], claim["metadata"]["name"], claim["metadata"]["uid"])
    with plugin, KubeletClient(root / "registry").register() as kubelet:
        _step("4. Registered with the kubelet over gRPC")
        print(f"plugin {kubelet.info.name}, endpoint {kubelet.info.endpoint}, the kubelet chose {kubelet.version}")

        prepared = kubelet.prepare([ref])[ref.uid]
        _step("5. NodePrepareResources")
        if prepared.error:
            print(f"prepare failed: {prepared.error}")
            return 1
        for device in prepared.devices:
            print(f"{device['device_name']}: {', '.join(device['cdi_device_ids'])}")
        spec_path = cdi.spec_path(ref.uid)
        print(f"CDI spec {spec_path.name}:")
        # The driver writes specs on one line (the C encoder is faster); a person reads them indented.
        print(json.dumps(json.loads(spec_path.read_text()), indent=2))
        claim_status.wait_idle(10)
        stored = cluster.get_resource_claim(ref.namespace, ref.name)
        print("claim status.devices:")
        print(json.dumps(stored.get("status", {}).get("devices", []), indent=2))

        errors = kubelet.unprepare([ref])
        _step("6. NodeUnprepareResources")
        print(errors[ref.uid] or f"done; CDI spec removed: {not spec_path.exists()}")
    return 0


def _load_claim(path: Path) -> dict[str, Any]:
    """The first ResourceClaim (or a claim made from the first ResourceClaimTemplate) of the file, checked as
    the API server would check it."""
    inputs = Inputs()
    load([str(path)], inputs, want=("ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourceSlice"))
    documents = inputs.of_kind("ResourceClaim", "ResourceClaimTemplate")
    if not documents:
        found = f" ({inputs.errors[0]})" if inputs.errors else ""
        raise ConfigError(f"--claim {path}: no ResourceClaim or ResourceClaimTemplate usable in the file{found}")
    problems = check_claim(documents[0], {c["metadata"]["name"] for c in BUILTIN_CLASSES})
    if problems:
        raise ConfigError(f"--claim {problems[0]}")
    document = documents[0].obj
    if document["kind"] == "ResourceClaim":
        return dict(document)
    metadata = document["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{metadata['name']}-demo", "namespace": metadata["namespace"]},
        "spec": document["spec"]["spec"],
    }


def _step(title: str) -> None:
    print(f"\n==> {title}", file=sys.stdout)
