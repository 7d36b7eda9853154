"""The opaque configuration API ``gpu.dradriver.dev/v1alpha1``: ``GpuConfig``, ``MigDeviceConfig`` and
``VfioDeviceConfig`` (passthrough devices); NVIDIA's ``resource.nvidia.com/v1beta1`` of the same three kinds is
accepted too and converted to ours.

Decoding is strict: an unknown field, a wrong type or a value out of range is a :class:`ConfigError` naming the
field path and what is allowed. Field names are NVIDIA's where the meaning is the same; ``timeSlicing``/``mps``
are ours and NVIDIA's ``timeSlicingConfig``/``mpsConfig`` are accepted too.

NVIDIA's version is decoded by the same models after its own rules are checked (:func:`_nvidia_problems`): only
NVIDIA's field names, no ``computeMode``, and on a MIG device strategy TimeSlicing is accepted and means what it
means in NVIDIA's driver: nothing to set (a MIG device has its own scheduler), so it converts to no sharing. The
kinds of that version this driver does not implement (ComputeDomains) are refused saying so.
docs/nvidia-compatibility.md maps every NVIDIA field to ours.

Resolution (:func:`resolve_configs`) follows the API's order: class configs, then claim configs; an entry that
names requests applies only to their devices; two entries for one device merge field by field with the later
winning, except that two different sharing strategies are refused (merging TimeSlicing settings into MPS, or the
reverse, would silently drop what one entry asked for). An entry in NVIDIA's version replaces what came before it
for its devices, as NVIDIA's driver applies only the last matching config.

``python -m dradriver.driver.prepare.config > api/config/gpu.dradriver.dev_v1alpha1.schema.json`` regenerates the
checked-in JSON schema (a test keeps it current).
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dradriver.errors import ClaimError, DradriverError
from dradriver.quantity import Quantity, QuantityError

GROUP = "gpu.dradriver.dev"
API_VERSION = f"{GROUP}/v1alpha1"
#: NVIDIA's config API (its DRA driver's ``api/nvidia.com/resource/v1beta1``), accepted and converted to ours.
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
API_VERSIONS = (API_VERSION, NVIDIA_API_VERSION)
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"
VFIO_DEVICE_CONFIG = "VfioDeviceConfig"
MIB = 1024 * 1024
MAX_LIMIT = 1024**6  # 1Ei: a bound far above any GPU's memory, so a limit always fits MPS's MiB argument

Interval = Literal["Default", "Short", "Medium", "Long"]
ComputeModeName = Literal["Default", "ExclusiveProcess", "Prohibited"]

#: The value ``nvidia-smi compute-policy --set-timeslice`` takes for each interval.
TIMESLICE_VALUES: dict[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

TIME_SLICING_ON_MIG = (
    "time-slicing is not a MIG setting: a MIG device has its own scheduler, which NVIDIA's time-slice policy does "
    "not change; use strategy MPS on the partition, or time-slice a whole GPU with GpuConfig"
)


#: Kinds of NVIDIA's version this driver does not implement, and what they are for.
NVIDIA_UNSUPPORTED_KINDS: dict[str, str] = {
    "ComputeDomainChannelConfig": "ComputeDomain IMEX channels (multi-node NVLink)",
    "ComputeDomainDaemonConfig": "ComputeDomain IMEX daemons (multi-node NVLink)",
    "ComputeDomain": "ComputeDomains (a custom resource, not a device config)",
    "ComputeDomainClique": "ComputeDomain cliques (a custom resource, not a device config)",
}


class ConfigError(DradriverError):
    """An opaque config that cannot be used; the message names the field path and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, frozen=True)


def _quantity(value: object, what: str) -> str:
    """A positive Kubernetes quantity (a string or a whole number), kept in its spelling."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"must be a quantity such as 8Gi or 512Mi, not {type(value).__name__}")
    try:
        parsed = Quantity.parse(str(value))
    except QuantityError as err:
        raise ValueError(f"{_shown(value)} is not a quantity (examples: 8Gi, 512Mi)") from err
    if parsed.value < MIB:
        raise ValueError(f"{what} {_shown(value, quoted=False)} is below 1Mi; MPS limits are whole MiB")
    if parsed.value > MAX_LIMIT:
        raise ValueError(
            f"{what} {_shown(value, quoted=False)} is above 1Ei, more memory than any GPU has; give the limit in Gi"
        )
    return str(value)


class TimeSlicingConfig(_Strict):
    interval: Interval = "Default"


class MpsConfig(_Strict):
    default_active_thread_percentage: int | None = Field(
        default=None, ge=0, le=100, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | None = Field(default=None, alias="defaultPinnedDeviceMemoryLimit")
    default_per_device_pinned_memory_limit: dict[str, str] | None = Field(
        default=None, alias="defaultPerDevicePinnedMemoryLimit"
    )
    # Start the daemon with -M: clients of any user id may connect (NVIDIA's default: one user only).
    multi_user: bool | None = Field(default=None, alias="multiUser")

    @field_validator("default_pinned_device_memory_limit", mode="before")
    @classmethod
    def _limit(cls, value: object) -> object:
        return None if value is None else _quantity(value, "the limit")

    @field_validator("default_per_device_pinned_memory_limit", mode="before")
    @classmethod
    def _per_device(cls, value: object) -> object:
        if value is None or not isinstance(value, Mapping):
            return value
        return {str(key): _quantity(limit, f"the limit of {key}") for key, limit in value.items()}


class GpuSharing(_Strict):
    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing: TimeSlicingConfig | None = Field(
        default=None,
        validation_alias=AliasChoices("timeSlicing", "timeSlicingConfig"),
        serialization_alias="timeSlicing",
    )
    mps: MpsConfig | None = Field(
        default=None, validation_alias=AliasChoices("mps", "mpsConfig"), serialization_alias="mps"
    )

    @model_validator(mode="after")
    def _one_strategy(self) -> GpuSharing:
        if self.strategy == "TimeSlicing" and self.mps is not None:
            raise ValueError("mps is set but strategy is TimeSlicing; remove mps or set strategy: MPS")
        if self.strategy == "MPS" and self.time_slicing is not None:
            raise ValueError("timeSlicing is set but strategy is MPS; remove timeSlicing or set strategy: TimeSlicing")
        return self


class MigSharing(_Strict):
    strategy: Literal["MPS"]
    mps: MpsConfig | None = Field(
        default=None, validation_alias=AliasChoices("mps", "mpsConfig"), serialization_alias="mps"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_time_slicing(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and (
            data.get("strategy") == "TimeSlicing" or "timeSlicing" in data or "timeSlicingConfig" in data
        ):
            raise ValueError(TIME_SLICING_ON_MIG)
        return data


class GpuConfig(_Strict):
    """Settings of a whole GPU: sharing (time-slicing or MPS) and compute mode."""

    api_version: Literal["gpu.dradriver.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None
    compute_mode: ComputeModeName | None = Field(default=None, alias="computeMode")

    @model_validator(mode="after")
    def _mode_fits_sharing(self) -> GpuConfig:
        strategy = self.sharing.strategy if self.sharing is not None else None
        if strategy == "MPS" and self.compute_mode not in (None, "ExclusiveProcess"):
            raise ValueError(
                f"computeMode {self.compute_mode} cannot be used with MPS (the MPS server must be the only process "
                "on the GPU); leave computeMode unset or set ExclusiveProcess"
            )
        if strategy == "TimeSlicing" and self.compute_mode not in (None, "Default"):
            raise ValueError(
                f"computeMode {self.compute_mode} cannot be used with TimeSlicing (time slices are shared between "
                "processes, which needs the Default mode); leave computeMode unset or set Default"
            )
        return self


class MigDeviceConfig(_Strict):
    """Settings of a MIG partition: MPS sharing."""

    api_version: Literal["gpu.dradriver.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: MigSharing | None = None


class IommuConfig(_Strict):
    """NVIDIA's IOMMU settings of a passthrough device. ``LegacyOnly`` (the default, what KubeVirt uses) gives the
    group's node and ``/dev/vfio/vfio``; ``PreferIommuFD`` gives the device's cdev and ``/dev/iommu`` where the node
    has ``/dev/iommu``, else falls back to legacy, as NVIDIA's does. The API device is always given: without it the
    other node is of no use (``enableAPIDevice: false`` does not take it away)."""

    backend_policy: Literal["LegacyOnly", "PreferIommuFD"] = Field(default="LegacyOnly", alias="backendPolicy")
    enable_api_device: bool | None = Field(default=None, alias="enableAPIDevice")


class VfioDeviceConfig(_Strict):
    """Settings of a passthrough device (``--passthrough``): its IOMMU backend."""

    api_version: Literal["gpu.dradriver.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["VfioDeviceConfig"]
    iommu: IommuConfig | None = None


AnyConfig = GpuConfig | MigDeviceConfig | VfioDeviceConfig
_KINDS: dict[str, type[GpuConfig] | type[MigDeviceConfig] | type[VfioDeviceConfig]] = {
    GPU_CONFIG: GpuConfig,
    MIG_DEVICE_CONFIG: MigDeviceConfig,
    VFIO_DEVICE_CONFIG: VfioDeviceConfig,
}
#: The config kind of each device kind, and what a device of that kind is called in errors.
_KIND_OF_DEVICE = {
    "gpu": (GPU_CONFIG, "whole GPU"),
    "mig": (MIG_DEVICE_CONFIG, "MIG partition"),
    "vfio": (VFIO_DEVICE_CONFIG, "passthrough GPU"),
}


def decode_config(parameters: Mapping[str, Any]) -> AnyConfig:
    """Decode one opaque config strictly (ours, or NVIDIA's converted to ours); :class:`ConfigError` names the
    field path and what is allowed."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"the parameters must be an object with apiVersion {API_VERSION} and a kind")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version not in API_VERSIONS:
        raise ConfigError(
            f"apiVersion: {_shown(api_version)} is not supported; allowed: {API_VERSION} "
            f"(or NVIDIA's {NVIDIA_API_VERSION})"
        )
    nvidia = api_version == NVIDIA_API_VERSION
    if nvidia and isinstance(kind, str) and kind in NVIDIA_UNSUPPORTED_KINDS:
        raise ConfigError(
            f"kind: {kind} of {NVIDIA_API_VERSION} is for {NVIDIA_UNSUPPORTED_KINDS[kind]}, which this driver does "
            f"not implement; it accepts {', '.join(_KINDS)}"
        )
    model = _KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ConfigError(f"kind: {_shown(kind)} is not a kind of {api_version}; allowed: {', '.join(_KINDS)}")
    data = dict(parameters)
    if nvidia:
        problems = _nvidia_problems(data, model)
        if problems:
            raise ConfigError(f"{NVIDIA_API_VERSION} {kind}: {'; '.join(problems)}")
        data = _from_nvidia(data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        where = f"{NVIDIA_API_VERSION} {kind}" if nvidia else str(kind)
        raise ConfigError(f"{where}: {_explain(err, model)}") from None


#: The fields of NVIDIA's version, where they differ from what our models accept.
_NVIDIA_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    (GPU_CONFIG, ""): ("apiVersion", "kind", "sharing"),
    (GPU_CONFIG, "sharing"): ("strategy", "timeSlicingConfig", "mpsConfig"),
    (MIG_DEVICE_CONFIG, "sharing"): ("strategy", "mpsConfig"),
    (VFIO_DEVICE_CONFIG, ""): ("apiVersion", "kind", "iommu"),
}


def _nvidia_problems(data: Mapping[str, Any], model: type[BaseModel]) -> list[str]:
    """What NVIDIA's version refuses that our models would accept: our own fields (``computeMode``) and our
    spellings (``timeSlicing``, ``mps``), each named with the fields allowed there."""
    kind = str(data.get("kind"))
    problems = []
    sharing = data.get("sharing")
    for path, node in (("", data), ("sharing", sharing)):
        allowed = _NVIDIA_FIELDS.get((kind, path))
        if allowed is None or not isinstance(node, Mapping):
            continue
        for key in node:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                problems.append(f"{where}: unknown field; allowed fields here: {', '.join(allowed)}")
    if _mig_time_slicing(data) and isinstance(sharing, Mapping) and "mpsConfig" in sharing:
        problems.append("sharing: mpsConfig is set but strategy is TimeSlicing; remove mpsConfig or set strategy: MPS")
    return problems


def _from_nvidia(data: dict[str, Any]) -> dict[str, Any]:
    """NVIDIA's config in our version. TimeSlicing on a MIG device sets nothing in NVIDIA's driver (a MIG device
    is scheduled on its own; its time-slice policy is the parent's), so it becomes no sharing here."""
    data["apiVersion"] = API_VERSION
    if _mig_time_slicing(data):
        data.pop("sharing")
    return data


def _mig_time_slicing(data: Mapping[str, Any]) -> bool:
    sharing = data.get("sharing")
    on_mig = data.get("kind") == MIG_DEVICE_CONFIG
    return on_mig and isinstance(sharing, Mapping) and sharing.get("strategy") == "TimeSlicing"


def _explain(err: ValidationError, model: type[BaseModel]) -> str:
    problems = []
    for item in err.errors(include_url=False):
        path = ".".join(str(p) for p in item["loc"]) or "(top level)"
        kind = item["type"]
        ctx = item.get("ctx") or {}
        if kind == "extra_forbidden":
            allowed = _fields_at(model, [str(p) for p in item["loc"][:-1]])
            problems.append(f"{path}: unknown field; allowed fields here: {', '.join(allowed)}")
        elif kind == "literal_error":
            problems.append(f"{path}: {_shown(item['input'])} is not allowed; allowed: {ctx.get('expected', '')}")
        elif kind in ("greater_than_equal", "less_than_equal"):
            problems.append(f"{path}: {_shown(item['input'])} is out of range; allowed: 0 to 100")
        elif kind == "missing":
            problems.append(f"{path}: required field is missing")
        elif kind == "value_error":
            problems.append(f"{path}: {ctx.get('error', item['msg'])!s}")
        else:
            problems.append(f"{path}: {item['msg'].lower()} (got {_shown(item['input'])})")
    return "; ".join(problems)


def _shown(value: object, limit: int = 60, *, quoted: bool = True) -> str:
    """A value as an error quotes it, cut short (a claim's error is stored in its status and logged); reprlib
    never descends more than a few levels, so a value nested thousands deep costs nothing."""
    text = _REPR.repr(value) if quoted or not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 200, 200, 200


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    """The field names (as written in JSON) of the model at ``path``."""
    current: Any = model
    for part in path:
        for name, info in current.model_fields.items():
            names = {name, info.alias, info.serialization_alias}
            if isinstance(info.validation_alias, AliasChoices):
                names.update(str(c) for c in info.validation_alias.choices)
            if part in names:
                current = next(
                    a for a in getattr(info.annotation, "__args__", (info.annotation,)) if isinstance(a, type)
                )
                break
        else:
            return []
    return [info.serialization_alias or info.alias or name for name, info in current.model_fields.items()]


# --- resolution ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSource:
    """One of this driver's config entries: where it came from (FromClass/FromClaim), the requests it names
    (empty: all) and its opaque parameters."""

    source: str
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class DeviceTarget:
    """A device of the claim that configs may apply to."""

    name: str
    requests: tuple[str, ...]
    kind: str  # "gpu", "mig" or "vfio" (a passthrough device)


def resolve_configs(
    claim: str, configs: Sequence[ConfigSource], devices: Sequence[DeviceTarget]
) -> dict[str, AnyConfig]:
    """The effective config of each device that has one (devices without any config are left out)."""
    ordered = sorted(enumerate(configs), key=lambda e: (0 if e[1].source == "FromClass" else 1, e[0]))
    decoded: list[tuple[str, ConfigSource, AnyConfig]] = []
    for position, entry in ordered:
        where = f"config entry {position} ({entry.source or 'FromClaim'})"
        try:
            decoded.append((where, entry, decode_config(entry.parameters)))
        except ConfigError as err:
            raise ClaimError(f"claim {claim}: {where}: {err}") from None
    _refuse_vfio_configs_without_passthrough(claim, decoded, devices)
    effective: dict[str, AnyConfig] = {}
    for device in devices:
        merged: dict[str, Any] | None = None
        first = ""
        for where, entry, config in decoded:
            if entry.requests and not any(_serves(device.requests, r) for r in entry.requests):
                continue
            wanted, called = _KIND_OF_DEVICE[device.kind]
            if config.kind != wanted:
                if entry.requests:
                    raise ClaimError(
                        f"claim {claim}: {where} is a {config.kind} for requests {', '.join(entry.requests)}, but "
                        f"device {device.name} is a {called}; use kind {wanted} for it"
                        + (
                            f" ({VFIO_DEVICE_CONFIG} is for passthrough devices only)"
                            if config.kind == VFIO_DEVICE_CONFIG
                            else ""
                        )
                    )
                continue  # an entry for every request configures the devices of its own kind
            data = config.model_dump(by_alias=True, exclude_unset=True)
            if merged is None or entry.parameters.get("apiVersion") == NVIDIA_API_VERSION:
                merged, first = data, where
                continue
            # ``sharing: null`` is allowed (it unsets an earlier entry's sharing), so either side may be None.
            ours = (merged.get("sharing") or {}).get("strategy")
            theirs = (data.get("sharing") or {}).get("strategy")
            if ours and theirs and ours != theirs:
                raise ClaimError(
                    f"claim {claim}: device {device.name}: {first} asks for sharing strategy {ours} and {where} "
                    f"for {theirs}; one device has one strategy: remove one of the entries"
                )
            merged = _merge(merged, data)
        if merged is not None:
            try:
                effective[device.name] = decode_config(merged)
            except ConfigError as err:
                raise ClaimError(f"claim {claim}: device {device.name}: the merged config is invalid: {err}") from None
    return effective


def _refuse_vfio_configs_without_passthrough(
    claim: str, decoded: Sequence[tuple[str, ConfigSource, AnyConfig]], devices: Sequence[DeviceTarget]
) -> None:
    """A VfioDeviceConfig that applies to devices of the claim none of which is a passthrough device is refused:
    the claim asked for a VM's GPU and got something else (the scheduler writes an entry naming every request
    without requests, so the per-kind check of :func:`resolve_configs` would pass it over silently)."""
    for where, entry, config in decoded:
        if config.kind != VFIO_DEVICE_CONFIG:
            continue
        served = [d for d in devices if not entry.requests or any(_serves(d.requests, r) for r in entry.requests)]
        if served and not any(d.kind == "vfio" for d in served):
            device = served[0]
            raise ClaimError(
                f"claim {claim}: {where} is a {VFIO_DEVICE_CONFIG}, which is for passthrough devices only, but "
                f"device {device.name} is a {_KIND_OF_DEVICE[device.kind][1]}; drop the config, or ask for a "
                "passthrough device (its DeviceClass selects type vfio; the driver runs with --passthrough)"
            )


def _serves(device_requests: Sequence[str], request: str) -> bool:
    # A config for a request with alternatives (firstAvailable) applies to whichever sub-request was allocated.
    return any(r == request or r.startswith(request + "/") for r in device_requests)


def _merge(base: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in later.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def mib(quantity: str) -> int:
    """A limit in whole MiB (rounded down), as MPS takes it."""
    return int(Quantity.parse(quantity).value // MIB)


def json_schema() -> dict[str, Any]:
    """The JSON schema of every kind (one ``oneOf``), from the models."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": API_VERSION,
        "oneOf": [
            GpuConfig.model_json_schema(by_alias=True, mode="validation"),
            MigDeviceConfig.model_json_schema(by_alias=True, mode="validation"),
            VfioDeviceConfig.model_json_schema(by_alias=True, mode="validation"),
        ],
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
