"""Good and bad opaque configs, shared by the pydantic tests and the admission policy's CEL test.

Each bad config comes with the text its error names (the field path and what is allowed)."""

from __future__ import annotations

from typing import Any

API = "gpu.dradriver.dev/v1alpha1"
NVIDIA = "resource.nvidia.com/v1beta1"


def gpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def mig(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


def nv_gpu(**fields: Any) -> dict[str, Any]:
    """A GpuConfig in NVIDIA's version, as written for NVIDIA's driver."""
    return {"apiVersion": NVIDIA, "kind": "GpuConfig", **fields}


def nv_mig(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": NVIDIA, "kind": "MigDeviceConfig", **fields}


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
    gpu(sharing={"strategy": "MPS", "mps": {"multiUser": True}}),
    # NVIDIA's version: every field of its GpuConfig and MigDeviceConfig.
    nv_gpu(),
    nv_gpu(sharing={"strategy": "TimeSlicing"}),
    nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
    nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    nv_gpu(sharing={"strategy": "MPS"}),
    nv_gpu(
        sharing={
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                "multiUser": True,
            },
        }
    ),
    nv_mig(),
    nv_mig(sharing={"strategy": "TimeSlicing"}),  # accepted, and sets nothing, as in NVIDIA's driver
    nv_mig(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20, "multiUser": False}}),
    # Passthrough devices' VfioDeviceConfig, ours and NVIDIA's (its gpu-test-vfio-config.yaml).
    {"apiVersion": API, "kind": "VfioDeviceConfig"},
    {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD"}},
    {"apiVersion": NVIDIA, "kind": "VfioDeviceConfig"},
    {
        "apiVersion": NVIDIA,
        "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True},
    },
]

BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"apiVersion": "resource.nvidia.com/v1alpha1", "kind": "GpuConfig"},
        "apiVersion: 'resource.nvidia.com/v1alpha1' is not supported; allowed: gpu.dradriver.dev/v1alpha1 "
        "(or NVIDIA's resource.nvidia.com/v1beta1)",
    ),
    (
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "IommuFDOnly"}},
        "VfioDeviceConfig: iommu.backendPolicy: 'IommuFDOnly' is not allowed; allowed: 'LegacyOnly' or 'PreferIommuFD'",
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
        gpu(sharing={"strategy": "MPS", "mps": {"multiUser": "yes"}}),
        "sharing.mps.multiUser: input should be a valid boolean",
    ),
    (
        gpu(sharing={"strategy": "MPS", "mps": {"pinned": "1Gi"}}),
        "sharing.mps.pinned: unknown field; allowed fields here: defaultActiveThreadPercentage, "
        "defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser",
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
    # NVIDIA's version: its own field names only, its kinds only, its rules.
    (
        nv_gpu(computeMode="Default"),
        "resource.nvidia.com/v1beta1 GpuConfig: computeMode: unknown field; allowed fields here: apiVersion, kind, "
        "sharing",
    ),
    (
        nv_gpu(sharing={"strategy": "MPS", "mps": {}}),
        "sharing.mps: unknown field; allowed fields here: strategy, timeSlicingConfig, mpsConfig",
    ),
    (
        nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        "sharing.timeSlicing: unknown field; allowed fields here: strategy, timeSlicingConfig, mpsConfig",
    ),
    (nv_gpu(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}), "sharing: mps is set but strategy is TimeSlicing"),
    (nv_gpu(sharing={"strategy": "MPS", "timeSlicingConfig": {}}), "sharing: timeSlicing is set but strategy is MPS"),
    (nv_gpu(sharing={"strategy": "Vgpu"}), "sharing.strategy: 'Vgpu' is not allowed; allowed: 'TimeSlicing' or 'MPS'"),
    (nv_gpu(sharing={"strategy": ""}), "sharing.strategy: '' is not allowed"),
    (
        nv_gpu(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Longest"}}),
        "sharing.timeSlicingConfig.interval: 'Longest' is not allowed",
    ),
    (
        nv_gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
        "sharing.mpsConfig.defaultActiveThreadPercentage: 101 is out of range; allowed: 0 to 100",
    ),
    (
        nv_gpu(sharing={"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"}}),
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: the limit 100Ki is below 1Mi",
    ),
    (nv_gpu(metadata={"name": "x"}), "metadata: unknown field; allowed fields here: apiVersion, kind, sharing"),
    (
        nv_mig(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        "sharing.timeSlicingConfig: unknown field; allowed fields here: strategy, mpsConfig",
    ),
    (
        nv_mig(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
        "sharing: mpsConfig is set but strategy is TimeSlicing",
    ),
    (
        {"apiVersion": NVIDIA, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "LegacyOnly", "devices": 1}},
        "iommu.devices: unknown field; allowed fields here: backendPolicy, enableAPIDevice",
    ),
    (
        {"apiVersion": NVIDIA, "kind": "ComputeDomainChannelConfig", "domainID": "x"},
        "ComputeDomain IMEX channels (multi-node NVLink), which this driver does not implement",
    ),
    (
        {"apiVersion": NVIDIA, "kind": "ComputeDomainDaemonConfig", "domainID": "x"},
        "which this driver does not implement",
    ),
    ({"apiVersion": NVIDIA, "kind": "MpsConfig"}, "kind: 'MpsConfig' is not a kind of resource.nvidia.com/v1beta1"),
]
