"""``--node-name``, ``--pod-uid``: which node a command serves, and from which pod."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import dns_subdomain
from dradriver.errors import ConfigError
from dradriver.plugin.kubeletplugin.plugin import check_pod_uid

NODE_NAME = EnvFlag(
    flag="--node-name", env="NODE_NAME", type=dns_subdomain("node name"), help="this node's name (required)"
)
POD_UID = EnvFlag(
    flag="--pod-uid",
    env="POD_UID",
    help="this pod's UID (downward API metadata.uid): per-pod socket names, so a rolling update can start "
    "the new pod before the old one stops (kubelet 1.33+); unset: fixed names, one instance per node",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The node's name and the pod's UID, as the DaemonSet passes them from the downward API."""
    NODE_NAME.add(parser)
    POD_UID.add(parser)


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    """This node's name ("" when not given) and this pod's UID (None: one instance per node, fixed names)."""

    name: str
    pod_uid: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NodeOptions:
        return cls(name=NODE_NAME.value(args) or "", pod_uid=POD_UID.value(args) or None)

    @property
    def rolling_update(self) -> bool:
        """Whether an old and a new pod may serve the node at once (they then serialise prepares, share state)."""
        return self.pod_uid is not None

    def check(self) -> None:
        """The name is required (slices, claims and health all name the node); a pod UID must be safe in names."""
        if not self.name:
            raise ConfigError("--node-name (or NODE_NAME) is required: set it from the pod's spec.nodeName")
        if self.pod_uid is not None:
            check_pod_uid(self.pod_uid)
