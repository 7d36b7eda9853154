"""The ComputeDomain API: group, names, labels, the CRDs' typed models and the opaque configs.

Field names are NVIDIA's (``resource.nvidia.com/v1beta1``). Every name the driver gives the cluster (API group,
driver, DeviceClasses, labels, finalizer) comes from one :class:`ComputeDomainNames`: :data:`OURS` by default, so
both drivers can be installed side by side, or :data:`NVIDIA` under ``--compat nvidia``, so a ComputeDomain written
for NVIDIA's driver applies as written (:func:`names_of`). The module's constants are :data:`OURS`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dradriver.errors import ClaimError

VERSION = "v1beta1"


@dataclass(frozen=True, kw_only=True)
class ComputeDomainNames:
    """The names of one ComputeDomain API: its group (the CRDs', the opaque configs' and the labels' prefix), its
    DRA driver and its two DeviceClasses. Chosen once at start and handed to what needs them."""

    group: str
    driver_name: str
    channel_class: str
    daemon_class: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{VERSION}"

    @property
    def cdi_vendor(self) -> str:
        return f"k8s.{self.driver_name}"

    @property
    def domain_label(self) -> str:
        """On a Node: the UID of the ComputeDomain whose daemon runs there (the DaemonSet's node selector).
        On generated objects: the UID of the domain they belong to."""
        return f"{self.group}/computeDomain"

    @property
    def clique_label(self) -> str:
        """On a daemon pod: the clique its node is in ("" for a node without multi-node NVLink)."""
        return f"{self.group}/computeDomain.cliqueID"

    @property
    def target_label(self) -> str:
        """On generated claim templates: "Workload" or "Daemon"."""
        return f"{self.group}/computeDomainTarget"

    @property
    def finalizer(self) -> str:
        return f"{self.group}/computeDomain"


OURS = ComputeDomainNames(
    group="resource.dradriver.dev",
    driver_name="compute-domain.dradriver.dev",
    channel_class="compute-domain-default-channel.dradriver.dev",
    daemon_class="compute-domain-daemon.dradriver.dev",
)
# NVIDIA's (api/nvidia.com/resource/v1beta1, cmd/compute-domain-controller/computedomain.go): what --compat nvidia
# serves, so NVIDIA's ComputeDomains and their pods apply unedited.
NVIDIA = ComputeDomainNames(
    group="resource.nvidia.com",
    driver_name="compute-domain.nvidia.com",
    channel_class="compute-domain-default-channel.nvidia.com",
    daemon_class="compute-domain-daemon.nvidia.com",
)


def names_of(compat: str) -> ComputeDomainNames:
    """The names ``--compat`` chooses: NVIDIA's for "nvidia", ours otherwise ("none")."""
    return NVIDIA if compat == "nvidia" else OURS


GROUP = OURS.group
API_VERSION = OURS.api_version
DRIVER_NAME = OURS.driver_name
CDI_VENDOR = OURS.cdi_vendor
CHANNEL_CLASS = OURS.channel_class
DAEMON_CLASS = OURS.daemon_class
DOMAIN_LABEL = OURS.domain_label
CLIQUE_LABEL = OURS.clique_label
TARGET_LABEL = OURS.target_label
FINALIZER = OURS.finalizer

READY = "Ready"
NOT_READY = "NotReady"
SINGLE = "Single"
ALL = "All"

#: Trays of one NVL72 rack: the most nodes of one clique, hence of one IMEX domain (NVIDIA's default).
MAX_NODES_PER_IMEX_DOMAIN = 18
#: Channels the kernel driver creates; ``All`` mode injects every one of them.
MAX_IMEX_CHANNELS = 2048
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
DAEMON_DNS_FORMAT = "compute-domain-daemon-{:04d}"


def daemon_object_name(domain_uid: str) -> str:
    """The daemon DaemonSet and its claim template, in the driver namespace: predictable, one per domain."""
    return f"computedomain-daemon-{domain_uid}"


def clique_object_name(domain_uid: str, clique_id: str) -> str:
    """The ComputeDomainClique of one domain's daemons in one clique."""
    return f"{domain_uid}.{clique_id}"


def daemon_dns_name(index: int) -> str:
    """The name a daemon has in every peer's nodes config: its index, never its (reusable) IP address."""
    return DAEMON_DNS_FORMAT.format(index)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TemplateRef(_Strict):
    name: str = Field(min_length=1)


class ChannelSpec(_Strict):
    resource_claim_template: TemplateRef = Field(alias="resourceClaimTemplate")
    allocation_mode: Literal["Single", "All"] = Field(default="Single", alias="allocationMode")


class ComputeDomainSpec(_Strict):
    """``spec`` of a ComputeDomain; the CRD makes it immutable (``self == oldSelf``)."""

    num_nodes: int = Field(default=0, ge=0, alias="numNodes")
    channel: ChannelSpec


class ChannelConfig(_Strict):
    """Opaque config of a channel claim; the controller writes it into the workload claim template."""

    # The names' api_version, checked by parse_config (ours or NVIDIA's, as --compat chose).
    api_version: str = Field(alias="apiVersion")
    kind: Literal["ComputeDomainChannelConfig"]
    domain_id: str = Field(alias="domainID", min_length=1)
    allocation_mode: Literal["Single", "All"] = Field(default="Single", alias="allocationMode")


class DaemonConfig(_Strict):
    """Opaque config of a daemon claim; the controller writes it into the daemon claim template."""

    api_version: str = Field(alias="apiVersion")
    kind: Literal["ComputeDomainDaemonConfig"]
    domain_id: str = Field(alias="domainID", min_length=1)


def parse_spec(obj: dict[str, Any]) -> ComputeDomainSpec:
    """The spec of a ComputeDomain object; ``ClaimError`` naming the field when it is invalid."""
    meta = obj.get("metadata", {})
    try:
        return ComputeDomainSpec.model_validate(obj.get("spec") or {})
    except ValidationError as err:
        raise ClaimError(f"ComputeDomain {meta.get('namespace')}/{meta.get('name')}: {_first_error(err)}") from None


def parse_config(parameters: Any, names: ComputeDomainNames = OURS) -> ChannelConfig | DaemonConfig:
    """An opaque config of the driver ``names`` name; ``ClaimError`` naming the field and the fix when it is
    invalid (an apiVersion other than ``names.api_version`` among them)."""
    kind = parameters.get("kind") if isinstance(parameters, dict) else None
    model: type[ChannelConfig] | type[DaemonConfig]
    if kind == "ComputeDomainChannelConfig":
        model = ChannelConfig
    elif kind == "ComputeDomainDaemonConfig":
        model = DaemonConfig
    else:
        raise ClaimError(
            f"opaque config kind {kind!r} is not one of {names.driver_name}'s: use ComputeDomainChannelConfig or "
            "ComputeDomainDaemonConfig (the controller writes them into the claim templates it generates)"
        )
    if "apiVersion" in parameters and parameters["apiVersion"] != names.api_version:
        raise ClaimError(f"opaque config {kind}: apiVersion: Input should be {names.api_version!r}")
    try:
        return model.model_validate(parameters)
    except ValidationError as err:
        raise ClaimError(f"opaque config {kind}: {_first_error(err)}") from None


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']}"


def channel_config(domain_uid: str, allocation_mode: str, names: ComputeDomainNames = OURS) -> dict[str, Any]:
    return {
        "apiVersion": names.api_version,
        "kind": "ComputeDomainChannelConfig",
        "domainID": domain_uid,
        "allocationMode": allocation_mode,
    }


def daemon_config(domain_uid: str, names: ComputeDomainNames = OURS) -> dict[str, Any]:
    return {"apiVersion": names.api_version, "kind": "ComputeDomainDaemonConfig", "domainID": domain_uid}


def workload_claim_template(domain: dict[str, Any], names: ComputeDomainNames = OURS) -> dict[str, Any]:
    """The ResourceClaimTemplate a ComputeDomain gets in its namespace: one channel, the domain's config, under
    ``names``' class, driver and labels."""
    meta = domain.get("metadata") or {}
    spec = parse_spec(domain)
    uid = str(meta.get("uid") or "<uid of the ComputeDomain>")
    template: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": spec.channel.resource_claim_template.name,
            "labels": {names.domain_label: uid, names.target_label: "Workload"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel", "exactly": {"deviceClassName": names.channel_class}}],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": names.driver_name,
                                "parameters": channel_config(uid, spec.channel.allocation_mode, names),
                            },
                        }
                    ],
                }
            }
        },
    }
    if meta.get("namespace"):
        template["metadata"]["namespace"] = meta["namespace"]
    return template


def device_classes(names: ComputeDomainNames = OURS) -> list[dict[str, Any]]:
    """The two DeviceClasses (NVIDIA's selectors, ``names``' class and driver names); the chart ships them
    (templates/computedomain)."""

    def device_class(name: str, expression: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    driver = names.driver_name
    attributes = f"device.attributes['{driver}']"
    return [
        device_class(
            names.channel_class,
            f"device.driver == '{driver}' && {attributes}.type == 'channel' && {attributes}.id == 0",
        ),
        device_class(names.daemon_class, f"device.driver == '{driver}' && {attributes}.type == 'daemon'"),
    ]
