"""Reading the cluster's minor version from /version (the slice layout depends on it)."""

from __future__ import annotations

import pytest

from dradriver.plugin.cluster import ClusterError, kubernetes_minor_version
from dradriver.plugin.cluster.memory import MemoryCluster


@pytest.mark.parametrize(
    ("info", "version"),
    [
        ({"major": "1", "minor": "34", "gitVersion": "v1.34.1"}, "1.34"),
        ({"major": "1", "minor": "35+", "gitVersion": "v1.35.2-gke.1045000"}, "1.35"),
        ({"major": "1", "minor": "36+"}, "1.36"),
    ],
)
def test_the_minor_version_comes_from_the_version_document(info: dict[str, str], version: str) -> None:
    cluster = MemoryCluster()
    cluster.version = info
    assert kubernetes_minor_version(cluster.server_version()) == version


def test_a_version_document_without_a_version_names_the_flag() -> None:
    with pytest.raises(ClusterError, match="--kubernetes-version"):
        kubernetes_minor_version({"platform": "linux/amd64"})
