"""Publish one GPU through the slice publisher into the in-memory cluster, then hand it an invalid device name.

    .venv/bin/python examples/python/publish_one_device.py

What docs/publishing.md shows: two reconcile passes (the second writes nothing), the slice as stored, and the
publisher refusing a pool whose device name is not a DNS label (the error names the field and the rule)."""

from __future__ import annotations

import json
import logging

from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.resourceslice.publisher import Publisher, PublisherOptions, SliceSpec

NODE = "node-1"


def main() -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    cluster = MemoryCluster()
    cluster.add_node(NODE, uid="4f0c7d2e-0000-4000-8000-000000000001")
    gpu = {
        "name": "gpu-0000-07-00-0",
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    publisher = Publisher(
        cluster, PublisherOptions(driver="gpu.dradriver.dev", node_name=NODE), pools={NODE: [SliceSpec.of([gpu])]}
    )
    print(publisher.reconcile())
    print(publisher.reconcile())
    [stored] = cluster.slice_objects()
    print(
        json.dumps(
            {"metadata": {k: stored["metadata"][k] for k in ("name", "ownerReferences")}, "spec": stored["spec"]},
            indent=2,
        )
    )
    publisher.update({NODE: [SliceSpec.of([{**gpu, "name": "GPU_0"}])]})
    publisher.reconcile()


if __name__ == "__main__":
    main()
