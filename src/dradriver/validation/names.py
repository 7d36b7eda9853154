"""Kubernetes name and value formats, each stated once (k8s.io/apimachinery's validation, resource.k8s.io/v1).

Every pattern is matched whole with ``fullmatch``: the API server's Go ``regexp`` anchors ``$`` at the very end
of the string, while Python's ``re`` lets ``$`` match before a trailing newline, so ``"gpu.example.com\\n"``
would pass a ``match`` against ``^...$`` that the API server refuses.
"""

from __future__ import annotations

import re

from dradriver.quantity import is_quantity

DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN_MAX_LENGTH = 253
# resource.k8s.io: the domain of an attribute or capacity name, and a driver name, are at most 63 characters.
RESOURCE_DOMAIN_MAX_LENGTH = 63
RESOURCE_NAME_MAX_LENGTH = 32
LABEL_NAME_MAX_LENGTH = 63

# The patterns as apimachinery spells them (CEL's format library quotes them in its messages).
DNS_LABEL_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN_PATTERN = rf"{DNS_LABEL_PATTERN}(\.{DNS_LABEL_PATTERN})*"
LABEL_NAME_PATTERN = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_LABEL = re.compile(DNS_LABEL_PATTERN)
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME = re.compile(LABEL_NAME_PATTERN)
_SEMVER_ID = r"(?:0|[1-9][0-9]*)"
_SEMVER_PRE = r"(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
# Semantic Versioning 2.0.0; groups: major, minor, patch, pre-release, build. Use with fullmatch.
SEMVER = re.compile(
    rf"({_SEMVER_ID})\.({_SEMVER_ID})\.({_SEMVER_ID})"
    rf"(?:-({_SEMVER_PRE}(?:\.{_SEMVER_PRE})*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)

DNS_LABEL_HELP = "DNS label (lower-case letters, digits and '-', at most 63 characters)"
DNS_SUBDOMAIN_HELP = "DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"

__all__ = [
    "DNS_LABEL_HELP",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_HELP",
    "DNS_SUBDOMAIN_PATTERN",
    "LABEL_NAME_PATTERN",
    "SEMVER",
    "is_c_identifier",
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_key",
    "is_label_value",
    "is_qualified_name",
    "is_quantity",
    "is_semver",
]


def is_dns_label(value: object, *, max_length: int = DNS_LABEL_MAX_LENGTH) -> bool:
    """An RFC 1123 label: lower-case alphanumerics and '-', starting and ending alphanumeric."""
    return isinstance(value, str) and len(value) <= max_length and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object, *, max_length: int = DNS_SUBDOMAIN_MAX_LENGTH) -> bool:
    """An RFC 1123 subdomain: DNS labels joined by '.', at most ``max_length`` characters in all."""
    return isinstance(value, str) and len(value) <= max_length and _DNS_SUBDOMAIN.fullmatch(value) is not None


def is_c_identifier(value: object, *, max_length: int | None = None) -> bool:
    """Letters, digits and '_', not starting with a digit."""
    if not isinstance(value, str) or (max_length is not None and len(value) > max_length):
        return False
    return _C_IDENTIFIER.fullmatch(value) is not None


def is_qualified_name(value: object) -> bool:
    """A resource.k8s.io attribute or capacity name: ``<C identifier ≤32>`` or ``<DNS subdomain ≤63>/<C id ≤32>``."""
    if not isinstance(value, str):
        return False
    domain, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(domain, max_length=RESOURCE_DOMAIN_MAX_LENGTH):
        return False
    return is_c_identifier(name, max_length=RESOURCE_NAME_MAX_LENGTH)


def is_label_key(value: object) -> bool:
    """A label key: ``[<DNS subdomain>/]<name ≤63>`` where the name is alphanumerics, '-', '_' and '.'."""
    if not isinstance(value, str) or not value:
        return False
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= LABEL_NAME_MAX_LENGTH and _LABEL_NAME.fullmatch(name) is not None


def is_label_value(value: object) -> bool:
    """A label value: empty, or at most 63 alphanumerics, '-', '_' and '.', starting and ending alphanumeric."""
    if not isinstance(value, str):
        return False
    return not value or (len(value) <= LABEL_NAME_MAX_LENGTH and _LABEL_NAME.fullmatch(value) is not None)


def is_semver(value: object) -> bool:
    """A Semantic Versioning 2.0.0 version such as ``1.2.3-rc.1+build`` (no leading ``v``, no leading zeros)."""
    return isinstance(value, str) and SEMVER.fullmatch(value) is not None


_PATH_SAFE_UID = re.compile(r"[A-Za-z0-9._-]{1,253}")


def is_path_safe_uid(value: object) -> bool:
    """A claim UID as the driver names files and directories after it: Kubernetes writes UUIDs, and anything
    else (a checkpoint edited by hand, a hostile caller) must still be one path component, never ``.``/``..``."""
    return isinstance(value, str) and _PATH_SAFE_UID.fullmatch(value) is not None and value not in (".", "..")
