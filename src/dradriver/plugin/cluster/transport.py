"""HTTPS to the API server over urllib3: the cluster adapters' one transport.

The adapters send raw JSON and read raw JSON (never the client's models), so what they need is a connection:
urllib3 (the ``kubernetes`` client's own HTTP library) does TLS with the server's CA, client certificates, a
server name override and ``insecure-skip-tls-verify``, the CONNECT tunnel through an HTTP proxy, a pool of
kept-alive connections (``TCP_NODELAY`` set, as Go's client sets it) and streaming answers for watches. What is
ours is policy: where the settings come from, which proxy to use (a kubeconfig's ``proxy-url``, else the one the
environment names by Go's rules, ``no_proxy`` included, which urllib3 does not have), a bearer token read fresh
(the in-cluster service account's rotates), and Go's rule for sending a request again when the server dropped the
connection it went out on.

Settings come from the pod's service account (:func:`in_cluster`, the files and variables client-go's
``rest.InClusterConfig`` reads) or from a ``kubernetes`` client ``Configuration`` a kubeconfig loader filled in
(:func:`from_client_configuration`), so a kubeconfig means what it means to the client: exec plugins, auth
providers, merged files.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import platform
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import quote, unquote, urlsplit

import urllib3
from urllib3.exceptions import HTTPError, InsecureRequestWarning, ProtocolError
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from dradriver import __version__
from dradriver.errors import ConfigError

# Where a pod's service account is mounted, and the variables the kubelet sets for the API server's service.
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# client-go re-reads a file-backed token at most once a minute; a projected token is renewed well before expiry.
TOKEN_REREAD_SECONDS = 60.0
USER_AGENT = f"dradriver/{__version__} (linux/{platform.machine() or 'unknown'}) python-urllib3"
# Sent again after the server dropped the connection they went out on, whether or not it had read them (Go's
# isReplayable).
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
# Connections kept alive: the kubelet sends the plugin up to KubeletPluginOptions.max_workers (16) prepares and
# unprepares at once, each a claim GET and a status write, while the publisher writes slices; a connection that
# comes back to a full pool is closed (urllib3 warns "Connection pool is full"), and the next costs a TLS handshake.
# A watch's connection never comes back to the pool.
DEFAULT_POOL_SIZE = 20
# (connect, read) seconds; a watch asks for a longer read timeout.
Timeout = tuple[float, float]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# A URL's user and password (``scheme://user:password@``, or ``user:password@`` with no scheme), up to the last
# ``@`` before the path: what a message or a log must not show.
_CREDENTIALS = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")


class TransportError(OSError):
    """The API server could not be reached, or answered no HTTP: the message says what happened underneath."""


class FileToken:
    """The ``Authorization`` value from a token file, read again once it is older than ``reread`` seconds (a
    projected service account token rotates). A failed re-read keeps the last token and tries again next time."""

    def __init__(self, path: str, *, reread: float = TOKEN_REREAD_SECONDS) -> None:
        self._path = path
        self._reread = reread
        self._lock = threading.Lock()
        self._token = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        with open(self._path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ConfigError(f"the service account token file {self._path} is empty")
        return token

    def __call__(self) -> str:
        with self._lock:
            if time.monotonic() - self._read_at >= self._reread:
                # The mounted token is replaced atomically; a miss now is retried at the next re-read.
                with contextlib.suppress(OSError, ConfigError):
                    self._token = self._read()
                self._read_at = time.monotonic()
            return f"Bearer {self._token}"


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to reach it. The TLS files are read at each new connection (by urllib3),
    so a rotated CA or client certificate is picked up without a restart."""

    url: str  # scheme://host[:port][/prefix]
    authorization: Callable[[], str | None] = lambda: None
    ca_file: str | None = None
    ca_data: str | None = None  # PEM text, as a kubeconfig's certificate-authority-data decodes to
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    check_hostname: bool = True
    server_name: str | None = None  # the TLS server name to send and check instead of the URL's host
    # http://[user:password@]host:port; neither it nor its headers (Proxy-Authorization) in a repr, which may be logged
    proxy: str | None = field(default=None, repr=False)
    proxy_headers: Mapping[str, str] = field(default_factory=dict, repr=False)


def in_cluster() -> Endpoint:
    """The pod's service account, as client-go's ``rest.InClusterConfig`` reads it."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError(
            "cannot load the in-cluster configuration: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must "
            "be set (the kubelet sets them in every pod); outside a pod pass --kubeconfig"
        )
    for path, what in ((SERVICE_ACCOUNT_TOKEN, "token"), (SERVICE_ACCOUNT_CA, "CA certificate")):
        if not os.path.isfile(path):
            raise ConfigError(
                f"cannot load the in-cluster configuration: the service account {what} {path} is missing; give "
                "the pod a service account with automountServiceAccountToken left on"
            )
    address = f"[{host}]" if ":" in host else host  # an IPv6 service address
    url = f"https://{address}:{port}"
    return Endpoint(url, FileToken(SERVICE_ACCOUNT_TOKEN), ca_file=SERVICE_ACCOUNT_CA, proxy=_environment_proxy(url))


def _without_credentials(url: str) -> str:
    """``url`` without its user and password: how a message or a log quotes a proxy URL."""
    return _CREDENTIALS.sub(r"\1", url, count=1)


def _usable_proxy(proxy: str, source: str, fix: str) -> str:
    """``proxy`` if it is an http://host[:port] URL; else a ConfigError naming ``source`` and ``fix`` (and the
    proxy without its user and password)."""
    try:
        usable = urlsplit(proxy).scheme == "http" and bool(urlsplit(proxy).hostname)
    except ValueError:  # a bracket left open
        usable = False
    if not usable:
        raise ConfigError(
            f"{source} {_without_credentials(proxy)} is not an http://host:port proxy; dradriver reaches the API "
            f"server through an HTTP CONNECT proxy only ({fix})"
        )
    return proxy


def from_client_configuration(configuration: Any, *, proxy_url: str | None = None) -> Endpoint:
    """The settings a ``kubernetes.client.Configuration`` holds (filled in by the client's kubeconfig loader).

    ``proxy_url``, the kubeconfig cluster's ``proxy-url``, carries every request, as client-go's ``http.ProxyURL``
    (no ``no_proxy``, a loopback server too); without one the environment's proxy by Go's rules
    (:func:`_environment_proxy`), as client-go. The ``Configuration``'s own proxy is not used: without a
    ``proxy-url`` the client took it from the environment by Python's rules (``ALL_PROXY``, lower case first)."""
    proxy: str | None
    if proxy_url:
        proxy = _usable_proxy(proxy_url, "the kubeconfig's proxy-url", "set the cluster's to one, or remove it")
    else:
        proxy = _environment_proxy(configuration.host)

    def authorization() -> str | None:
        # auth_settings() runs the loader's refresh hook (exec plugins, auth providers) before it answers.
        setting = configuration.auth_settings().get("BearerToken")
        return str(setting["value"]) if setting and setting.get("value") else None

    ca_data = configuration.ca_cert_data
    assert_hostname = configuration.assert_hostname
    return Endpoint(
        configuration.host,
        authorization,
        ca_file=configuration.ssl_ca_cert or None,
        ca_data=ca_data.decode() if isinstance(ca_data, bytes) else ca_data or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        verify=bool(configuration.verify_ssl),
        check_hostname=assert_hostname is not False,
        server_name=configuration.tls_server_name or (assert_hostname if isinstance(assert_hostname, str) else None),
        proxy=proxy,
        proxy_headers=dict(configuration.proxy_headers or {}),
    )


def _bypasses_proxy(url: str, no_proxy: str) -> bool:
    """Whether ``url`` goes around the proxy, as Go's ``httpproxy`` (client-go's) decides: ``localhost`` and
    loopback addresses always; else when a ``no_proxy`` entry matches (:func:`_no_proxy_matches`)."""
    host, port = _canonical_address(url)
    address = _ip_address(host)
    if host == "localhost" or (address is not None and address.is_loopback):
        return True
    return any(_no_proxy_matches(entry, host, port, address) for entry in no_proxy.split(","))


def _canonical_address(url: str) -> tuple[str, str]:
    """``url``'s host (lower case, IDNA, no brackets) and port, the scheme's default port where it names none
    (Go's ``canonicalAddr``)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host.isascii():
        with contextlib.suppress(UnicodeError):
            host = host.encode("idna").decode("ascii")
    try:
        port = str(parts.port or "")
    except ValueError:  # not a number: the Transport refuses the URL
        port = ""
    return host, port or {"http": "80", "https": "443"}.get(parts.scheme, "")


def _ip_address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _no_proxy_matches(entry: str, host: str, port: str, address: IPAddress | None) -> bool:
    """Whether one ``no_proxy`` entry exempts ``host``:``port`` (``address``: the host as an IP address), read and
    matched as Go's ``httpproxy`` does: ``*`` matches all; an IP network (CIDR) the addresses in it; an IP address
    (``[IPv6]:port`` with a port) that address; a domain (with a port or not) ``example.com`` that host and its
    subdomains, ``.example.com`` and ``*.example.com`` its subdomains only. An entry with a port matches that
    port only."""
    entry = entry.strip().lower()
    if entry == "*":
        return True
    if "/" in entry:
        with contextlib.suppress(ValueError):
            return address is not None and address in ipaddress.ip_network(entry, strict=False)
    entry_host, entry_port = _split_host_port(entry) or (entry, "")
    if entry_host.startswith("[") and entry_host.endswith("]"):
        entry_host = entry_host[1:-1]
    entry_address = _ip_address(entry_host)
    if entry_address is not None:
        return entry_address == address and entry_port in ("", port)
    if not entry_host:
        return False  # malformed (":443", or nothing)
    if entry_host.startswith("*."):
        entry_host = entry_host[1:]
    match_host = not entry_host.startswith(".")  # the domain itself as well as its subdomains
    suffix = "." + entry_host if match_host else entry_host
    return (host.endswith(suffix) or (match_host and host == suffix[1:])) and entry_port in ("", port)


def _split_host_port(text: str) -> tuple[str, str] | None:
    """``host:port`` or ``[host]:port`` as (host, port), as Go's ``net.SplitHostPort`` splits it; None where
    ``text`` is not of that form (no port, too many colons, a stray bracket)."""
    bracketed = text.startswith("[")
    if bracketed:
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        host, port = text[1:end], text[end + 2 :]
    else:
        host, colon, port = text.rpartition(":")
        if not colon:
            return None
    if ":" in port or (not bracketed and ":" in host) or any(bracket in host + port for bracket in "[]"):
        return None
    return host, port


def _environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url``, as Go's ``http.ProxyFromEnvironment`` (client-go's, in a pod
    and for a kubeconfig without ``proxy-url``) chooses it: ``HTTPS_PROXY`` for an https URL, ``HTTP_PROXY`` for
    http, upper case first, ``ALL_PROXY`` never; None where none is set or ``NO_PROXY`` or loopback exempts
    ``url``. A bare ``host[:port]`` is an http:// proxy (Go's ``parseProxy``); a proxy that is not http:// is
    refused, naming its variable."""
    name, proxy = _variable(f"{urlsplit(url).scheme}_proxy")
    if not proxy or _bypasses_proxy(url, _variable("no_proxy")[1]):
        return None
    # Go prepends http:// to any value whose scheme is not http, https or socks5; a URL of another scheme
    # (ftp://…) stays as it is here, to be refused by name rather than dialled as the host "ftp".
    proxy = proxy if "://" in proxy else f"http://{proxy}"
    return _usable_proxy(proxy, f"the environment's {name}", "or none: list the API server in no_proxy")


def _variable(name: str) -> tuple[str, str]:
    """The environment variable ``name`` in upper case, else in lower case (Go's order: the first that is not
    empty): its name and value, "" where neither is set."""
    for spelling in (name.upper(), name.lower()):
        if os.environ.get(spelling):
            return spelling, os.environ[spelling]
    return name.upper(), ""


class _DroppedConnectionRetry(urllib3.Retry):
    """Go's transport's rule (and so client-go's) for a request whose connection the server dropped: a GET, HEAD
    or OPTIONS is sent again on a new connection (``read`` times), any other method never, since a server that
    closed after reading it may have acted on it. Everything else (a refused connection, TLS, the proxy, a
    timeout, any status) is the caller's to retry, as in Go. urllib3 cannot tell a write that failed while being
    sent, which Go would send again; it checks an idle connection before reusing it, which catches most of those."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: Any = None,
    ) -> Self:
        if error is not None and not isinstance(error, ProtocolError):
            raise error  # not a dropped connection: never sent again here
        return super().increment(method, url, response, error, _pool, _stacktrace)


def _retry(times: int) -> _DroppedConnectionRetry:
    """The retry policy of one request: a dropped connection ``times`` times (for the methods it may resend), and
    nothing else: no redirect, no status, no ``Retry-After``, no backoff."""
    return _DroppedConnectionRetry(
        total=None,
        connect=0,
        read=times,
        redirect=0,
        status=0,
        other=0,
        allowed_methods=_REPLAYABLE,
        raise_on_redirect=False,
        raise_on_status=False,
        respect_retry_after_header=False,
    )


def _underneath(error: BaseException) -> BaseException:
    """The error urllib3 wraps (after retries, in a proxy error, in a protocol or TLS error), down to the
    standard library's where there is one."""
    while isinstance(error, HTTPError):
        nested = getattr(error, "reason", None) or getattr(error, "original_error", None) or error.__cause__
        nested = nested or next((a for a in error.args if isinstance(a, BaseException)), None)
        if not isinstance(nested, BaseException):
            break
        error = nested
    return error


def _oserror(error: HTTPError | OSError, timeout: Timeout) -> OSError:
    """The :class:`OSError` the adapters catch for ``error``: a :class:`TimeoutError` naming both limits for a
    timeout, else a :class:`TransportError` with the message of the error underneath."""
    cause = _underneath(error)
    if isinstance(cause, TimeoutError | Urllib3TimeoutError):
        return TimeoutError(f"timed out (connect timeout {timeout[0]:g} s, read timeout {timeout[1]:g} s)")
    if isinstance(cause, OSError) and not isinstance(error, HTTPError):
        return cause
    return TransportError(str(cause) or type(cause).__name__)


def _pool_manager(endpoint: Endpoint, pool_size: int) -> urllib3.PoolManager:
    """urllib3's pool for ``endpoint``: TLS from its settings (urllib3 builds the context and reads the files at
    each new connection), through its proxy if it has one (a CONNECT tunnel for https)."""
    options: dict[str, Any] = {"num_pools": 1, "maxsize": pool_size, "block": False}
    if urlsplit(endpoint.url).scheme == "https":
        if not endpoint.verify:
            # The kubeconfig asked for insecure-skip-tls-verify; as kubectl does, we do not repeat it per request.
            warnings.filterwarnings("ignore", category=InsecureRequestWarning)
        options.update(
            cert_reqs="CERT_REQUIRED" if endpoint.verify else "CERT_NONE",
            ca_certs=endpoint.ca_file,
            ca_cert_data=endpoint.ca_data,
            cert_file=endpoint.cert_file,
            key_file=endpoint.key_file,
            server_hostname=endpoint.server_name,
            assert_hostname=None if endpoint.check_hostname else False,
        )
    if endpoint.proxy:
        return urllib3.ProxyManager(endpoint.proxy, proxy_headers=_proxy_headers(endpoint), **options)
    return urllib3.PoolManager(**options)


def _proxy_headers(endpoint: Endpoint) -> dict[str, str]:
    """The endpoint's proxy headers, with ``Proxy-Authorization`` from the proxy URL's user and password (as Go's
    transport sends them; urllib3 leaves them unsent) unless a header gives one."""
    headers = dict(endpoint.proxy_headers)
    proxy = urlsplit(endpoint.proxy or "")
    if proxy.username is not None and not any(k.lower() == "proxy-authorization" for k in headers):
        user = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        headers.update(urllib3.make_headers(proxy_basic_auth=user))
    return headers


class Response:
    """An answer: ``status``, ``headers``, ``read()`` (the whole body; the connection goes back to the pool), and
    for a stream ``read1()``, with ``shutdown()`` to end a blocked read from another thread and ``close()``.
    Reading raises :class:`OSError`, as sending does."""

    def __init__(self, answer: urllib3.BaseHTTPResponse, timeout: Timeout) -> None:
        self._answer = answer
        self._timeout = timeout
        self.status = answer.status
        self.headers = answer.headers

    def read(self) -> bytes:
        try:
            data = self._answer.read()
        except (HTTPError, OSError) as err:
            raise _oserror(err, self._timeout) from err
        self._answer.release_conn()
        return data

    def read1(self, size: int = 65536) -> bytes:
        try:
            return self._answer.read1(size)
        except (HTTPError, OSError) as err:
            raise _oserror(err, self._timeout) from err

    def shutdown(self) -> None:
        """Shut the socket for reading: a ``read1()`` blocked in another thread returns (urllib3's own
        ``shutdown``). Raises ``RuntimeError`` or ``ValueError`` once the answer has let go of its connection."""
        self._answer.shutdown()

    def close(self) -> None:
        """End the answer; its connection is closed (a half-read stream cannot be reused), its pool slot freed."""
        self._answer.close()
        self._answer.release_conn()


class Transport:
    """Requests to one API server over a pool of kept-alive connections (at most ``pool_size`` kept; more may be
    open at once, the rest closed when done).

    ``retries``: how many times a GET, HEAD or OPTIONS is sent again on a new connection when the server dropped
    the one it went out on (as when its idle timeout raced our request): Go's rule
    (:class:`_DroppedConnectionRetry`). Anything else is the caller's to retry."""

    def __init__(self, endpoint: Endpoint, *, retries: int = 1, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        self.endpoint = endpoint
        self.retries = retries
        parts = urlsplit(endpoint.url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("https", "http") or not parts.hostname or port == -1:
            raise ConfigError(
                f"the API server address {endpoint.url!r} is not an https://host[:port] (or http://) URL: check "
                "the kubeconfig's server, or KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT in a pod"
            )
        self._origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self._prefix = parts.path.rstrip("/")
        self._manager = _pool_manager(endpoint, pool_size)

    def url(self, path: str, query: list[tuple[str, str]] | None = None) -> str:
        """The request target: the endpoint's path prefix, ``path`` and the query, values percent-encoded (in the
        path only what may not stand there: callers quote names, and their escapes are kept)."""
        target = quote(self._prefix + path, safe="/%:@!$&'()*+,;=~")
        if query:
            target += "?" + "&".join(f"{key}={quote(str(value))}" for key, value in query)
        return target

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: Timeout = (5.0, 30.0),
    ) -> Response:
        """Send one request and return the answer once its status line and headers arrived (the body is read
        through the :class:`Response`). Raises ``OSError`` (:class:`TransportError`, ``TimeoutError``) when the
        server cannot be reached, the TLS handshake or the proxy fails, or the server answers no HTTP."""
        send_headers = {"User-Agent": USER_AGENT, **(headers or {})}
        authorization = self.endpoint.authorization()
        if authorization:
            send_headers["Authorization"] = authorization
        try:
            answer = self._manager.urlopen(
                method,
                self._origin + self.url(path, query),
                body=body,
                headers=send_headers,
                retries=_retry(self.retries),
                redirect=False,
                preload_content=False,
                timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            )
        except (HTTPError, OSError) as err:
            raise _oserror(err, timeout) from err
        return Response(answer, timeout)

    def close(self) -> None:
        """Close the idle connections; answers still being read close theirs when done."""
        self._manager.clear()
