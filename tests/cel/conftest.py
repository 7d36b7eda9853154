import pytest

DRIVER = "gpu.dradriver.dev"


@pytest.fixture
def gpu() -> dict:
    """A whole A100 80GB as published in a ResourceSlice (see /work/notes/device-schema.md)."""
    return {
        "name": "gpu-0000-07-00-0",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-1234"},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "580.65.6"},
            "migCapable": {"bool": True},
            "nvlinkDomain": {"string": "nvswitch-0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "resource.kubernetes.io/numaNode": {"int": 1},
        },
        "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "108"}},
    }
