"""``--node-labels``, ``--node-labels-mig-strategy``: whether ``run`` keeps GPU Feature Discovery's labels on its
own Node, and how MIG devices are labelled (docs/node-labels.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.driver.publish.node_labels import MigStrategy

NONE, GFD = "none", "gfd"
NODE_LABELS = EnvFlag(
    flag="--node-labels",
    env="DRADRIVER_NODE_LABELS",
    default=NONE,
    choices=(NONE, GFD),
    help="gfd: keep the labels NVIDIA's GPU Feature Discovery writes (nvidia.com/gpu.product, gpu.count, "
    "cuda.driver-version.*, ...) on this node's Node, current at every rescan (needs patch on nodes); none: write "
    "none, and remove those an earlier run wrote",
)
MIG_STRATEGY = EnvFlag(
    flag="--node-labels-mig-strategy",
    env="DRADRIVER_NODE_LABELS_MIG_STRATEGY",
    default=MigStrategy.NONE.value,
    choices=tuple(s.value for s in MigStrategy),
    help="GPU Feature Discovery's --mig-strategy for the labels: none (whole GPUs only), single (MIG devices "
    "labelled as nvidia.com/gpu) or mixed (nvidia.com/mig-<profile>.* per profile)",
)


def add_flags(parser: argparse.ArgumentParser, *, enable: bool = True) -> None:
    """The node label flags in a group of their own; without ``enable`` only the MIG strategy (``node-labels
    show``, which always computes them)."""
    group = parser.add_argument_group("node labels (GPU Feature Discovery's)")
    if enable:
        NODE_LABELS.add(group)
    MIG_STRATEGY.add(group)


@dataclass(frozen=True, kw_only=True)
class NodeLabelOptions:
    """``enabled`` (``--node-labels gfd``) and the MIG strategy of the labels."""

    enabled: bool = False
    mig_strategy: MigStrategy = MigStrategy.NONE

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NodeLabelOptions:
        return cls(enabled=NODE_LABELS.value(args) == GFD, mig_strategy=MigStrategy(MIG_STRATEGY.value(args)))
