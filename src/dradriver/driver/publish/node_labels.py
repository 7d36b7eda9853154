"""Node labels as NVIDIA's GPU Feature Discovery (GFD) writes them, computed from the inventory (pure: no I/O).

The names, values and rules are GFD's (NVIDIA/k8s-device-plugin ``internal/lm``), so node selectors, affinities
and dashboards written for a GFD node keep working on ours; ``nvidia.com/gpu.present`` is the GPU Operator's.
Where GFD's own result depends on Go's map order we choose, and say how:

- several products of whole GPUs on one node: GFD writes the labels of the products whose GPUs all have MIG
  enabled first and those of the products with a GPU without MIG over them, each group in no fixed order; we
  label, among the products with a GPU without MIG (all products when there is none), the one with the most GPUs,
  then the first name in sort order;
- ``mig-strategy=mixed`` with one profile on parents of different products: the product part of
  ``nvidia.com/mig-<profile>.product`` is that of the first such MIG device by name;
- no ``nvidia.com/gfd.timestamp``: it would change the Node at every pass; no ``-SHARED`` product suffix or
  ``replicas`` above 1: we hand out no replicas (claims share a GPU instead).

A MIG device's ``slices.ci`` is its GPU instance's compute slices: we offer every GPU instance with one compute
instance spanning it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dradriver.gpu.inventory import GpuDevice, Inventory, MigPartition
from dradriver.gpu.models import MIB
from dradriver.validation.names import is_label_key, is_label_value

#: The label keys this driver owns on a Node (and an admission policy lets it change): everything GFD writes.
OWNED_LABEL_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig.", "nvidia.com/mig-", "nvidia.com/mps.")

#: The annotation (under the driver's name) listing, comma-separated and sorted, the label keys it wrote.
ANNOTATION_NAME = "node-labels"

#: What GFD writes where it cannot read the machine type or the GPUs' PCI classes.
UNKNOWN = "unknown"

#: PCI classes (with programming interface) of an NVIDIA GPU: a VGA controller or a 3D controller.
PCI_CLASS_VGA = 0x030000
PCI_CLASS_3D = 0x030200

_GPU = "nvidia.com/gpu"


class MigStrategy(StrEnum):
    """GFD's ``--mig-strategy``: how MIG devices are labelled (none: not at all)."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


@dataclass(frozen=True, kw_only=True)
class LabelOptions:
    """What the labels need beyond the inventory.

    ``mps_sharing``: this driver shares GPUs between claims through MPS. ``machine_type``: the host's DMI product
    name (None: unreadable). ``pci_classes``: each GPU's PCI class by PCI bus id (None: unreadable)."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    mps_sharing: bool = False
    machine_type: str | None = None
    pci_classes: Mapping[str, int] | None = None


def annotation_key(driver_name: str) -> str:
    """``<driver name>/node-labels``: the Node annotation listing the label keys the driver wrote."""
    return f"{driver_name}/{ANNOTATION_NAME}"


def is_owned(key: str) -> bool:
    """Whether label ``key`` is under one of :data:`OWNED_LABEL_PREFIXES`."""
    return key.startswith(OWNED_LABEL_PREFIXES)


def sanitise(text: str) -> str:
    """GFD's sanitise: drop every character but letters, digits, ``-``, ``_``, ``.`` and spaces, then join the
    space-separated words with ``-`` ("NVIDIA H100 80GB HBM3" → "NVIDIA-H100-80GB-HBM3")."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def arch_family(major: int, minor: int) -> str:
    """GFD's GPU family of compute capability ``major.minor`` ("undefined" for one it does not know)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell"}
    return families.get(major, "blackwell" if major == 12 else "rubin" if major == 13 else "undefined")


def gfd_labels(inventory: Inventory, options: LabelOptions) -> dict[str, str]:
    """The labels GFD would write for a node with ``inventory``; none at all for a node without GPUs. Labels
    Kubernetes would refuse (a machine type over 63 characters, a MIG profile name no key can hold) are left out."""
    if not inventory.gpus:
        return {}
    labels = {
        f"{_GPU}.present": "true",
        f"{_GPU}.machine": sanitise(options.machine_type) if options.machine_type is not None else UNKNOWN,
        **version_labels(inventory.driver_version, inventory.cuda_driver_version),
        "nvidia.com/mig.capable": str(any(g.info.mig_capable for g in inventory.gpus)).lower(),
        "nvidia.com/mps.capable": str(options.mps_sharing and not any(g.mig_enabled for g in inventory.gpus)).lower(),
        **gpu_product_labels(inventory.gpus),
        **mig_labels(inventory, options.mig_strategy),
        f"{_GPU}.mode": gpu_mode(inventory.gpus, options.pci_classes),
        **clique_labels(inventory.gpus),
    }
    return {key: value for key, value in labels.items() if is_label_key(key) and is_label_value(value)}


def version_labels(driver_version: str, cuda_version: str) -> dict[str, str]:
    """The driver's and CUDA's versions, with GFD's deprecated twins; no driver labels for a version that is not
    ``X.Y[.Z]`` (GFD then writes no labels at all)."""
    cuda_major, cuda_minor = [*cuda_version.split("."), "0", "0"][:2]
    labels = {
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3:
        return labels
    major, minor, revision = [*parts, ""][:3]
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": driver_version,
        **labels,
    }


def labelled_product(gpus: Iterable[GpuDevice]) -> str:
    """The product whose labels a node of several products carries: one with a GPU without MIG if there is one
    (GFD's full-GPU labels overwrite those of the products whose GPUs all have MIG on), then the most GPUs, then
    the first name."""
    gpus = list(gpus)
    counts = Counter(g.info.product_name for g in gpus)
    candidates = {g.info.product_name for g in gpus if not g.mig_enabled} or set(counts)
    return min(candidates, key=lambda name: (-counts[name], name))


def gpu_product_labels(gpus: tuple[GpuDevice, ...]) -> dict[str, str]:
    """``nvidia.com/gpu.{product,count,replicas,sharing-strategy,memory,family,compute.*}`` of the labelled
    product: its GPUs count whether MIG is enabled or not; replicas is 0 when every one has MIG enabled."""
    product = labelled_product(gpus)
    of_product = [g for g in gpus if g.info.product_name == product]
    info = of_product[0].info
    labels = {
        f"{_GPU}.product": sanitise(product),
        f"{_GPU}.count": str(len(of_product)),
        f"{_GPU}.replicas": "0" if all(g.mig_enabled for g in of_product) else "1",
        f"{_GPU}.sharing-strategy": "none",
    }
    if info.memory_bytes // MIB:
        labels[f"{_GPU}.memory"] = str(info.memory_bytes // MIB)
    major, minor = info.cuda_compute_capability
    if major:
        labels[f"{_GPU}.family"] = arch_family(major, minor)
        labels[f"{_GPU}.compute.major"] = str(major)
        labels[f"{_GPU}.compute.minor"] = str(minor)
    return labels


def mig_profile_name(partition: MigPartition) -> str:
    """A MIG device's profile as GFD names its resource: ``+`` becomes ``.`` ("1g.10gb+me" → "1g.10gb.me")."""
    return partition.profile.name.replace("+", ".")


def mig_labels(inventory: Inventory, strategy: MigStrategy) -> dict[str, str]:
    """``nvidia.com/mig.strategy`` and, by strategy, the labels of the MIG devices that exist."""
    if strategy is MigStrategy.NONE:
        return {}
    labels = {"nvidia.com/mig.strategy": strategy.value}
    by_profile = _existing_by_profile(inventory.mig_devices)
    if strategy is MigStrategy.MIXED:
        for profile, devices in by_profile.items():
            labels.update(mig_device_labels(f"nvidia.com/mig-{profile}", devices))
        return labels
    enabled = sorted((g for g in inventory.gpus if g.mig_enabled), key=lambda g: g.info.index)
    if not enabled:
        return labels
    with_devices = {d.parent.name for d in inventory.mig_devices if d.existing is not None}
    if any(g.name not in with_devices for g in enabled) or len(enabled) != len(inventory.gpus) or len(by_profile) != 1:
        return {**labels, **invalid_single_labels(enabled[0])}
    return {**labels, **mig_device_labels(_GPU, next(iter(by_profile.values())))}


def _existing_by_profile(partitions: Iterable[MigPartition]) -> dict[str, list[MigPartition]]:
    by_profile: dict[str, list[MigPartition]] = {}
    for partition in sorted((p for p in partitions if p.existing is not None), key=lambda p: p.name):
        by_profile.setdefault(mig_profile_name(partition), []).append(partition)
    return by_profile


def mig_device_labels(resource: str, devices: list[MigPartition]) -> dict[str, str]:
    """GFD's labels of one MIG resource (``nvidia.com/mig-<profile>``, or ``nvidia.com/gpu`` with the single
    strategy): count, product, replicas, sharing strategy and the profile's attributes."""
    first = devices[0]
    profile = first.profile
    attributes: dict[str, Any] = {
        "count": len(devices),
        "product": f"{sanitise(first.parent.info.product_name)}-MIG-{sanitise(mig_profile_name(first))}",
        "replicas": 1,
        "sharing-strategy": "none",
        "memory": profile.memory_mib,
        "multiprocessors": profile.multiprocessors,
        "slices.gi": profile.slice_count,
        "slices.ci": profile.slice_count,
        "engines.copy": profile.copy_engines,
        "engines.decoder": profile.decoders,
        "engines.encoder": profile.encoders,
        "engines.jpeg": profile.jpeg_engines,
        "engines.ofa": profile.ofa_engines,
    }
    return {f"{resource}.{suffix}": str(value) for suffix, value in attributes.items()}


def invalid_single_labels(gpu: GpuDevice) -> dict[str, str]:
    """What GFD writes when ``mig-strategy=single`` cannot describe the node (a MIG-enabled GPU without MIG
    devices, MIG-enabled and MIG-disabled GPUs together, or more than one profile)."""
    return {
        f"{_GPU}.product": f"{sanitise(gpu.info.product_name)}-MIG-INVALID",
        f"{_GPU}.count": "0",
        f"{_GPU}.replicas": "0",
        f"{_GPU}.sharing-strategy": "",
        f"{_GPU}.memory": "0",
    }


def gpu_mode(gpus: Iterable[GpuDevice], pci_classes: Mapping[str, int] | None) -> str:
    """ "compute" when every GPU is a 3D controller, "graphics" when every one is a VGA controller, else (or
    where a class cannot be read) "unknown"."""
    if pci_classes is None:
        return UNKNOWN
    classes = {pci_classes.get(g.info.pci_bus_id) for g in gpus}
    if classes == {PCI_CLASS_3D}:
        return "compute"
    if classes == {PCI_CLASS_VGA}:
        return "graphics"
    return UNKNOWN


def clique_labels(gpus: Iterable[GpuDevice]) -> dict[str, str]:
    """``nvidia.com/gpu.clique``, ``<clusterUuid>.<cliqueId>``, when the GPUs registered on a multi-node NVLink
    fabric share one cluster UUID and one clique id (discovery puts them in the clique's NVLink domain)."""
    cliques = {g.nvlink_domain.removeprefix("clique-") for g in gpus if g.nvlink_domain.startswith("clique-")}
    clusters = {c.rsplit(".", 1)[0] for c in cliques}
    ids = {c.rsplit(".", 1)[1] for c in cliques}
    if len(clusters) != 1 or len(ids) != 1:
        return {}
    return {f"{_GPU}.clique": f"{clusters.pop()}.{ids.pop()}"}


def written_keys(node: Mapping[str, Any], driver_name: str) -> list[str]:
    """The label keys the Node's annotation says the driver wrote (owned ones only: the annotation is not
    trusted to name anything else)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    listed = str(annotations.get(annotation_key(driver_name)) or "")
    return sorted({key.strip() for key in listed.split(",") if is_owned(key.strip())})


def labels_patch(wanted: Mapping[str, str], *, previous: Iterable[str], driver_name: str) -> dict[str, Any]:
    """The JSON merge patch of a Node that sets ``wanted`` (owned keys only), removes the ``previous`` keys no
    longer wanted, and lists the keys written in the annotation (removed with it when none is)."""
    labels: dict[str, str | None] = {key: None for key in previous if is_owned(key) and key not in wanted}
    labels.update({key: value for key, value in wanted.items() if is_owned(key)})
    written = ",".join(sorted(key for key, value in labels.items() if value is not None))
    return {"metadata": {"labels": labels, "annotations": {annotation_key(driver_name): written or None}}}
