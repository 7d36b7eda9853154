"""Good and bad opaque configs, shared by the pydantic tests and the admission policy's CEL test.

Each bad config comes with the text its error names (the field path and what is allowed)."""

from __future__ import annotations

from typing import Any

API = "gpu.dradriver.dev/v1alpha1"


def gpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def mig(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


GOOD: list[dict[str, Any]] = [
    gpu(),
    gpu(sharing={"strategy": "TimeSlicing"}),
    gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),  # NVIDIA's spelling
    gpu(sharing={"strategy": "MPS"}),
    gpu(
        sharing={
            "strategy": "MPS",
            "mps": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "8Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "4Gi"},
            },
        }
    ),
    gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 0}}),
    gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 100}}),
    gpu(computeMode="Default"),
    gpu(computeMode="ExclusiveProcess"),
    gpu(computeMode="Prohibited"),
    gpu(sharing={"strategy": "MPS"}, computeMode="ExclusiveProcess"),
    gpu(sharing={"strategy": "TimeSlicing"}, computeMode="Default"),
    mig(),
    mig(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}),
]

BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
        "apiVersion: 'resource.nvidia.com/v1beta1' is not supported; allowed: gpu.dradriver.dev/v1alpha1",
    ),
    (
        {"apiVersion": API, "kind": "VfioDeviceConfig"},
        "kind: 'VfioDeviceConfig' is not a kind of gpu.dradriver.dev/v1alpha1; allowed: GpuConfig, MigDeviceConfig",
    ),
    (gpu(bogus=1), "GpuConfig: bogus: unknown field; allowed fields here: apiVersion, kind, sharing, computeMode"),
    (
        gpu(sharing={"strategy": "SpacePartitioning"}),
        "sharing.strategy: 'SpacePartitioning' is not allowed; allowed: 'TimeSlicing' or 'MPS'",
    ),
    (gpu(sharing={}), "sharing.strategy: required field is missing"),
    (
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Longer"}}),
        "sharing.timeSlicing.interval: 'Longer' is not allowed; allowed: 'Default', 'Short', 'Medium' or 'Long'",
    ),
    (
        gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long", "slices": 2}}),
        "sharing.timeSlicing.slices: unknown field; allowed fields here: interval",
    ),
    (gpu(sharing={"strategy": "TimeSlicing", "mps": {}}), "sharing: mps is set but strategy is TimeSlicing"),
    (gpu(sharing={"strategy": "MPS", "timeSlicing": {}}), "sharing: timeSlicing is set but strategy is MPS"),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 101}}),
        "sharing.mps.defaultActiveThreadPercentage: 101 is out of range; allowed: 0 to 100",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": -1}}),
        "sharing.mps.defaultActiveThreadPercentage: -1 is out of range; allowed: 0 to 100",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": "50"}}),
        "sharing.mps.defaultActiveThreadPercentage: input should be a valid integer",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "8GB!"}}),
        "sharing.mps.defaultPinnedDeviceMemoryLimit: '8GB!' is not a quantity",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
        "sharing.mps.defaultPinnedDeviceMemoryLimit: the limit 512Ki is below 1Mi",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}}),
        "sharing.mps.defaultPerDevicePinnedMemoryLimit: 'lots' is not a quantity",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"multiUser": True}}),
        "sharing.mps.multiUser: unknown field; allowed fields here: defaultActiveThreadPercentage, "
        "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit",
    ),
    (
        gpu(computeMode="Exclusive"),
        "computeMode: 'Exclusive' is not allowed; allowed: 'Default', 'ExclusiveProcess' or 'Prohibited'",
    ),
    (gpu(sharing={"strategy": "MPS"}, computeMode="Prohibited"), "computeMode Prohibited cannot be used with MPS"),
    (
        gpu(sharing={"strategy": "TimeSlicing"}, computeMode="ExclusiveProcess"),
        "computeMode ExclusiveProcess cannot be used with TimeSlicing",
    ),
    (mig(sharing={"strategy": "TimeSlicing"}), "MigDeviceConfig: sharing: time-slicing is not a MIG setting"),
    (mig(sharing={"strategy": "MPS", "timeSlicing": {"interval": "Long"}}), "time-slicing is not a MIG setting"),
    (
        mig(computeMode="Default"),
        "MigDeviceConfig: computeMode: unknown field; allowed fields here: apiVersion, kind, sharing",
    ),
]
