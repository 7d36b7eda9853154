"""Reading and checking the objects ``dradriver explain`` works on: YAML files and directories of
ResourceClaims, ResourceClaimTemplates, DeviceClasses and ResourceSlices."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cel import CelCompileError, compile_selector
from dradriver.computedomain import api as compute_domain
from dradriver.driver.prepare.config import ConfigError, decode_config
from dradriver.errors import DradriverError
from dradriver.inputs import InputError, load_yaml_file, parse_yaml, path_exists, read_stdin, type_name
from dradriver.plugin.cluster.resource_versions import VERSIONS, object_from
from dradriver.validation import default_namespace, validate_claim, validate_class, validate_slice_fields
from dradriver.validation.fields import unknown_fields
from dradriver.validation.slices import Problem, SliceShape, validate_slice

KINDS = ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "ResourceSlice")
DRA_GROUP = "resource.k8s.io"
# DRA objects explain does not read (it allocates as if no DeviceTaintRule applied).
DRA_KINDS_NOT_READ = ("DeviceTaintRule",)
SUFFIXES = (".yaml", ".yml", ".json")
#: The file name that means standard input, as kubectl's ``-f -``.
STDIN = "-"


def chart_classes(compat: str = "none") -> list[dict[str, Any]]:
    """The DeviceClasses the Helm chart installs with its defaults (``compat: nvidia``: NVIDIA's names), and those
    ``computeDomains.enabled`` adds: rendered from the chart by ``scripts/gen-manifests``, so that what explain
    assumes is what a default install has, not a second list."""
    folder = resources.files("dradriver.cli").joinpath("data/deviceclasses")
    classes: list[dict[str, Any]] = []
    sets = ("nvidia", "computedomains-nvidia") if compat == "nvidia" else ("default", "computedomains")
    for name in sets:
        classes += parse_yaml(folder.joinpath(f"{name}.yaml").read_text(), source=f"the chart's {name} DeviceClasses")
    return classes


def passthrough_classes(compat: str = "none") -> list[dict[str, Any]]:
    """The DeviceClass the chart adds with ``passthrough.enabled`` (``vfio.gpu.dradriver.dev``; NVIDIA's
    ``vfio.gpu.nvidia.com`` with ``compat: nvidia``), rendered from the chart as :func:`chart_classes` are."""
    name = "passthrough-nvidia" if compat == "nvidia" else "passthrough"
    text = resources.files("dradriver.cli").joinpath(f"data/deviceclasses/{name}.yaml").read_text()
    return parse_yaml(text, source="the chart's passthrough DeviceClass")


@dataclass
class Document:
    """One object and where it came from: ``claims.yaml #2``."""

    obj: dict[str, Any]
    source: str

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata")
        if not isinstance(meta, dict):
            meta = {}  # malformed metadata is reported by the checks; the name is only for messages
        generated = f"{meta['generateName']}*" if meta.get("generateName") else "<unnamed>"
        name = str(meta.get("name") or generated)
        return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


@dataclass
class Inputs:
    documents: list[Document] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Well-formed objects explain has no use for (the Pod or Deployment beside a claim): one note each.
    skipped: list[str] = field(default_factory=list)
    #: Whose rules ResourceSlices are checked by (``--kubernetes-version``).
    slice_shape: SliceShape = SliceShape.V1_35
    #: Whose ComputeDomains are read as their channel claim (``--compat``: ours, or NVIDIA's group and classes).
    compute_domains: compute_domain.ComputeDomainNames = compute_domain.OURS

    def of_kind(self, *kinds: str) -> list[Document]:
        return [d for d in self.documents if d.kind in kinds]


MAX_FILES = 10_000


def yaml_files(path: Path) -> list[Path]:
    """``path`` itself, or the YAML and JSON files under the directory ``path`` (symbolic links not followed)."""
    if not path.is_dir():
        return [path]
    files: list[Path] = []
    for folder, _dirs, names in os.walk(path, onerror=lambda _err: None):
        files += [Path(folder, n) for n in names if Path(n).suffix in SUFFIXES and Path(folder, n).is_file()]
        if len(files) > MAX_FILES:
            raise InputError(
                f"{path}: more than {MAX_FILES} YAML and JSON files; point at the directory that holds the objects"
            )
    return sorted(files)


def load(paths: list[str], inputs: Inputs, *, want: tuple[str, ...] = KINDS) -> None:
    """Add the documents of the files (or directories) in ``paths`` to ``inputs``; one error per bad one."""
    for raw_path in paths:
        if raw_path == STDIN:
            _load_stdin(inputs, want)
            continue
        path = Path(raw_path)
        try:
            if not path_exists(path):
                inputs.errors.append(f"{raw_path}: no such file or directory")
                continue
            files = yaml_files(path)
        except InputError as err:
            inputs.errors.append(str(err))
            continue
        for file in files:
            try:
                docs = load_yaml_file(file)
            except InputError as err:
                inputs.errors.append(str(err))
                continue
            for number, doc in enumerate(docs, start=1):
                _add(doc, f"{file} #{number}", inputs, want)


def _load_stdin(inputs: Inputs, want: tuple[str, ...]) -> None:
    """``-``: the documents on standard input (``kubectl get … -o yaml | dradriver explain -``)."""
    try:
        docs = parse_yaml(read_stdin(), source="standard input")
    except InputError as err:
        inputs.errors.append(str(err))
        return
    for number, doc in enumerate(docs, start=1):
        _add(doc, f"standard input #{number}", inputs, want)


def _add(doc: Any, source: str, inputs: Inputs, want: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        inputs.errors.append(
            f"{source}: not a Kubernetes object (a YAML mapping with apiVersion and kind): got {type_name(doc)}"
        )
        return
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
        if not isinstance(doc["items"], list):
            inputs.errors.append(f"{source}: items: expected a list, got {type_name(doc['items'])}")
            return
        # A typed list's items (ResourceClaimList from the API server) carry neither kind nor apiVersion: the
        # list's are theirs. A plain List's items name their own.
        implied = {"kind": kind.removesuffix("List"), "apiVersion": doc.get("apiVersion")} if kind != "List" else {}
        for i, item in enumerate(doc["items"]):
            _add(
                {**implied, **item} if isinstance(item, dict) else item,
                f"{source} items[{i}]",
                inputs,
                want,
            )
        return
    names = inputs.compute_domains
    if kind == "ComputeDomain" and doc.get("apiVersion") == names.api_version and "ResourceClaim" in want:
        # What a ComputeDomain asks of a node is the channel claim of the template it generates.
        domain = Document(doc, source).name
        try:
            doc = compute_domain.workload_claim_template(doc, names)
        except DradriverError as err:
            inputs.errors.append(f"{source}: {err}")
            return
        kind = "ResourceClaimTemplate"
        source = f"{source}, the claim template of ComputeDomain {domain}"
    if kind not in KINDS and _not_read(doc):
        inputs.skipped.append(f"{source}: skipped {kind} {Document(doc, source).name}: not an object explain reads")
        return
    if kind not in want:
        inputs.errors.append(f"{source}: kind {kind!r} is not one of {', '.join(want)}; field kind")
        return
    api = doc.get("apiVersion")
    if not isinstance(api, str) or not api.startswith("resource.k8s.io/"):
        inputs.errors.append(f"{source}: {kind} has apiVersion {api!r}; want resource.k8s.io/v1 (field apiVersion)")
        return
    version = api.removeprefix(f"{DRA_GROUP}/")
    if version not in VERSIONS:
        inputs.errors.append(
            f"{source}: {kind} uses {api}; the API server serves {', '.join(f'{DRA_GROUP}/{v}' for v in VERSIONS)} "
            "(field apiVersion)"
        )
        return
    unknown = [u.message() for u in unknown_fields(doc)]
    if not unknown and version != "v1":
        # As the API server stores it: converted to v1, which the checks and the allocator read.
        doc, source = object_from(version, doc), f"{source} (read as {DRA_GROUP}/v1)"
    problems = unknown or _problems(doc, kind, inputs.slice_shape)
    if problems:
        inputs.errors += [f"{source}: {problem}" for problem in problems]
        return
    inputs.documents.append(Document(doc, source))


def _not_read(doc: dict[str, Any]) -> bool:
    """A well-formed object of another API group, or a DRA kind explain does not use: skipped, not an error.
    A ``resource.k8s.io`` object of an unknown kind is still an error (most likely a misspelt kind), and so is a
    kind explain reads under another apiVersion (``apiVersion: v1`` on a ResourceClaim: the caller says so)."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not kind or not isinstance(api, str) or not api:
        return False
    return api.split("/")[0] != DRA_GROUP or kind in DRA_KINDS_NOT_READ


def _problems(doc: dict[str, Any], kind: str, shape: SliceShape) -> list[str]:
    """What the API server would refuse in ``doc``, each ``field.path: problem``."""
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        default_namespace(doc)
        problems = validate_claim(doc)
        return problems + (_allocation_problems(doc) if not problems and "status" in doc else [])
    if kind == "DeviceClass":
        return validate_class(doc)
    problems = validate_slice_fields(doc)
    if problems:
        return problems
    return [_slice_problem(p, shape) for p in validate_slice(doc, shape=shape)]


def _slice_problem(problem: Problem, shape: SliceShape) -> str:
    text = f"{problem.field}{f' (device {problem.device})' if problem.device else ''}: {problem.message}"
    if problem.rule == "devices-or-counters" and shape is SliceShape.V1_35:
        # The driver's own slices for 1.34 and older keep a MIG device's counters beside it: say how to read them.
        text += " (slices made for Kubernetes 1.34 or older keep them together: add --kubernetes-version 1.34)"
    return text


def _allocation_problems(doc: dict[str, Any]) -> list[str]:
    """The fields of ``status.allocation`` that explain reads, typed (an allocated claim's devices)."""
    status = doc.get("status")
    if not isinstance(status, dict):
        return [f"status: expected a mapping, got {type_name(status)}"]
    allocation = status.get("allocation")
    if allocation is None:
        return []
    path = "status.allocation.devices.results"
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    if not isinstance(results, list):
        return [f"{path}: expected a list, got {type_name(results)}"]
    problems = []
    for i, result in enumerate(results):
        if not isinstance(result, dict):
            problems.append(f"{path}[{i}]: expected a mapping, got {type_name(result)}")
            continue
        for key in ("request", "driver", "pool", "device"):
            if not isinstance(result.get(key), str):
                problems.append(f"{path}[{i}].{key}: expected a string, got {type_name(result.get(key))}")
    return problems


def selector_error(source: str, what: str, field_path: str, err: CelCompileError) -> str:
    return f"{source}: {what}: field {field_path}: invalid CEL at {err}"


def check_class(doc: Document) -> list[str]:
    errors = []
    for i, selector in enumerate((doc.obj.get("spec") or {}).get("selectors") or []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        path = f"spec.selectors[{i}].cel.expression"
        if not isinstance(expression, str):
            errors.append(f"{doc.source}: DeviceClass {doc.name}: field {path}: missing CEL expression")
            continue
        try:
            compile_selector(expression)
        except CelCompileError as err:
            errors.append(selector_error(doc.source, f"DeviceClass {doc.name}", path, err))
    return errors


def check_claim(doc: Document, class_names: set[str], *, driver_name: str = DEFAULT_DRIVER_NAME) -> list[str]:
    """Problems that make a claim unexplainable: unknown classes, selectors that do not compile, opaque configs
    for ``driver_name`` that prepare would refuse."""
    errors: list[str] = []
    template = doc.kind == "ResourceClaimTemplate"
    spec = doc.obj.get("spec") or {}
    prefix = "spec.spec" if template else "spec"
    if template:
        spec = spec.get("spec") or {}
    what = f"{doc.kind} {doc.name}"
    requests = (spec.get("devices") or {}).get("requests")
    if not requests:
        return [f"{doc.source}: {what}: field {prefix}.devices.requests: no requests"]
    for i, request in enumerate(requests):
        base = f"{prefix}.devices.requests[{i}]"
        if not isinstance(request, dict):
            errors.append(f"{doc.source}: {what}: field {base}: not a mapping")
            continue
        if request.get("firstAvailable"):
            entries = [(f"{base}.firstAvailable[{j}]", sub) for j, sub in enumerate(request["firstAvailable"])]
        elif isinstance(request.get("exactly"), dict):
            entries = [(f"{base}.exactly", request["exactly"])]
        else:
            errors.append(f"{doc.source}: {what}: field {base}: set exactly or firstAvailable")
            continue
        for path, entry in entries:
            class_name = entry.get("deviceClassName")
            if not class_name:
                errors.append(f"{doc.source}: {what}: field {path}.deviceClassName: missing")
            elif class_name not in class_names:
                known = ", ".join(sorted(class_names)) or "none"
                errors.append(
                    f"{doc.source}: {what}: field {path}.deviceClassName: DeviceClass {class_name} "
                    f"does not exist (known: {known}); pass it with --classes"
                )
            count = entry.get("count")
            if count is not None and (type(count) is not int or count <= 0):
                errors.append(
                    f"{doc.source}: {what}: field {path}.count: {count!r} is not a whole number greater "
                    f"than zero; leave it out for one device"
                )
            for j, selector in enumerate(entry.get("selectors") or []):
                expression = ((selector or {}).get("cel") or {}).get("expression")
                field_path = f"{path}.selectors[{j}].cel.expression"
                if not isinstance(expression, str):
                    errors.append(f"{doc.source}: {what}: field {field_path}: missing CEL expression")
                    continue
                try:
                    compile_selector(expression)
                except CelCompileError as err:
                    errors.append(selector_error(doc.source, what, field_path, err))
    errors += config_errors(doc, spec, prefix, driver_name)
    return errors


def config_errors(
    doc: Document, spec: dict[str, Any], prefix: str, driver_name: str = DEFAULT_DRIVER_NAME
) -> list[str]:
    """Our opaque configs that prepare would refuse (the same strict decoding; other drivers' are not judged)."""
    errors = []
    entries = (spec.get("devices") or {}).get("config") or []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver_name:
            continue
        try:
            decode_config(opaque.get("parameters") or {})
        except ConfigError as err:
            errors.append(
                f"{doc.source}: {doc.kind} {doc.name}: field {prefix}.devices.config[{i}].opaque.parameters: {err}"
            )
    return errors
