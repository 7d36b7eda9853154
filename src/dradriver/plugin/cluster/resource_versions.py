"""The versions of resource.k8s.io this driver speaks, the one a server serves, and ResourceSlices in its shape.

Kubernetes 1.34 and later serve ``v1``; 1.33 serves ``v1beta2`` (and ``v1beta1``); 1.32 only ``v1beta1``. API
discovery (``GET /apis/resource.k8s.io``) decides: the newest version the server lists. The rest of the driver
speaks ``v1`` alone; this module converts ResourceSlices at the edge, both ways:

- ``v1beta2`` has the shape of ``v1`` (a device's fields beside its name).
- ``v1beta1`` nests them in ``basic`` (``{name, basic: {attributes, capacity, …}}``).

Fields a version does not have are the caller's to avoid (the slice shape for the server's release leaves out
what it would refuse): a conversion never drops anything silently.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

GROUP = "resource.k8s.io"
#: Newest first: the order in which a served version is chosen.
VERSIONS = ("v1", "v1beta2", "v1beta1")


def newest_served(group: Mapping[str, Any]) -> str | None:
    """The newest of :data:`VERSIONS` an ``APIGroup`` discovery document lists, or None when it lists none."""
    served = {str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, Mapping)}
    return next((v for v in VERSIONS if v in served), None)


def slice_to(version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ``v1`` ResourceSlice object in ``version``'s shape (a copy)."""
    converted = copy.deepcopy(dict(obj))
    converted["apiVersion"] = f"{GROUP}/{version}"
    spec = converted.get("spec")
    if version == "v1beta1" and isinstance(spec, dict) and isinstance(spec.get("devices"), list):
        spec["devices"] = [
            {"name": d.get("name"), "basic": {k: v for k, v in d.items() if k != "name"}} if isinstance(d, dict) else d
            for d in spec["devices"]
        ]
    return converted


def slice_from(version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice object the server sent in ``version``, in the ``v1`` shape (a copy)."""
    converted = copy.deepcopy(dict(obj))
    if "apiVersion" in converted:
        converted["apiVersion"] = f"{GROUP}/v1"
    spec = converted.get("spec")
    if version == "v1beta1" and isinstance(spec, dict) and isinstance(spec.get("devices"), list):
        spec["devices"] = [
            {"name": d.get("name"), **(d.get("basic") or {})} if isinstance(d, dict) else d for d in spec["devices"]
        ]
    return converted


#: The fields of a v1beta1 request that v1 moved under ``exactly`` (the request's ``name`` and ``firstAvailable`` stay).
V1BETA1_EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
    "derivedAttributes",
)


def _is_set(value: Any) -> bool:
    """Set as Go's conversion sees a decoded field: not its zero value (``""``, ``0``, null); an empty list is set."""
    return value is not None and value != "" and not (isinstance(value, int) and value == 0)


def _request_from_v1beta1(request: dict[str, Any]) -> None:
    """As the API server converts a request: when any field v1 nests is set, they all go under ``exactly``, whatever
    ``firstAvailable`` holds (validation then refuses a request with both); zero values are dropped, as on the wire."""
    moved = {k: request.pop(k) for k in V1BETA1_EXACT_FIELDS if k in request}
    exact = {k: v for k, v in moved.items() if _is_set(v)}
    if exact:
        request["exactly"] = exact


def object_from(version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim, ResourceClaimTemplate, DeviceClass or ResourceSlice written in ``version``, in the ``v1``
    shape (a copy), as the API server converts it: ``v1beta2`` differs only in its name; ``v1beta1`` requests carry
    what ``v1`` nests in ``exactly``, and its slices nest a device's fields in ``basic``."""
    kind = obj.get("kind")
    if kind == "ResourceSlice":
        return slice_from(version, obj)
    converted = copy.deepcopy(dict(obj))
    converted["apiVersion"] = f"{GROUP}/v1"
    if version != "v1beta1" or kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        return converted
    spec = converted.get("spec")
    if kind == "ResourceClaimTemplate" and isinstance(spec, dict):
        spec = spec.get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for request in requests if isinstance(requests, list) else ():
        if isinstance(request, dict):
            _request_from_v1beta1(request)
    return converted
