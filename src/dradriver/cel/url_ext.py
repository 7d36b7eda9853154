"""Kubernetes' URL CEL library (k8s.io/apiserver/pkg/cel/library/urls.go): ``url``, ``isURL`` and the
getters, with the URL checked the way Go's ``net/url.ParseRequestURI`` checks it (an absolute URI or an
absolute path; a port must be digits; no control characters) and split the way ``url.Parse`` splits it."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote_plus

from dradriver.cel.errors import CelEvaluationError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_HOST_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:%\[\]]*\Z")
# what Go's EscapedPath leaves unescaped in a path
_PATH_SAFE = "/;,@&=+$!*'()-._~:"


class URLValue:
    """A ``kubernetes.URL`` value."""

    __slots__ = ("host", "path", "query", "scheme")

    def __init__(self, scheme: str, host: str, path: str, query: str) -> None:
        self.scheme, self.host, self.path, self.query = scheme, host, path, query

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URLValue) and (self.scheme, self.host, self.path, self.query) == (
            other.scheme,
            other.host,
            other.path,
            other.query,
        )

    def __hash__(self) -> int:
        return hash(("url", self.scheme, self.host, self.path, self.query))


def _fail(text: str, why: str) -> CelEvaluationError:
    return CelEvaluationError(f"URL parse error during conversion from string: parse {text!r}: {why}")


def _check_host(text: str, host: str) -> None:
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            raise _fail(text, "missing ']' in host")
        port = host[end + 1 :]
        if port and not re.fullmatch(r":[0-9]*", port):
            raise _fail(text, f"invalid port {port!r} after host")
        return
    colon = host.rfind(":")
    if colon >= 0 and not re.fullmatch(r"[0-9]*", host[colon + 1 :]):
        raise _fail(text, f"invalid port {host[colon:]!r} after host")
    if not _HOST_CHARS.match(host):
        raise _fail(text, "invalid character in host name")


def parse_url(text: str) -> URLValue:
    """``url(text)``: ParseRequestURI's checks, then url.Parse's split (the fragment dropped)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise _fail(text, "net/url: invalid control character in URL")
    if not text:
        raise _fail(text, "empty url")
    scheme_match = _SCHEME.match(text)
    if text.startswith(":"):
        raise _fail(text, "missing protocol scheme")
    scheme = scheme_match.group(0)[:-1].lower() if scheme_match else ""
    rest = text[scheme_match.end() :] if scheme_match else text
    if not rest.startswith("/"):
        if not scheme:
            raise _fail(text, "invalid URI for request")
        return URLValue(scheme, "", "", "")  # an opaque URI such as mailto:x
    rest = rest.split("#", 1)[0]
    rest, _, query = rest.partition("?")
    host = ""
    if scheme and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        host = authority.rpartition("@")[2]
        _check_host(text, host)
    if _ESCAPE.search(rest):
        raise _fail(text, "invalid URL escape")
    return URLValue(scheme, host, unquote_plus(rest.replace("+", "%2B")), query)


def is_url(text: str) -> bool:
    try:
        parse_url(text)
    except CelEvaluationError:
        return False
    return True


def _hostname(url: URLValue) -> str:
    host = url.host
    if host.startswith("["):
        return host[1 : host.find("]")]
    colon = host.rfind(":")
    return host[:colon] if colon >= 0 else host


def _port(url: URLValue) -> str:
    host = url.host
    colon = host.rfind(":")
    if colon < 0 or (host.startswith("[") and colon < host.find("]")):
        return ""
    return host[colon + 1 :]


def _query(url: URLValue) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for pair in url.query.split("&"):
        if not pair or ";" in pair:
            continue
        key, _, value = pair.partition("=")
        try:
            result.setdefault(unquote_plus(key, errors="strict"), []).append(unquote_plus(value, errors="strict"))
        except UnicodeDecodeError:
            continue
    return result


_U, _S = "URL", "string"
URL_FUNCTIONS: dict[str, tuple[tuple[bool, tuple[Any, ...], Any, Any], ...]] = {
    "url": ((False, (_S,), _U, parse_url),),
    "isURL": ((False, (_S,), "bool", is_url),),
    "getScheme": ((True, (_U,), _S, lambda u: u.scheme),),
    "getHost": ((True, (_U,), _S, lambda u: u.host),),
    "getHostname": ((True, (_U,), _S, _hostname),),
    "getPort": ((True, (_U,), _S, _port),),
    "getEscapedPath": ((True, (_U,), _S, lambda u: quote(u.path, safe=_PATH_SAFE)),),
    "getQuery": ((True, (_U,), ("map", _S, ("list", _S)), _query),),
}
