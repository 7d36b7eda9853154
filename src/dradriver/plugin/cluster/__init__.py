"""Cluster access for the plugin layer (as upstream's client): one port, two adapters.

- :mod:`~dradriver.plugin.cluster.port`: the ``Cluster`` protocol, watch events and the error hierarchy,
  re-exported here (importing this package does not import the ``kubernetes`` client).
- :mod:`~dradriver.plugin.cluster.kube`: ``KubeCluster`` over the real ``kubernetes`` client.
- :mod:`~dradriver.plugin.cluster.memory`: ``MemoryCluster``, a dict-backed cluster for the demo and tests.
- :mod:`~dradriver.plugin.cluster.claim_status`: writes a prepared claim's ``status.devices`` through the port.
"""

from dradriver.plugin.cluster.port import (
    RESOURCE_SLICE_API_VERSION,
    ApiUnavailableError,
    Cluster,
    ClusterError,
    ConflictError,
    ForbiddenError,
    InvalidObjectError,
    JsonObject,
    NotFoundError,
    WatchEvent,
    WatchEventType,
    WatchExpiredError,
    WatchStream,
    describe,
    kubernetes_minor_version,
)

__all__ = [
    "RESOURCE_SLICE_API_VERSION",
    "ApiUnavailableError",
    "Cluster",
    "ClusterError",
    "ConflictError",
    "ForbiddenError",
    "InvalidObjectError",
    "JsonObject",
    "NotFoundError",
    "WatchEvent",
    "WatchEventType",
    "WatchExpiredError",
    "WatchStream",
    "describe",
    "kubernetes_minor_version",
]
