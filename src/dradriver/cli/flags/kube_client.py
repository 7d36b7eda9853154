"""``--kubeconfig``, ``--kube-api-qps``, ``--kube-api-burst``: how a command reaches the API server."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import non_negative_float, positive_int
from dradriver.errors import ConfigError
from dradriver.inputs import load_yaml_file, path_exists, type_name

if TYPE_CHECKING:
    from dradriver.plugin.cluster.kube import KubeCluster

# Above client-go's 5/10: each pod start costs a claim GET and a status write, and a node starting 50 pods at once
# must not queue them behind the limit; it still bounds a runaway loop to a rate the API server shrugs off.
DEFAULT_KUBE_API_QPS, DEFAULT_KUBE_API_BURST = 50.0, 100

KUBECONFIG = EnvFlag(
    flag="--kubeconfig",
    env="DRADRIVER_KUBECONFIG",
    help="kubeconfig file; default: in-cluster service account, then $KUBECONFIG",
)
KUBE_API_QPS = EnvFlag(
    flag="--kube-api-qps",
    env="DRADRIVER_KUBE_API_QPS",
    default=DEFAULT_KUBE_API_QPS,
    type=non_negative_float,
    metavar="QPS",
    help="requests a second to the API server after a burst (client-go's QPS); 0: no limit",
)
KUBE_API_BURST = EnvFlag(
    flag="--kube-api-burst",
    env="DRADRIVER_KUBE_API_BURST",
    default=DEFAULT_KUBE_API_BURST,
    type=positive_int,
    metavar="N",
    help="requests to the API server that may go at once before --kube-api-qps paces them",
)
# How the commands that run in the cluster only (the ComputeDomain controller and daemons) describe it.
IN_CLUSTER_HELP = "kubeconfig file (default: in-cluster)"


def add_flags(parser: argparse.ArgumentParser, *, kubeconfig_help: str | None = None, rate_limits: bool = True) -> None:
    """The kubeconfig (its help worded for the command), and (``rate_limits``) the client's request rate."""
    KUBECONFIG.add(parser, help=kubeconfig_help)
    if rate_limits:
        KUBE_API_QPS.add(parser)
        KUBE_API_BURST.add(parser)


@dataclass(frozen=True, kw_only=True)
class KubeClientOptions:
    """The kubeconfig file (None: the in-cluster service account, then ``$KUBECONFIG``) and the request rate."""

    kubeconfig: str | None = None
    qps: float = DEFAULT_KUBE_API_QPS
    burst: int = DEFAULT_KUBE_API_BURST

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KubeClientOptions:
        return cls(kubeconfig=KUBECONFIG.value(args), qps=KUBE_API_QPS.value(args), burst=KUBE_API_BURST.value(args))

    def check(self) -> None:
        """Refuse a kubeconfig file the client could not read (see :func:`check_kubeconfig`)."""
        check_kubeconfig(KUBECONFIG.flag, self.kubeconfig)

    def connect(self) -> KubeCluster:
        """The cluster adapter, its requests paced by the rate limits."""
        from dradriver.plugin.cluster.kube import KubeCluster  # its transport loads only where a command connects

        return KubeCluster.from_kubeconfig(self.kubeconfig, qps=self.qps, burst=self.burst)


def check_kubeconfig(flag: str, path: str | None) -> None:
    """Read the kubeconfig files the Kubernetes client will read (``path``, else ``$KUBECONFIG`` or
    ``~/.kube/config`` outside a pod) through the bounded loader first, so that a huge, binary or hostile file
    is refused with one line before the client (which reads files whole) sees it."""
    if path:
        files, source = [Path(path)], flag
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        return  # the in-cluster service account: no file
    elif os.environ.get("KUBECONFIG"):
        files, source = [Path(p) for p in os.environ["KUBECONFIG"].split(os.pathsep) if p], "KUBECONFIG"
    else:
        files, source = [p for p in [Path.home() / ".kube" / "config"] if path_exists(p)], "~/.kube/config"
    for file in files:
        try:
            documents = load_yaml_file(file)
        except ConfigError as err:
            fix = "" if ";" in str(err) else f"; point {source} at a readable kubeconfig file"
            raise ConfigError(f"{source} {err}{fix}") from None
        if len(documents) != 1 or not isinstance(documents[0], dict):
            got = f"{len(documents)} documents" if len(documents) != 1 else type_name(documents[0])
            raise ConfigError(f"{source} {file}: expected one kubeconfig mapping (kind: Config), got {got}")
