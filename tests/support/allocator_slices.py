"""Hand-made ResourceSlices in the shape of /work/notes/device-schema.md, for allocator tests and benchmarks.

``tests/fixtures/slices/*.yaml`` are written by ``python tests/support/allocator_slices.py``; tests read the
YAML, benchmarks call ``node_slices`` directly to build many nodes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DRIVER = "gpu.dradriver.dev"
A100_BDFS = [
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
]
ROOTS = [
    "pci0000:00",
    "pci0000:00",
    "pci0000:40",
    "pci0000:40",
    "pci0000:80",
    "pci0000:80",
    "pci0000:c0",
    "pci0000:c0",
]

# profile: (multiprocessors, memory GiB, copy engines, decoders, jpeg, ofa, memory slices, placements)
A100_80GB_PROFILES: dict[str, tuple[int, int, int, int, int, int, int, list[int]]] = {
    "1g.10gb": (14, 10, 1, 0, 0, 0, 1, [0, 1, 2, 3, 4, 5, 6]),
    "1g.10gb+me": (14, 10, 1, 1, 1, 1, 1, [0, 1, 2, 3, 4, 5, 6]),
    "1g.20gb": (14, 20, 1, 1, 0, 0, 2, [0, 2, 4, 6]),
    "2g.20gb": (28, 20, 2, 1, 0, 0, 2, [0, 2, 4]),
    "3g.40gb": (42, 40, 3, 2, 0, 0, 4, [0, 4]),
    "4g.40gb": (56, 40, 4, 2, 0, 0, 4, [0]),
    "7g.80gb": (98, 80, 7, 5, 1, 1, 8, [0]),
}
FULL = {
    "memory": 80,
    "multiprocessors": 108,
    "copy-engines": 7,
    "decoders": 5,
    "jpeg-engines": 1,
    "ofa-engines": 1,
}


def _s(value: str) -> dict[str, str]:
    return {"string": value}


def gpu_name(bdf: str) -> str:
    return "gpu-" + bdf.replace(":", "-").replace(".", "-")


def common_attributes(index: int, node: str, product: str, nvlink: str) -> dict[str, Any]:
    bdf = A100_BDFS[index]
    return {
        "productName": _s(product),
        "brand": _s("Nvidia"),
        "architecture": _s("Ampere"),
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "580.65.6"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "nvlinkDomain": _s(nvlink),
        "resource.kubernetes.io/pciBusID": _s(bdf),
        "resource.kubernetes.io/pcieRoot": _s(ROOTS[index]),
        "resource.kubernetes.io/numaNode": {"int": 0 if index < 4 else 1},
    }


def full_gpu(
    index: int,
    node: str,
    *,
    product: str = "NVIDIA A100-SXM4-80GB",
    memory: str = "80Gi",
    nvlink: str | None = None,
    counters: bool = False,
) -> dict[str, Any]:
    bdf = A100_BDFS[index]
    attributes = {
        "type": _s("gpu"),
        "uuid": _s(f"GPU-{node}-{index:04d}"),
        **common_attributes(index, node, product, nvlink or f"nvswitch-{node}"),
        "migCapable": {"bool": True},
    }
    device: dict[str, Any] = {
        "name": gpu_name(bdf),
        "attributes": attributes,
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": "108"}},
    }
    if counters:
        device["consumesCounters"] = [
            {
                "counterSet": f"{gpu_name(bdf)}-counters",
                "counters": {
                    **{k: {"value": f"{v}Gi" if k == "memory" else str(v)} for k, v in FULL.items()},
                    **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
                },
            }
        ]
    return device


def mig_devices(index: int, node: str) -> list[dict[str, Any]]:
    bdf = A100_BDFS[index]
    parent = gpu_name(bdf)
    devices = []
    for profile, (sms, mem, ce, dec, jpeg, ofa, slices, starts) in A100_80GB_PROFILES.items():
        for start in starts:
            name = f"{parent}-mig-{''.join(c for c in profile if c.isalnum())}-{start}"
            counters = {
                "memory": {"value": f"{mem}Gi"},
                "multiprocessors": {"value": str(sms)},
                "copy-engines": {"value": str(ce)},
                "decoders": {"value": str(dec)},
                "jpeg-engines": {"value": str(jpeg)},
                "ofa-engines": {"value": str(ofa)},
                **{f"memory-slice-{s}": {"value": "1"} for s in range(start, start + slices)},
            }
            devices.append(
                {
                    "name": name,
                    "attributes": {
                        "type": _s("mig"),
                        "parentUUID": _s(f"GPU-{node}-{index:04d}"),
                        "profile": _s(profile),
                        "placementStart": {"int": start},
                        **common_attributes(index, node, "NVIDIA A100-SXM4-80GB", f"nvswitch-{node}"),
                    },
                    "capacity": {
                        "memory": {"value": f"{mem}Gi"},
                        "multiprocessors": {"value": str(sms)},
                        "copyEngines": {"value": str(ce)},
                        "decoders": {"value": str(dec)},
                        "encoders": {"value": "0"},
                        "jpegEngines": {"value": str(jpeg)},
                        "ofaEngines": {"value": str(ofa)},
                    },
                    "consumesCounters": [{"counterSet": f"{parent}-counters", "counters": counters}],
                }
            )
    return devices


def counter_set(index: int) -> dict[str, Any]:
    parent = gpu_name(A100_BDFS[index])
    return {
        "name": f"{parent}-counters",
        "counters": {
            **{k: {"value": f"{v}Gi" if k == "memory" else str(v)} for k, v in FULL.items()},
            **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
        },
    }


def _slice(name: str, node: str, count: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            **spec,
        },
    }


def node_slices(node: str, *, gpus: int = 8, mig_gpus: int = 0) -> list[dict[str, Any]]:
    """Slices of a DGX A100 80GB node: ``gpus`` whole GPUs, the first ``mig_gpus`` with dynamic MIG
    partitions and shared counters (one devices slice per two MIG GPUs, one counters slice)."""
    slices = []
    whole = [full_gpu(i, node) for i in range(mig_gpus, gpus)]
    mig_groups = [list(range(i, min(i + 2, mig_gpus))) for i in range(0, mig_gpus, 2)]
    count = (1 if whole else 0) + len(mig_groups) + (1 if mig_gpus else 0)
    if whole:
        slices.append(_slice(f"{node}-{DRIVER}-gpus", node, count, devices=whole))
    for n, group in enumerate(mig_groups):
        devices = []
        for i in group:
            devices.append(full_gpu(i, node, counters=True))
            devices += mig_devices(i, node)
        slices.append(_slice(f"{node}-{DRIVER}-mig-{n}", node, count, devices=devices))
    if mig_gpus:
        slices.append(
            _slice(
                f"{node}-{DRIVER}-counters",
                node,
                count,
                sharedCounters=[counter_set(i) for i in range(mig_gpus)],
            )
        )
    return slices


def main(out: Path) -> None:
    import yaml

    fixtures = {
        "dgx-a100-80gb.yaml": node_slices("node-a"),
        "dgx-a100-80gb-mig.yaml": node_slices("node-m", gpus=2, mig_gpus=2),
    }
    for name, docs in fixtures.items():
        (out / name).write_text(
            "# Generated by tests/support/allocator_slices.py; do not edit.\n"
            + yaml.safe_dump_all(docs, sort_keys=False)
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "fixtures" / "slices")
