"""The ComputeDomain API: group, names, labels, the CRDs' typed models and the opaque configs.

Field names are NVIDIA's (``resource.nvidia.com/v1beta1``), so a user's ComputeDomain ports by changing its
``apiVersion``; the group is our own so both drivers can be installed side by side.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dradriver.errors import ClaimError

GROUP = "resource.dradriver.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
DRIVER_NAME = "compute-domain.dradriver.dev"
CDI_VENDOR = f"k8s.{DRIVER_NAME}"

CHANNEL_CLASS = "compute-domain-default-channel.dradriver.dev"
DAEMON_CLASS = "compute-domain-daemon.dradriver.dev"

#: On a Node: the UID of the ComputeDomain whose daemon runs there (the DaemonSet's node selector).
#: On generated objects: the UID of the domain they belong to.
DOMAIN_LABEL = f"{GROUP}/computeDomain"
#: On a daemon pod: the clique its node is in ("" for a node without multi-node NVLink).
CLIQUE_LABEL = f"{GROUP}/computeDomain.cliqueID"
#: On generated claim templates: "Workload" or "Daemon".
TARGET_LABEL = f"{GROUP}/computeDomainTarget"
FINALIZER = f"{GROUP}/computeDomain"

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

    api_version: Literal["resource.dradriver.dev/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["ComputeDomainChannelConfig"]
    domain_id: str = Field(alias="domainID", min_length=1)
    allocation_mode: Literal["Single", "All"] = Field(default="Single", alias="allocationMode")


class DaemonConfig(_Strict):
    """Opaque config of a daemon claim; the controller writes it into the daemon claim template."""

    api_version: Literal["resource.dradriver.dev/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["ComputeDomainDaemonConfig"]
    domain_id: str = Field(alias="domainID", min_length=1)


def parse_spec(obj: dict[str, Any]) -> ComputeDomainSpec:
    """The spec of a ComputeDomain object; ``ClaimError`` naming the field when it is invalid."""
    meta = obj.get("metadata", {})
    try:
        return ComputeDomainSpec.model_validate(obj.get("spec") or {})
    except ValidationError as err:
        raise ClaimError(f"ComputeDomain {meta.get('namespace')}/{meta.get('name')}: {_first_error(err)}") from None


def parse_config(parameters: Any) -> ChannelConfig | DaemonConfig:
    """An opaque config of this driver; ``ClaimError`` naming the field and the fix when it is invalid."""
    kind = parameters.get("kind") if isinstance(parameters, dict) else None
    model: type[ChannelConfig] | type[DaemonConfig]
    if kind == "ComputeDomainChannelConfig":
        model = ChannelConfig
    elif kind == "ComputeDomainDaemonConfig":
        model = DaemonConfig
    else:
        raise ClaimError(
            f"opaque config kind {kind!r} is not one of {DRIVER_NAME}'s: use ComputeDomainChannelConfig or "
            "ComputeDomainDaemonConfig (the controller writes them into the claim templates it generates)"
        )
    try:
        return model.model_validate(parameters)
    except ValidationError as err:
        raise ClaimError(f"opaque config {kind}: {_first_error(err)}") from None


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']}"


def channel_config(domain_uid: str, allocation_mode: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ComputeDomainChannelConfig",
        "domainID": domain_uid,
        "allocationMode": allocation_mode,
    }


def daemon_config(domain_uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ComputeDomainDaemonConfig", "domainID": domain_uid}


def workload_claim_template(domain: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate a ComputeDomain gets in its namespace: one channel, the domain's config."""
    meta = domain.get("metadata") or {}
    spec = parse_spec(domain)
    uid = str(meta.get("uid") or "<uid of the ComputeDomain>")
    template: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": spec.channel.resource_claim_template.name,
            "labels": {DOMAIN_LABEL: uid, TARGET_LABEL: "Workload"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRIVER_NAME,
                                "parameters": channel_config(uid, spec.channel.allocation_mode),
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


def device_classes() -> list[dict[str, Any]]:
    """The two DeviceClasses (NVIDIA's selectors, our driver name); the chart ships them (templates/computedomain)."""

    def device_class(name: str, expression: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    attributes = f"device.attributes['{DRIVER_NAME}']"
    return [
        device_class(
            CHANNEL_CLASS,
            f"device.driver == '{DRIVER_NAME}' && {attributes}.type == 'channel' && {attributes}.id == 0",
        ),
        device_class(DAEMON_CLASS, f"device.driver == '{DRIVER_NAME}' && {attributes}.type == 'daemon'"),
    ]
