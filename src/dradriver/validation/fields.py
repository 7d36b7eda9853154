"""Fields the API server does not know, refused as it refuses them.

kubectl asks for strict field validation by default, so the API server refuses an object with a field its schema
lacks (``strict decoding error: unknown field "spec.devices.requests[0].exactly.selector"``) instead of dropping it.
A tool of ours that read past such a field would answer for an object the cluster never accepts: a misspelt
``selectors`` would select every device. The field names come from Kubernetes' own OpenAPI schemas
(``data/api_fields.json``, made by ``scripts/gen-api-fields`` and checked current by the suite)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class UnknownField:
    """A field the schema of its object lacks, at ``path`` (``spec.devices.requests[0].exactly.selector``)."""

    path: str
    known: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def nearest(self) -> str | None:
        """The known field the name most resembles (``selectors`` for ``selector``), if any is close."""
        close = difflib.get_close_matches(self.name, self.known, n=1, cutoff=0.6)
        if not close:
            close = [k for k in self.known if k.lower() == self.name.lower()]
        return close[0] if close else None

    def message(self) -> str:
        """One line as the API server words it, with the fix."""
        hint = f'; did you mean "{self.nearest}"?' if self.nearest else f"; known here: {', '.join(self.known)}"
        return f'unknown field "{self.path}" (the API server refuses it){hint}'


@cache
def _table() -> dict[str, Any]:
    text = resources.files("dradriver.validation").joinpath("data/api_fields.json").read_text()
    return dict(json.loads(text))


def schema_version() -> str:
    """The Kubernetes release whose schemas the table holds."""
    return str(_table()["kubernetes"])


def knows(api_version: object, kind: object) -> bool:
    """Whether the table has the schema of ``kind`` in ``api_version``."""
    return f"{api_version} {kind}" in _table()["kinds"]


def unknown_fields(obj: Mapping[str, Any]) -> list[UnknownField]:
    """Every field of ``obj`` its schema lacks, by its ``apiVersion`` and ``kind``; none for a kind the table does not
    hold (other checks refuse those). Values of the wrong type are left to the checks of values."""
    shape = _table()["kinds"].get(f"{obj.get('apiVersion')} {obj.get('kind')}")
    found: list[UnknownField] = []
    if shape:
        _walk(obj, shape, "", found)
    return found


def _walk(value: Any, shape: str, path: str, found: list[UnknownField]) -> None:
    if not shape:
        return
    if shape.startswith("[]"):
        for index, item in enumerate(value if isinstance(value, list) else ()):
            _walk(item, shape[2:], f"{path}[{index}]", found)
        return
    if shape.startswith("{}"):
        for key, item in (value if isinstance(value, dict) else {}).items():
            _walk(item, shape[2:], f"{path}[{key}]", found)
        return
    if not isinstance(value, dict):
        return
    fields: dict[str, str] = _table()["types"][shape]
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            found.append(UnknownField(where, tuple(fields)))
        else:
            _walk(item, fields[key], where, found)
