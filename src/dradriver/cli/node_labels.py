"""``dradriver node-labels show | remove``: the GPU Feature Discovery labels ``run --node-labels gfd`` keeps on its
Node (docs/node-labels.md): which it would write for this node, and taking them off nodes again (the chart's
uninstall hook runs ``remove --all-nodes``)."""

from __future__ import annotations

import argparse
import json
import sys

from dradriver.cli.flags import gpus, kube_client, node_labels
from dradriver.cli.flags.kube_client import KubeClientOptions
from dradriver.cli.flags.node import NODE_NAME
from dradriver.cli.flags.output import add_output_option
from dradriver.cli.flags.publishing import DRIVER_NAME
from dradriver.cli.flags.sharing import CONSUMABLE_SHARES, GPU_SHARING
from dradriver.driver.publish.node_labeler import HostFacts, remove_written
from dradriver.driver.publish.node_labels import LabelOptions, annotation_key, gfd_labels
from dradriver.errors import ConfigError, DradriverError
from dradriver.plugin.cluster import ClusterError


def register(parser: argparse.ArgumentParser) -> None:
    """The ``show`` and ``remove`` subcommands on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "GPU Feature Discovery's node labels, as `dradriver run --node-labels gfd` keeps them on its Node: show "
        "those it would write for this node, or remove those it wrote from nodes."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    show = actions.add_parser("show", help="print the labels the driver would write for this node (no cluster)")
    register_show(show)
    remove = actions.add_parser("remove", help="remove the labels the driver wrote from nodes (helm uninstall)")
    register_remove(remove)


def register_show(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Discover the GPUs (through NVML, or a simulated node) and print the labels `run --node-labels gfd` would "
        "keep on this node's Node, sorted; no cluster is needed."
    )
    gpus.add_flags(parser)
    NODE_NAME.add(parser, default="sim-node", help="node name (names the simulated node's GPUs)")
    node_labels.add_flags(parser, enable=False)
    GPU_SHARING.add(parser, help="as run's: consumable shares GPUs through MPS (nvidia.com/mps.capable)")
    CONSUMABLE_SHARES.add(parser, help="as run's: set, claims may share GPUs through MPS (nvidia.com/mps.capable)")
    add_output_option(parser, ("text", "json"), "text")
    parser.set_defaults(handler=show)


def register_remove(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Remove, from each node named (or every node), the labels the driver wrote there, as its annotation "
        "<driver name>/node-labels lists them, and the annotation; other labels stay. Prints one line per node "
        "changed."
    )
    parser.add_argument("nodes", nargs="*", metavar="NODE", help="the nodes to take the labels off")
    parser.add_argument("--all-nodes", action="store_true", help="every node carrying the annotation")
    DRIVER_NAME.add(parser, help="the driver whose labels to remove (its annotation's prefix)")
    kube_client.add_flags(parser, kubeconfig_help="the cluster to remove the labels from", context=True)
    parser.set_defaults(handler=remove)


def show(args: argparse.Namespace) -> int:
    from dradriver.cli.inventory import load_inventory  # the same discovery as `inventory`

    inventory = load_inventory(args)
    options = node_labels.NodeLabelOptions.from_args(args)
    host = HostFacts(None) if args.gpu_backend == "sim" else HostFacts()
    labels = gfd_labels(
        inventory,
        LabelOptions(
            mig_strategy=options.mig_strategy,
            mps_sharing=GPU_SHARING.value(args) == "consumable" or bool(CONSUMABLE_SHARES.value(args)),
            machine_type=host.machine_type(),
            pci_classes=host.pci_classes(g.info.pci_bus_id for g in inventory.gpus),
        ),
    )
    if args.output == "json":
        print(json.dumps(dict(sorted(labels.items())), indent=2))
    else:
        sys.stdout.write("".join(f"{key}={value}\n" for key, value in sorted(labels.items())))
    return 0


def remove(args: argparse.Namespace) -> int:
    if bool(args.nodes) == bool(args.all_nodes):
        raise ConfigError("name the nodes to remove the labels from, or give --all-nodes (not both)")
    kube = KubeClientOptions.from_args(args)
    kube.check()
    driver = DRIVER_NAME.value(args)
    cluster = kube.connect()
    try:
        names = args.nodes or sorted(
            str(n["metadata"]["name"])
            for n in cluster.list_nodes()
            if annotation_key(driver) in ((n.get("metadata") or {}).get("annotations") or {})
        )
        failed: list[str] = []
        for name in names:
            try:
                removed = remove_written(cluster, name, driver)
            except ClusterError as err:
                print(f"node/{name}: cannot remove the labels: {err}", file=sys.stderr)
                failed.append(name)
                continue
            if removed is not None:
                print(f"node/{name}: removed {len(removed)} labels and the annotation {annotation_key(driver)}")
    finally:
        cluster.close()
    if failed:
        raise DradriverError(f"the labels stay on {', '.join(failed)}: see the errors above, then run this again")
    return 0
