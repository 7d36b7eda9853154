"""``--kubeconfig``, ``--context``, ``--kube-api-qps``, ``--kube-api-burst``: how a command reaches the API server.

Every command that talks to a cluster finds its configuration by one rule (``--kubeconfig``, else
``$KUBECONFIG``, else in a pod its service account, else ``~/.kube/config``: :mod:`dradriver.plugin.cluster.kubeconfig`)
and refuses an unusable one with the same one-line error, before it starts anything (:meth:`KubeClientOptions.check`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from dradriver.cli.flags.env import EnvFlag
from dradriver.cli.flags.values import non_negative_float, positive_int
from dradriver.plugin.cluster.kubeconfig import RULE, ClientSource, find_source

if TYPE_CHECKING:
    from dradriver.plugin.cluster.kube import KubeCluster
    from dradriver.plugin.cluster.transport import Endpoint, Transport

# Above client-go's 5/10: each pod start costs a claim GET and a status write, and a node starting 50 pods at once
# must not queue them behind the limit; it still bounds a runaway loop to a rate the API server shrugs off.
DEFAULT_KUBE_API_QPS, DEFAULT_KUBE_API_BURST = 50.0, 100

KUBECONFIG = EnvFlag(
    flag="--kubeconfig",
    env="DRADRIVER_KUBECONFIG",
    help=f"kubeconfig file; {RULE}",
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


def add_flags(
    parser: argparse.ArgumentParser,
    *,
    kubeconfig_help: str | None = None,
    context: bool = False,
    rate_limits: bool = True,
) -> None:
    """The kubeconfig (``kubeconfig_help``: what the command does with it; the rule is added to it), with
    ``context`` the kubeconfig's context to use, and (``rate_limits``) the client's request rate."""
    KUBECONFIG.add(parser, help=f"{kubeconfig_help}; {RULE}" if kubeconfig_help else None)
    if context:
        # Chosen per call, as kubectl's --context: no environment variable.
        parser.add_argument(
            "--context",
            help="the kubeconfig's context to use (default: its current-context); given, a pod's service account "
            "is passed over (it has no contexts), as kubectl does",
        )
    if rate_limits:
        KUBE_API_QPS.add(parser)
        KUBE_API_BURST.add(parser)


@dataclass(frozen=True, kw_only=True)
class KubeClientOptions:
    """The kubeconfig file (None: the rest of the rule), its context (None: its current-context) and the
    request rate."""

    kubeconfig: str | None = None
    context: str | None = None
    qps: float = DEFAULT_KUBE_API_QPS
    burst: int = DEFAULT_KUBE_API_BURST

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KubeClientOptions:
        return cls(
            kubeconfig=KUBECONFIG.value(args),
            context=vars(args).get("context"),
            qps=KUBE_API_QPS.value(args),
            burst=KUBE_API_BURST.value(args),
        )

    @property
    def source(self) -> ClientSource | None:
        """Where the configuration comes from by the rule; None when nothing is there."""
        return find_source(self.kubeconfig, context=self.context)

    @cached_property
    def endpoint(self) -> Endpoint:
        """The API server and how to reach it, loaded once by the rule (ConfigError when it cannot be)."""
        from dradriver.plugin.cluster.kube import load_endpoint  # the HTTPS stack only where a command connects

        return load_endpoint(self.kubeconfig, context=self.context)

    def check(self) -> None:
        """Load the configuration now: a missing, unreadable or unusable kubeconfig (or none at all) is refused
        before the command starts anything; :meth:`transport` and :meth:`connect` use what was loaded."""
        _ = self.endpoint

    def transport(self) -> Transport:
        """A transport to the API server (its own connections)."""
        from dradriver.plugin.cluster.transport import Transport

        return Transport(self.endpoint)

    def connect(self) -> KubeCluster:
        """The cluster adapter, its requests paced by the rate limits."""
        from dradriver.plugin.cluster.kube import KubeCluster
        from dradriver.plugin.cluster.rate_limit import TokenBucket

        limit = TokenBucket(self.qps, self.burst) if self.qps > 0 else None
        return KubeCluster(self.transport(), rate_limit=limit)
