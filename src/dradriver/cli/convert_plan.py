"""NVIDIA's device plugin to DRA, without I/O: what ``dradriver convert`` prints for a device plugin config and the
workloads that ask for ``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` in their limits.

Every object comes with the comments that say what it cannot express exactly (docs/migrating-from-device-plugin.md).
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.driver.prepare.config import ConfigError, decode_config
from dradriver.errors import DradriverError
from dradriver.inputs import parse_yaml, type_name
from dradriver.quantity import parse_quantity
from dradriver.validation.names import DNS_LABEL_MAX_LENGTH, DNS_SUBDOMAIN_MAX_LENGTH

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_CLASS = "gpu.dradriver.dev"
MIG_CLASS = "mig.dradriver.dev"
CONFIG_API = "gpu.dradriver.dev/v1alpha1"
MIG_STRATEGIES = ("none", "single", "mixed")
Strategy = Literal["TimeSlicing", "MPS"]
# Where each workload kind keeps its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
# Kinds whose pods run side by side from one template: one shared claim lets them share a GPU as the plugin's
# replicas did. (A DaemonSet's pods are on different nodes, and a claim is allocated on one node.)
REPLICATED = ("Deployment", "StatefulSet", "ReplicaSet")
SHARING_KEYS: dict[str, Strategy] = {"timeSlicing": "TimeSlicing", "mps": "MPS"}
SHARING_FIELDS = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
RESOURCE_FIELDS = {"name", "rename", "replicas", "devices"}


class ConvertError(DradriverError):
    """Input convert cannot read; the message names the input, the field and the fix."""


@dataclass(frozen=True)
class SharedResource:
    """One entry of the plugin's ``sharing.<strategy>.resources``."""

    name: str  # what the plugin shares: nvidia.com/gpu or nvidia.com/mig-<profile>
    advertised: str  # what pods ask for: the name, its rename, or <name>.shared
    strategy: Strategy
    replicas: int
    devices: Any  # None, "all", or the GPUs it names
    fail_requests_greater_than_one: bool


@dataclass
class PluginConfig:
    """The device plugin's config file (``version: v1``), as far as convert needs it."""

    source: str
    mig_strategy: str = "none"
    shared: dict[str, SharedResource] = field(default_factory=dict)  # by advertised name


@dataclass
class Converted:
    """One object to print and the comments above it."""

    obj: dict[str, Any]
    comments: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """Everything convert prints: notes for the top, then the objects."""

    notes: list[str] = field(default_factory=list)
    classes: list[Converted] = field(default_factory=list)
    claims: list[Converted] = field(default_factory=list)
    workloads: list[Converted] = field(default_factory=list)

    def objects(self) -> list[Converted]:
        return self.classes + self.claims + self.workloads


def is_plugin_config(doc: Any) -> bool:
    """A device plugin config file: a mapping with ``version`` and no ``kind``."""
    return isinstance(doc, dict) and "version" in doc and "kind" not in doc


def configs_in_config_map(doc: dict[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """The plugin configs a ConfigMap holds, by key (the plugin picks one per node by the label
    ``nvidia.com/device-plugin.config``); {} when it holds none."""
    data = doc.get("data")
    if not isinstance(data, dict):
        return {}
    found = {}
    for key, text in data.items():
        if not isinstance(text, str):
            continue
        docs = parse_yaml(text, source=f"{source} data.{key}")
        if len(docs) == 1 and is_plugin_config(docs[0]):
            found[str(key)] = docs[0]
    return found


def read_plugin_config(data: dict[str, Any], source: str) -> PluginConfig:
    """The config file's MIG strategy and shared resources; ``ConvertError`` for what the plugin would refuse."""
    if data.get("version") != "v1":
        raise ConvertError(f"{source}: field version: {data.get('version')!r} is not a version convert reads; want v1")
    flags = _mapping(data.get("flags"), source, "flags")
    strategy = flags.get("migStrategy", "none")
    if strategy not in MIG_STRATEGIES:
        raise ConvertError(f"{source}: field flags.migStrategy: {strategy!r}; want one of {', '.join(MIG_STRATEGIES)}")
    config = PluginConfig(source=source, mig_strategy=str(strategy))
    sharing = _mapping(data.get("sharing"), source, "sharing")
    for key, name in SHARING_KEYS.items():
        if sharing.get(key) is not None:
            for resource in _shared_resources(sharing[key], source, f"sharing.{key}", name):
                if resource.advertised in config.shared:
                    raise ConvertError(
                        f"{source}: field sharing.{key}.resources: {resource.advertised} is shared twice; "
                        "keep one entry"
                    )
                config.shared[resource.advertised] = resource
    return config


def _mapping(value: Any, source: str, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConvertError(f"{source}: field {path}: expected a mapping, got {type_name(value)}")
    return value


def _shared_resources(block: Any, source: str, path: str, strategy: Strategy) -> list[SharedResource]:
    block = _mapping(block, source, path)
    unknown = sorted(set(block) - SHARING_FIELDS)
    if unknown:
        raise ConvertError(f"{source}: field {path}.{unknown[0]}: unknown; known: {', '.join(sorted(SHARING_FIELDS))}")
    rename_by_default = _flag(block, "renameByDefault", source, path, default=False)
    # MPS in the plugin refuses a request for more than one replica whatever the field says.
    fail = _flag(block, "failRequestsGreaterThanOne", source, path, default=strategy == "MPS") or strategy == "MPS"
    entries = block.get("resources")
    if not isinstance(entries, list) or not entries:
        raise ConvertError(f"{source}: field {path}.resources: expected a list of resources to share")
    return [
        _shared_resource(
            _mapping(entry, source, f"{path}.resources[{i}]"),
            source,
            f"{path}.resources[{i}]",
            strategy,
            rename_by_default=rename_by_default,
            fail=fail,
        )
        for i, entry in enumerate(entries)
    ]


def _shared_resource(
    entry: dict[str, Any], source: str, where: str, strategy: Strategy, *, rename_by_default: bool, fail: bool
) -> SharedResource:
    unknown = sorted(set(entry) - RESOURCE_FIELDS)
    if unknown:
        raise ConvertError(
            f"{source}: field {where}.{unknown[0]}: unknown; known: {', '.join(sorted(RESOURCE_FIELDS))}"
        )
    name, replicas = entry.get("name"), entry.get("replicas")
    if not isinstance(name, str) or not (name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)):
        raise ConvertError(
            f"{source}: field {where}.name: {name!r}; want {GPU_RESOURCE} or {MIG_RESOURCE_PREFIX}<profile>"
        )
    if type(replicas) is not int or replicas < 1:
        raise ConvertError(f"{source}: field {where}.replicas: {replicas!r}; want a whole number of at least 1")
    rename = entry.get("rename")
    if rename is not None and not isinstance(rename, str):
        raise ConvertError(f"{source}: field {where}.rename: expected a resource name, got {type_name(rename)}")
    advertised = rename or (f"{name}.shared" if rename_by_default else name)
    return SharedResource(name, advertised, strategy, replicas, entry.get("devices"), fail)


def _flag(block: dict[str, Any], key: str, source: str, path: str, *, default: bool) -> bool:
    value = block.get(key, default)
    if not isinstance(value, bool):
        raise ConvertError(f"{source}: field {path}.{key}: {value!r}; want true or false")
    return value


@dataclass(frozen=True)
class Ask:
    """What one container asks of one GPU resource, in DRA terms."""

    resource: str
    count: int
    class_name: str
    parameters: dict[str, Any] | None
    shared: SharedResource | None
    comments: tuple[str, ...]


def device_ask(resource: str, count: int, config: PluginConfig) -> Ask:
    """The DeviceClass and opaque config for ``count`` of the plugin's ``resource``, and what differs."""
    shared = config.shared.get(resource)
    base = shared.name if shared else resource
    comments: list[str] = []
    mig = base.startswith(MIG_RESOURCE_PREFIX)
    if mig:
        class_name = f"mig-{base.removeprefix(MIG_RESOURCE_PREFIX)}.dradriver.dev"
        if config.mig_strategy != "mixed":
            comments.append(
                f"{resource}: a mixed-strategy resource name, though the config's flags.migStrategy is "
                f"{config.mig_strategy}; our MIG classes are per profile whatever the strategy."
            )
    elif config.mig_strategy == "single":
        class_name, mig = MIG_CLASS, True
        comments.append(
            f"{resource} under migStrategy single meant one MIG device (every GPU split alike); {MIG_CLASS} takes "
            "any MIG device: use the mig-<profile>.dradriver.dev class to keep the profile you had."
        )
    else:
        class_name = GPU_CLASS
    parameters = _sharing_parameters(shared, mig=mig, comments=comments) if shared else None
    if shared and count > 1:
        refused = (
            "refused this pod (failRequestsGreaterThanOne)"
            if shared.fail_requests_greater_than_one
            else (f"gave it {count} replicas, possibly of one GPU")
        )
        comments.append(f"{resource}: {count}: the device plugin {refused}; here the claim gets {count} devices.")
    if shared and shared.devices not in (None, "all"):
        comments.append(
            f"{resource}: the plugin shared only devices {shared.devices}; this claim may get any device of "
            f"{class_name} (add a selector on uuid to keep that subset)."
        )
    return Ask(resource, count, class_name, parameters, shared, tuple(comments))


def _sharing_parameters(shared: SharedResource, *, mig: bool, comments: list[str]) -> dict[str, Any] | None:
    kind = "MigDeviceConfig" if mig else "GpuConfig"
    replicas = (
        f"{shared.advertised}: the device plugin advertised {shared.replicas} replicas of each device; our driver "
        f"shares a device among the claims that hold it: the pods of one shared ResourceClaim, or one consumable "
        f"share each (dradriver run --consumable-shares {shared.replicas}, docs/sharing.md)."
    )
    comments.append(replicas)
    if shared.advertised != shared.name:
        comments.append(f"{shared.advertised}: the plugin's name for shared {shared.name}; a claim names no resource.")
    if shared.strategy == "TimeSlicing":
        if mig:
            comments.append("time-slicing a MIG device: nothing to set, its processes share it as they did.")
            return None
        return {"apiVersion": CONFIG_API, "kind": kind, "sharing": {"strategy": "TimeSlicing"}}
    percentage = max(1, 100 // shared.replicas)
    comments.append(
        f"MPS: the plugin gave each of {shared.replicas} replicas 1/{shared.replicas} of the threads and memory; "
        f"here one MPS daemon per claim with {percentage}% of the threads and no memory limit (set "
        "defaultPinnedDeviceMemoryLimit to the share of your GPU's memory you want)."
    )
    mps = {"defaultActiveThreadPercentage": percentage}
    return {"apiVersion": CONFIG_API, "kind": kind, "sharing": {"strategy": "MPS", "mps": mps}}


def opaque_config(requests: list[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """A claim's ``devices.config`` entry for our driver; the parameters decode as prepare would decode them."""
    try:
        decode_config(parameters)
    except ConfigError as err:  # our own output: a bug, not the user's input
        raise AssertionError(f"convert made a config prepare refuses: {err}") from err
    return {"requests": requests, "opaque": {"driver": DEFAULT_DRIVER_NAME, "parameters": parameters}}


def dns_label(text: str, limit: int = DNS_LABEL_MAX_LENGTH) -> str:
    """``text`` as a DNS name of at most ``limit`` characters: lower case, dots and other signs as dashes; a longer
    one is cut and ends in a hash of the whole, so that two long names that differ only at the end stay apart."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "gpu"
    if len(label) <= limit:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    return f"{label[: limit - len(digest) - 1].rstrip('-')}-{digest}"


def copy_object(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)


@dataclass(frozen=True)
class Workload:
    obj: dict[str, Any]
    source: str

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata")
        return str(meta.get("name") or "workload") if isinstance(meta, dict) else "workload"

    @property
    def namespace(self) -> str:
        meta = self.obj.get("metadata")
        return str(meta.get("namespace") or "") if isinstance(meta, dict) else ""


def pod_spec(workload: Workload) -> dict[str, Any] | None:
    """The workload's pod spec, or None where it has none."""
    node: Any = workload.obj
    for key in POD_SPEC_PATHS.get(workload.kind, ()):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def is_gpu_resource(name: str, config: PluginConfig) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX) or name in config.shared


def gpu_asks(workload: Workload, config: PluginConfig) -> list[tuple[dict[str, Any], Ask]]:
    """Each container's GPU resources, as asks; ``ConvertError`` for a count that is not a whole number."""
    spec = pod_spec(workload)
    if spec is None:
        return []
    path = ".".join(POD_SPEC_PATHS[workload.kind])
    found = []
    for group in ("initContainers", "containers"):
        for i, container in enumerate(_list(spec.get(group), workload.source, f"{path}.{group}")):
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            limits, requests = _quantities(resources.get("limits")), _quantities(resources.get("requests"))
            for resource in sorted({*requests, *limits}):
                if is_gpu_resource(resource, config):
                    key = "limits" if resource in limits else "requests"
                    where = f"{path}.{group}[{i}].resources.{key}[{resource}]"
                    count = _count((limits if resource in limits else requests)[resource], workload.source, where)
                    if count:
                        found.append((container, device_ask(resource, count, config)))
    return found


def _list(value: Any, source: str, where: str) -> list[Any]:
    """``value`` where it is a list, [] where it is absent; ``ConvertError`` naming ``where`` otherwise (convert
    cannot walk or add to it)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConvertError(f"{source}: field {where}: expected a list, got {type_name(value)}")
    return value


def _quantities(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}  # a malformed list is the API server's to refuse


def _count(value: Any, source: str, where: str) -> int:
    """The devices a quantity asks for: any quantity of a whole value ("2", "1.0", "1000m"), as the API server
    takes for an extended resource; ``ConvertError`` for a fraction, a negative number or no quantity at all."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # YAML's 1.0: JSON's number, which the API server reads as the quantity 1
    number = parse_quantity(value)
    if number is None or number < 0 or number.denominator != 1:
        raise ConvertError(f"{source}: field {where}: {value!r}; want a whole number of devices")
    return int(number)


def plan(
    workloads: list[Workload], config: PluginConfig, *, keep_limits: bool, chart_classes: list[dict[str, Any]]
) -> Plan:
    """What convert prints for ``workloads`` under ``config``: DeviceClasses the chart lacks, claims and the
    rewritten workloads (or, with ``keep_limits``, only what the cluster needs for the workloads as written)."""
    result = Plan()
    chart = {str(c["metadata"]["name"]): c for c in chart_classes}
    bridged = {str(c["spec"].get("extendedResourceName")): str(c["metadata"]["name"]) for c in chart_classes}
    asks = [(w, container, ask) for w in workloads for container, ask in gpu_asks(w, config)]
    if keep_limits:
        _keep_limits(result, config, [ask for _w, _c, ask in asks], chart, bridged)
        return result
    for ask in [ask for _w, _c, ask in asks if ask.class_name not in chart]:
        _add_class(result, ask.class_name, None, chart, extended=ask.shared.name if ask.shared else ask.resource)
    clashing = _names_of_several_kinds(workloads)
    for workload in workloads:
        _rewrite(result, workload, config, with_kind=(workload.namespace, workload.name) in clashing)
    _refuse_duplicates(result)
    return result


def _names_of_several_kinds(workloads: list[Workload]) -> set[tuple[str, str]]:
    """The (namespace, name)s that workloads of more than one kind share: their claims need the kind in the name."""
    kinds: dict[tuple[str, str], set[str]] = {}
    for workload in workloads:
        kinds.setdefault((workload.namespace, workload.name), set()).add(workload.kind)
    return {key for key, found in kinds.items() if len(found) > 1}


def _refuse_duplicates(result: Plan) -> None:
    """``ConvertError`` where two printed objects share kind, namespace and name: applied, one would replace the
    other (and the workloads of both would share its devices)."""
    seen: set[tuple[str, str, str]] = set()
    for converted in result.objects():
        meta = converted.obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        key = (str(converted.obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
        if key in seen:
            kind, namespace, name = key
            where = f" in namespace {namespace}" if namespace else ""
            raise ConvertError(
                f"two objects would be {kind} {name}{where}: rename a workload or a container, or convert them apart"
            )
        seen.add(key)


def _selectors(class_name: str, chart: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    if class_name in chart:
        return copy.deepcopy(chart[class_name]["spec"]["selectors"])
    attributes = f'device.attributes["{DEFAULT_DRIVER_NAME}"]'
    profile = class_name.removeprefix("mig-").removesuffix(".dradriver.dev")
    expression = (
        f'device.driver == "{DEFAULT_DRIVER_NAME}" && {attributes}.type == "mig" && {attributes}.profile == "{profile}"'
    )
    return [{"cel": {"expression": expression}}]


def _add_class(
    result: Plan,
    class_name: str,
    parameters: dict[str, Any] | None,
    chart: dict[str, dict[str, Any]],
    *,
    extended: str | None,
    based_on: str | None = None,
) -> None:
    """A DeviceClass ``class_name`` unless the chart installs it (or it is printed already)."""
    if (class_name in chart and parameters is None and extended is None) or any(
        c.obj["metadata"]["name"] == class_name for c in result.classes
    ):
        return
    spec: dict[str, Any] = {"extendedResourceName": extended} if extended else {}
    spec["selectors"] = _selectors(based_on or class_name, chart)
    if parameters:
        spec["config"] = [{"opaque": opaque_config([], parameters)["opaque"]}]
    resource = extended or f"{MIG_RESOURCE_PREFIX}{class_name.removeprefix('mig-').removesuffix('.dradriver.dev')}"
    comments = [f"The chart installs no DeviceClass for {resource}: this one bridges it."]
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": class_name}, "spec": spec}
    result.classes.append(Converted(obj, comments))


def _keep_limits(
    result: Plan, config: PluginConfig, asks: list[Ask], chart: dict[str, dict[str, Any]], bridged: dict[str, str]
) -> None:
    """--keep-limits: the DeviceClasses that bridge what the workloads (and the plugin config) ask for."""
    result.notes.append(
        "--keep-limits: the workloads stay as written (remove runtimeClassName: nvidia where they set it: CDI needs "
        "no runtime class); the scheduler turns each limit into a claim through a DeviceClass's extendedResourceName."
    )
    by_resource = {ask.resource: ask for ask in asks}
    for resource in sorted({*by_resource, *config.shared}):
        ask = by_resource.get(resource) or device_ask(resource, 1, config)
        if resource not in bridged:
            name = f"{resource.split('/')[-1]}.dradriver.dev"
            _add_class(result, name, ask.parameters, chart, extended=resource, based_on=ask.class_name)
            result.classes[-1].comments.extend(ask.comments)
            continue
        result.notes.append(f"{resource}: served by the chart's DeviceClass {bridged[resource]}.")
        result.notes.extend(ask.comments)
        if ask.class_name != bridged[resource]:
            result.notes.append(
                f"{resource}: the chart's {bridged[resource]} hands out whole GPUs, not {ask.class_name}'s devices; "
                "drop --keep-limits to have the workloads ask for those."
            )
        elif ask.parameters:
            result.notes.append(
                f"{resource}: the claim the scheduler makes for it gets a device of {bridged[resource]} with no "
                "sharing config, one device per pod; rename the resource (renameByDefault) or drop --keep-limits "
                "to keep the sharing."
            )


def _claim_object(workload: Workload, ask: Ask, name: str, *, template: bool) -> dict[str, Any]:
    request_name = "mig" if ask.class_name.startswith("mig") else "gpu"
    exactly: dict[str, Any] = {"deviceClassName": ask.class_name}
    if ask.count > 1:
        exactly["count"] = ask.count
    devices: dict[str, Any] = {"requests": [{"name": request_name, "exactly": exactly}]}
    if ask.parameters:
        devices["config"] = [opaque_config([request_name], ask.parameters)]
    metadata: dict[str, Any] = {"name": name}
    meta = workload.obj.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    if namespace:
        metadata["namespace"] = namespace
    spec = {"spec": {"devices": devices}} if template else {"devices": devices}
    kind = "ResourceClaimTemplate" if template else "ResourceClaim"
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": metadata, "spec": spec}


def _rewrite(result: Plan, original: Workload, config: PluginConfig, *, with_kind: bool) -> None:
    """The workload with claims in place of its GPU limits (and the claims), or nothing when it asks for none;
    ``with_kind`` puts the workload's kind in the claims' names (a workload of another kind has its name)."""
    workload = Workload(copy.deepcopy(original.obj), original.source)
    spec = pod_spec(workload)
    asks = gpu_asks(workload, config)
    if spec is None or (not asks and spec.get("runtimeClassName") != "nvidia"):
        result.notes.append(f"{original.source}: {original.kind} {original.name} asks for no GPU: left out.")
        return
    comments = [f"{workload.kind} {workload.name} from {workload.source}: GPU limits replaced by claims."]
    if spec.get("runtimeClassName") == "nvidia":
        del spec["runtimeClassName"]
        comments.append(
            "runtimeClassName: nvidia removed: the driver hands GPUs over by CDI, which needs no runtime class."
        )
    _check_claim_lists(workload, spec, asks)
    owner = f"{workload.name}-{workload.kind}" if with_kind else workload.name
    # An init container (not a sidecar) has ended before the app containers start: the kubelet handed its
    # plugin GPUs on to them, so the pod needed max(init, sum of app), not the sum of both.
    init = {
        id(c) for c in spec.get("initContainers") or [] if isinstance(c, dict) and c.get("restartPolicy") != "Always"
    }
    given: list[tuple[str, Ask]] = []
    for container, ask in [(c, a) for c, a in asks if id(c) not in init]:
        given.append((_give_claim(result, workload, spec, container, ask, owner=owner), ask))
    for container, ask in [(c, a) for c, a in asks if id(c) in init]:
        name = container.get("name", "gpu")
        host = next((ref for ref, app in given if app.resource == ask.resource and app.count >= ask.count), None)
        if host is not None:
            _point_at_claim(spec, container, ask, host, reference=None)
            comments.append(
                f"init container {name}: {ask.resource}: {ask.count} uses claim {host} of an app container (and sees "
                "all its devices): the kubelet handed the init container's GPUs on to the app containers."
            )
            continue
        _give_claim(result, workload, spec, container, ask, owner=owner)
        comments.append(
            f"init container {name}: {ask.resource}: {ask.count}: no app container asks for as many, so it has a "
            "claim of its own: the pod now needs more GPUs than under the device plugin, which handed the init "
            "container's GPUs on to the app containers."
        )
    result.workloads.append(Converted(workload.obj, comments))


def _check_claim_lists(workload: Workload, spec: dict[str, Any], asks: list[tuple[dict[str, Any], Ask]]) -> None:
    """``ConvertError`` where a list convert adds a claim to (the pod's, a GPU container's) is something else."""
    path = ".".join(POD_SPEC_PATHS[workload.kind])
    _list(spec.get("resourceClaims"), workload.source, f"{path}.resourceClaims")
    asking = {id(container) for container, _ask in asks}
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            if id(container) in asking:
                where = f"{path}.{group}[{i}].resources.claims"
                _list(container["resources"].get("claims"), workload.source, where)


def _give_claim(
    result: Plan, workload: Workload, spec: dict[str, Any], container: dict[str, Any], ask: Ask, *, owner: str
) -> str:
    """A claim (or template) of its own for ``container``'s ``ask``, added to ``result``; the pod's name for it."""
    ref = dns_label(f"{container.get('name', 'gpu')}-{ask.resource.split('/')[-1]}")
    claim_name = dns_label(f"{owner}-{ref}", DNS_SUBDOMAIN_MAX_LENGTH)
    shared = workload.kind in REPLICATED and ask.shared is not None
    reference = "resourceClaimName" if shared else "resourceClaimTemplateName"
    _point_at_claim(spec, container, ask, ref, reference={reference: claim_name})
    claim_comments = list(ask.comments)
    if shared:
        claim_comments.append(
            f"One ResourceClaim for every pod of {workload.kind} {workload.name}: they share one device on one "
            "node, however many replicas; the plugin spread replicas over any device with one free."
        )
    result.claims.append(Converted(_claim_object(workload, ask, claim_name, template=not shared), claim_comments))
    return ref


def _point_at_claim(
    spec: dict[str, Any], container: dict[str, Any], ask: Ask, ref: str, *, reference: dict[str, str] | None
) -> None:
    """``container``'s limit for ``ask`` replaced by the pod's claim ``ref`` (added to the pod with ``reference``
    unless that is None: the pod has it already)."""
    resources = container["resources"]
    for key in ("limits", "requests"):
        if isinstance(resources.get(key), dict):
            resources[key].pop(ask.resource, None)
            if not resources[key]:
                del resources[key]
    resources["claims"] = [*(resources.get("claims") or []), {"name": ref}]
    if reference is not None:
        spec["resourceClaims"] = [*(spec.get("resourceClaims") or []), {"name": ref, **reference}]
