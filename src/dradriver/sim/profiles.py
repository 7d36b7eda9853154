"""Node profiles of the simulated GPU node (which products, where, in which MIG layout), loaded from YAML and
validated against the product facts of :mod:`dradriver.gpu.products`.

Built-in profiles live in ``sim/data/nodes``; users can write their own profile files in the same format
(documented in docs/simulator.md).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dradriver.errors import ConfigError
from dradriver.gpu.models import NO_CLUSTER_UUID
from dradriver.gpu.products import FABRIC_ARCHITECTURES, ProductSpec, load_products
from dradriver.inputs import parse_yaml, path_exists, read_text
from dradriver.validation.names import DNS_SUBDOMAIN_MAX_LENGTH, is_dns_label

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class MigDeviceSpec(_Strict):
    profile: str
    start: int = Field(ge=0, le=7)


class GpuSpec(_Strict):
    product: str
    pci_bus_id: str = Field(alias="pciBusId")
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    pcie_root: str | None = Field(default=None, alias="pcieRoot", pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
    mig_enabled: bool = Field(default=False, alias="migEnabled")
    mig_devices: tuple[MigDeviceSpec, ...] = Field(default=(), alias="migDevices")

    @field_validator("pci_bus_id")
    @classmethod
    def _bdf(cls, value: str) -> str:
        value = value.lower()
        if not _BDF.fullmatch(value):
            raise ValueError(f"{value!r} is not a PCI address like '0000:07:00.0'")
        return value


class FabricSpec(_Strict):
    """The multi-node NVLink clique the node's GPUs registered into (GH200 NVL32, GB200 NVL72 style)."""

    cluster_uuid: str = Field(alias="clusterUuid")
    clique_id: int = Field(alias="cliqueId", ge=0, le=0xFFFFFFFF)

    @field_validator("cluster_uuid")
    @classmethod
    def _uuid(cls, value: str) -> str:
        value = value.lower()
        if not _UUID.fullmatch(value):
            raise ValueError(f"{value!r} is not a UUID like '6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d'")
        if value == NO_CLUSTER_UUID:
            raise ValueError("the all-zero UUID means 'not in a multi-node clique'; omit fabric instead")
        return value


class NodeProfile(_Strict):
    name: str
    description: str = ""
    driver_version: str = Field(default="580.65.06", alias="driverVersion", pattern=r"^\d+\.\d+(\.\d+)?$")
    cuda_driver_version: int = Field(default=13000, alias="cudaDriverVersion", ge=1000)
    nvswitch: bool = Field(default=False, description="every GPU is attached to one NVSwitch fabric")
    nvlink_bridges: tuple[tuple[int, int], ...] = Field(default=(), alias="nvlinkBridges")
    fabric: FabricSpec | None = Field(default=None, description="multi-node NVLink clique of the NVSwitch fabric")
    # NVML numbers GPUs per node; no server holds more than a few dozen (and each costs simulation time).
    gpus: tuple[GpuSpec, ...] = Field(min_length=1, max_length=64)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # It names the simulated node (a DNS subdomain, at most 253 characters) and its pool, without dots.
        if not is_dns_label(value, max_length=DNS_SUBDOMAIN_MAX_LENGTH):
            raise ValueError(f"{value!r} is not a node name without dots (lower-case letters, digits and '-')")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> NodeProfile:
        products = load_products()
        self._check_gpus(products)
        bridged = self._check_bridges(products)
        if self.nvswitch and bridged:
            raise ValueError("nvswitch and nvlinkBridges cannot be combined in one profile")
        if self.fabric is not None:
            self._check_fabric(products)
        return self

    def _check_gpus(self, products: dict[str, ProductSpec]) -> None:
        """Known products, one GPU per PCI address, MIG devices only where the product has those profiles."""
        seen: set[str] = set()
        for i, gpu in enumerate(self.gpus):
            where = f"gpus[{i}]"
            if gpu.product not in products:
                raise ValueError(f"{where}.product: unknown product {gpu.product!r}; known: {sorted(products)}")
            if gpu.pci_bus_id in seen:
                raise ValueError(f"{where}.pciBusId: {gpu.pci_bus_id} is used by two GPUs")
            seen.add(gpu.pci_bus_id)
            product = products[gpu.product]
            if (gpu.mig_enabled or gpu.mig_devices) and not product.mig_capable:
                raise ValueError(f"{where}: {gpu.product} does not support MIG; remove migEnabled/migDevices")
            if gpu.mig_devices and not gpu.mig_enabled:
                raise ValueError(f"{where}.migDevices: MIG devices need migEnabled: true")
            for j, dev in enumerate(gpu.mig_devices):
                if product.profile_named(dev.profile) is None:
                    known = [p.name for p in product.mig_profiles]
                    raise ValueError(
                        f"{where}.migDevices[{j}].profile: {gpu.product} has no MIG profile "
                        f"{dev.profile!r}; known: {known}"
                    )

    def _check_bridges(self, products: dict[str, ProductSpec]) -> set[int]:
        """NVLink bridges join two distinct, existing GPUs that have NVLink; returns the bridged GPUs."""
        bridged: set[int] = set()
        for k, (a, b) in enumerate(self.nvlink_bridges):
            for idx in (a, b):
                if not 0 <= idx < len(self.gpus):
                    raise ValueError(
                        f"nvlinkBridges[{k}]: GPU index {idx} does not exist (the profile has {len(self.gpus)} GPUs)"
                    )
                if idx in bridged:
                    raise ValueError(f"nvlinkBridges[{k}]: GPU {idx} is in two bridges")
                if products[self.gpus[idx].product].nvlinks == 0:
                    raise ValueError(f"nvlinkBridges[{k}]: {self.gpus[idx].product} has no NVLink")
                bridged.add(idx)
            if a == b:
                raise ValueError(f"nvlinkBridges[{k}]: a GPU cannot be bridged to itself")
        return bridged

    def _check_fabric(self, products: dict[str, ProductSpec]) -> None:
        """A multi-node clique needs an NVSwitch fabric and GPUs that report fabric info."""
        if not self.nvswitch:
            raise ValueError("fabric: a multi-node NVLink clique needs an NVSwitch fabric; add nvswitch: true")
        for i, gpu in enumerate(self.gpus):
            architecture = products[gpu.product].architecture
            if architecture not in FABRIC_ARCHITECTURES:
                raise ValueError(
                    f"fabric: gpus[{i}] is {gpu.product} ({architecture}), which has no fabric "
                    "info; multi-node NVLink needs Hopper or newer GPUs"
                )


def builtin_profile_names() -> list[str]:
    folder = resources.files("dradriver.sim").joinpath("data/nodes")
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def load_node_profile(name_or_path: str) -> NodeProfile:
    """A built-in profile by name, or a profile file by path; ``ConfigError`` names the file and field."""
    if name_or_path in builtin_profile_names():
        source = f"built-in profile {name_or_path}"
        text = resources.files("dradriver.sim").joinpath(f"data/nodes/{name_or_path}.yaml").read_text()
    else:
        path = Path(name_or_path)
        if not path_exists(path):
            raise ConfigError(
                f"unknown simulated node profile {name_or_path!r}: not a built-in profile "
                f"({', '.join(builtin_profile_names())}) and no such file"
            )
        source = str(path)
        text = read_text(path)
    documents = parse_yaml(text, source=source)
    raw: Any = documents[0] if len(documents) == 1 else None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a node profile must be a mapping with 'name' and 'gpus'")
    try:
        return NodeProfile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: invalid node profile: {_describe(err)}") from err


def _describe(err: ValidationError) -> str:
    parts = []
    for problem in err.errors():
        location = ".".join(str(p) for p in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        parts.append(f"{location}: {message}" if location else message)
    return "; ".join(parts)
