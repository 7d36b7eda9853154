"""Compatibility presets: the names another driver's manifests expect, so they allocate and prepare unedited.

A preset is one choice (``--compat nvidia``) that sets the driver name (and with it the attribute domain of every
bare attribute, the plugin directory and the taint keys) and names the DeviceClasses the manifests use. The
attributes and configs themselves need no preset: NVIDIA's attribute names are ours, and NVIDIA's config API is
accepted by any instance (docs/nvidia-compatibility.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    """The driver name and DeviceClasses of one driver whose manifests we accept."""

    name: str
    driver_name: str
    gpu_class: str
    mig_class: str
    #: The device-plugin resource name a pod's ``resources.limits`` can ask for (KEP-5004), on the GPU class.
    extended_resource_name: str | None

    def device_classes(self, api_version: str = "resource.k8s.io/v1") -> list[dict[str, Any]]:
        """The preset's DeviceClasses, with that driver's selectors (``extendedResourceName`` exists in v1 only)."""
        classes = []
        for name, kind in ((self.gpu_class, "gpu"), (self.mig_class, "mig")):
            expression = (
                f"device.driver == '{self.driver_name}' && device.attributes['{self.driver_name}'].type == '{kind}'"
            )
            spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
            if kind == "gpu" and self.extended_resource_name and api_version == "resource.k8s.io/v1":
                spec["extendedResourceName"] = self.extended_resource_name
            classes.append({"apiVersion": api_version, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec})
        return classes


#: NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu): its driver name, classes and selectors.
NVIDIA = Preset(
    name="nvidia",
    driver_name="gpu.nvidia.com",
    gpu_class="gpu.nvidia.com",
    mig_class="mig.nvidia.com",
    extended_resource_name="nvidia.com/gpu",
)
PRESETS: dict[str, Preset] = {NVIDIA.name: NVIDIA}
#: The value of ``--compat`` that keeps our own names.
NO_PRESET = "none"


def preset_driver_name(preset: str, driver_name: str) -> str:
    """The driver name to run under with ``--compat preset``: the preset's, unless ``--driver-name`` was set to
    another one (refused: the preset's manifests would name a driver that does not exist)."""
    if preset == NO_PRESET:
        return driver_name
    chosen = PRESETS[preset]
    if driver_name not in (DEFAULT_DRIVER_NAME, chosen.driver_name):
        raise ConfigError(
            f"--compat {preset} runs as driver {chosen.driver_name}, but --driver-name is {driver_name}; "
            "leave --driver-name unset with --compat"
        )
    return chosen.driver_name
