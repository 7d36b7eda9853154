"""Node profiles of the simulated GPU node (which products, where, in which MIG layout), loaded from YAML and
validated against the product facts of :mod:`dradriver.gpu.products`.

Built-in profiles live in ``sim/data/nodes``; users can write their own profile files in the same format
(documented in docs/simulator.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dradriver.errors import ConfigError
from dradriver.gpu.models import NO_CLUSTER_UUID
from dradriver.gpu.products import FABRIC_ARCHITECTURES, ProductSpec, load_products
from dradriver.inputs import Fields, parse_yaml, path_exists, read_text
from dradriver.validation.names import DNS_SUBDOMAIN_MAX_LENGTH, is_dns_label

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


_DRIVER_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
# NVML numbers GPUs per node; no server holds more than a few dozen (and each costs simulation time).
MAX_GPUS = 64


@dataclass(frozen=True)
class MigDeviceSpec:
    profile: str
    start: int

    @classmethod
    def read(cls, raw: object, where: str) -> MigDeviceSpec:
        fields = Fields(raw, where)
        spec = cls(profile=fields.string("profile"), start=fields.integer("start", ge=0, le=7))
        fields.done()
        return spec


@dataclass(frozen=True)
class GpuSpec:
    product: str
    pci_bus_id: str
    numa_node: int | None = None
    pcie_root: str | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceSpec, ...] = ()
    module_id: int | None = None  # what nvmlDeviceGetModuleId answers instead of the board's numbering

    @classmethod
    def read(cls, raw: object, where: str) -> GpuSpec:
        fields = Fields(raw, where)
        product = fields.string("product")
        pci_bus_id = fields.string("pciBusId").lower()
        if not _BDF.fullmatch(pci_bus_id):
            raise ValueError(f"{fields.path('pciBusId')}: {pci_bus_id!r} is not a PCI address like '0000:07:00.0'")
        spec = cls(
            product=product,
            pci_bus_id=pci_bus_id,
            numa_node=None if fields.value("numaNode", None) is None else fields.integer("numaNode", ge=0),
            pcie_root=None if fields.value("pcieRoot", None) is None else fields.string("pcieRoot", pattern=_PCIE_ROOT),
            mig_enabled=fields.boolean("migEnabled", False),
            mig_devices=tuple(MigDeviceSpec.read(value, at) for at, value in fields.items("migDevices")),
            module_id=None if fields.value("moduleId", None) is None else fields.integer("moduleId", ge=0),
        )
        fields.done()
        return spec


@dataclass(frozen=True)
class FabricSpec:
    """The multi-node NVLink clique the node's GPUs registered into (GH200 NVL32, GB200 NVL72 style)."""

    cluster_uuid: str
    clique_id: int

    @classmethod
    def read(cls, raw: object, where: str) -> FabricSpec:
        fields = Fields(raw, where)
        cluster_uuid = fields.string("clusterUuid").lower()
        if not _UUID.fullmatch(cluster_uuid):
            raise ValueError(
                f"{fields.path('clusterUuid')}: {cluster_uuid!r} is not a UUID like "
                "'6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d'"
            )
        if cluster_uuid == NO_CLUSTER_UUID:
            raise ValueError(
                f"{fields.path('clusterUuid')}: the all-zero UUID means 'not in a multi-node clique'; omit fabric "
                "instead"
            )
        spec = cls(cluster_uuid=cluster_uuid, clique_id=fields.integer("cliqueId", ge=0, le=0xFFFFFFFF))
        fields.done()
        return spec


@dataclass(frozen=True)
class NodeProfile:
    """A simulated node: its GPUs (at most :data:`MAX_GPUS`), how they are linked, its driver's versions.

    Read by :meth:`read` with hand-written checks (:class:`~dradriver.inputs.Fields`) rather than pydantic
    models, which would cost a simulated node's driver about 10 MB of memory (docs/reliability.md)."""

    name: str
    gpus: tuple[GpuSpec, ...]
    description: str = ""
    driver_version: str = "580.65.06"
    cuda_driver_version: int = 13000
    nvswitch: bool = False  # every GPU is attached to one NVSwitch fabric
    nvlink_bridges: tuple[tuple[int, int], ...] = ()
    fabric: FabricSpec | None = None  # multi-node NVLink clique of the NVSwitch fabric

    @classmethod
    def read(cls, raw: object) -> NodeProfile:
        """The profile in ``raw`` (a profile file's mapping); ``ValueError`` names the field and the problem."""
        fields = Fields(raw)
        name = fields.string("name")
        # It names the simulated node (a DNS subdomain, at most 253 characters) and its pool, without dots.
        if not is_dns_label(name, max_length=DNS_SUBDOMAIN_MAX_LENGTH):
            raise ValueError(f"name: {name!r} is not a node name without dots (lower-case letters, digits and '-')")
        fabric = fields.value("fabric", None)
        profile = cls(
            name=name,
            description=fields.string("description", ""),
            driver_version=fields.string("driverVersion", "580.65.06", pattern=_DRIVER_VERSION),
            cuda_driver_version=fields.integer("cudaDriverVersion", 13000, ge=1000),
            nvswitch=fields.boolean("nvswitch", False),
            nvlink_bridges=tuple(_bridge(value, at) for at, value in fields.items("nvlinkBridges")),
            fabric=None if fabric is None else FabricSpec.read(fabric, "fabric"),
            gpus=tuple(
                GpuSpec.read(value, at) for at, value in fields.items("gpus", min_length=1, max_length=MAX_GPUS)
            ),
        )
        fields.done()
        profile._consistent()
        return profile

    def _consistent(self) -> None:
        products = load_products()
        self._check_gpus(products)
        bridged = self._check_bridges(products)
        if self.nvswitch and bridged:
            raise ValueError("nvswitch and nvlinkBridges cannot be combined in one profile")
        if self.fabric is not None:
            self._check_fabric(products)

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
        return NodeProfile.read(raw)
    except ValueError as err:
        raise ConfigError(f"{source}: invalid node profile: {err}") from err


def _bridge(value: object, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    ):
        raise ValueError(f"{where}: a bridge is a pair of GPU indexes, like [0, 1]")
    return value[0], value[1]
