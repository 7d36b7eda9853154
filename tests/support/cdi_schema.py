"""A check of CDI spec documents against the CDI specification (container-device-interface SPEC.md and its Go
types, as restated in shared/spec/cdi-and-nvml-ops.md §1), independent of the code that writes them.

The JSON schema follows the Go structs' JSON tags: every object is closed (the library parses strictly, so an
unknown field invalidates the file). The rules JSON schema cannot say — name syntax, unique device names, the
declared version being known and at least what the content needs — are checked in :func:`cdi_problems`.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_STRINGS = {"type": "array", "items": {"type": "string"}}
_DEVICE_NODE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path"],
    "properties": {
        "path": {"type": "string", "pattern": "^/"},
        "hostPath": {"type": "string", "pattern": "^/"},
        "type": {"enum": ["b", "c", "u", "p", ""]},
        "major": {"type": "integer"},
        "minor": {"type": "integer"},
        "fileMode": {"type": "integer", "minimum": 0},
        "permissions": {"type": "string", "pattern": "^(none|[rwm]*)$"},
        "uid": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
        "gid": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
    },
}
_MOUNT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["hostPath", "containerPath"],
    "properties": {
        "hostPath": {"type": "string", "minLength": 1},
        "containerPath": {"type": "string", "minLength": 1},
        "options": _STRINGS,
        "type": {"type": "string"},
    },
}
_HOOK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["hookName", "path"],
    "properties": {
        "hookName": {
            "enum": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"]
        },
        "path": {"type": "string", "pattern": "^/"},
        "args": _STRINGS,
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "timeout": {"type": "integer", "exclusiveMinimum": 0},
    },
}
_EDITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "deviceNodes": {"type": "array", "items": _DEVICE_NODE},
        "mounts": {"type": "array", "items": _MOUNT},
        "hooks": {"type": "array", "items": _HOOK},
        "intelRdt": {"type": "object"},
        "additionalGids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "netDevices": {"type": "array", "items": {"type": "object"}},
    },
}
_ANNOTATIONS = {"type": "object", "additionalProperties": {"type": "string"}}

CDI_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "annotations": _ANNOTATIONS,
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "containerEdits"],
                "properties": {
                    "name": {"type": "string"},
                    "annotations": _ANNOTATIONS,
                    # A device with empty edits invalidates the whole file.
                    "containerEdits": {**_EDITS, "minProperties": 1},
                },
            },
        },
        "containerEdits": _EDITS,
    },
}

_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def _needed_version(spec: dict[str, Any]) -> str:
    """The minimum version by the specification's own feature table (newest predicate first)."""
    all_edits = [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
    if any(e.get("netDevices") for e in all_edits):
        return "1.1.0"
    if any(e.get("intelRdt") or e.get("additionalGids") for e in all_edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]):
        return "0.6.0"
    if "." in spec["kind"].partition("/")[2]:
        return "0.6.0"
    if any("hostPath" in n for e in all_edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(d["name"][:1].isdigit() for d in spec["devices"]):
        return "0.5.0"
    if any(m.get("type") for e in all_edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.removeprefix("v").split("."))


def cdi_problems(spec: dict[str, Any], *, max_version: str = "1.1.0") -> list[str]:
    """Everything that makes ``spec`` invalid for a CDI library that knows versions up to ``max_version``."""
    problems = [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in jsonschema.Draft202012Validator(CDI_SCHEMA).iter_errors(spec)
    ]
    if problems:
        return problems
    vendor, slash, klass = spec["kind"].partition("/")
    if not slash or not _VENDOR_OR_CLASS.fullmatch(vendor) or not _VENDOR_OR_CLASS.fullmatch(klass):
        problems.append(f"kind {spec['kind']!r} is not vendor/class")
    names = [d["name"] for d in spec["devices"]]
    problems += [f"device name {n!r} is not valid" for n in names if not _DEVICE_NAME.fullmatch(n)]
    if len(set(names)) != len(names):
        problems.append("device names are not unique")
    declared = spec["cdiVersion"].removeprefix("v")
    if declared not in KNOWN_VERSIONS or _version_key(declared) > _version_key(max_version):
        problems.append(f"cdiVersion {declared} is unknown to a library that knows up to {max_version}")
    elif _version_key(declared) < _version_key(_needed_version(spec)):
        problems.append(f"cdiVersion {declared} is below {_needed_version(spec)}, which the content needs")
    return problems
