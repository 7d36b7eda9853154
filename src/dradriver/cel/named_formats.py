"""Kubernetes' ``format`` CEL library (k8s.io/apiserver/pkg/cel/library/format.go, 1.31+): named string
formats whose ``validate(s)`` gives optional.none() for a valid string, else the list of messages that
k8s.io/apimachinery's validation functions produce."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from dradriver.cel.errors import CelEvaluationError
from dradriver.cel.url_ext import parse_url
from dradriver.cel.values import NONE, OptionalValue
from dradriver.validation.names import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, LABEL_NAME_PATTERN

_LABEL = DNS_LABEL_PATTERN
_SUBDOMAIN = DNS_SUBDOMAIN_PATTERN
_DNS1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED = LABEL_NAME_PATTERN
_LABEL_VALUE = "(" + _QUALIFIED + ")?"
_UUID = re.compile(r"(?i)(^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$)|(^[0-9a-f]{32}$)")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})?\Z")
_QUALIFIED_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's validation.RegexError."""
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{e}'," for e in examples)
    return f"{message} (e.g. {shown} regex used for validation is '{pattern}')"


def _max_len(limit: int) -> str:
    return f"must be no more than {limit} characters"


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _dns1123_label(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_LABEL, value):
        errors.append(
            _regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character",
                _LABEL,
                "my-name",
                "123-abc",
            )
        )
    return errors


def _dns1123_subdomain(value: str) -> list[str]:
    errors = [_max_len(253)] if len(value) > 253 else []
    if not _matches(_SUBDOMAIN, value):
        errors.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character",
                _SUBDOMAIN,
                "example.com",
            )
        )
    return errors


def _dns1035_label(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_DNS1035, value):
        errors.append(
            _regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character",
                _DNS1035,
                "my-name",
                "abc-123",
            )
        )
    return errors


def _prefix(check: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    # apimachinery's NameIs…(name, prefix=true): a trailing '-' is allowed (masked before the check)
    return lambda value: check(value[:-1] + "a" if value.endswith("-") else value)


def _qualified_name(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) == 1:
        name, errors = parts[0], []
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors = ["prefix part must be non-empty"]
        else:
            errors = ["prefix part " + e for e in _dns1123_subdomain(prefix)]
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_MESSAGE, _QUALIFIED, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part " + _max_len(63))
    if name and not _matches(_QUALIFIED, name):
        errors.append("name part " + _regex_error(_QUALIFIED_MESSAGE, _QUALIFIED, "MyName", "my.name", "123-abc"))
    return errors


def _label_value(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_LABEL_VALUE, value):
        errors.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character",
                _LABEL_VALUE,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errors


def _uri(value: str) -> list[str]:
    try:
        parse_url(value)
    except CelEvaluationError as err:
        return [err.message.removeprefix("URL parse error during conversion from string: ")]
    return []


def _byte(value: str) -> list[str]:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return ["invalid base64"]
    return []


def _date(value: str) -> list[str]:
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError(value)
        dt.date.fromisoformat(value)
    except ValueError:
        return ["invalid date"]
    return []


def _datetime(value: str) -> list[str]:
    if not _DATETIME.match(value):
        return ["invalid datetime"]
    try:
        dt.date.fromisoformat(value[:10])
    except ValueError:
        return ["invalid datetime"]
    return []


class NamedFormat:
    """A ``kubernetes.NamedFormat`` value."""

    __slots__ = ("check", "name")

    def __init__(self, name: str, check: Callable[[str], list[str]]) -> None:
        self.name, self.check = name, check

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedFormat) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("format", self.name))


FORMATS = {
    name: NamedFormat(name, check)
    for name, check in {
        "dns1123Label": _dns1123_label,
        "dns1123Subdomain": _dns1123_subdomain,
        "dns1035Label": _dns1035_label,
        "qualifiedName": _qualified_name,
        "dns1123LabelPrefix": _prefix(_dns1123_label),
        "dns1123SubdomainPrefix": _prefix(_dns1123_subdomain),
        "dns1035LabelPrefix": _prefix(_dns1035_label),
        "labelValue": _label_value,
        "uri": _uri,
        "uuid": lambda v: [] if _UUID.match(v) else ["does not match the UUID format"],
        "byte": _byte,
        "date": _date,
        "datetime": _datetime,
    }.items()
}


def _validate(fmt: NamedFormat, value: str) -> OptionalValue:
    errors = fmt.check(value)
    return OptionalValue(True, errors) if errors else NONE


def _named(name: str) -> OptionalValue:
    found = FORMATS.get(name)
    return OptionalValue(True, found) if found is not None else NONE


_F = "Format"
FORMAT_FUNCTIONS: dict[str, tuple[tuple[bool, tuple[Any, ...], Any, Any], ...]] = {
    "validate": ((True, (_F, "string"), ("optional", ("list", "string")), _validate),),
    "format.named": ((False, ("string",), ("optional", _F), _named),),
}
for _name, _format in FORMATS.items():
    FORMAT_FUNCTIONS["format." + _name] = ((False, (), _F, lambda f=_format: f),)
