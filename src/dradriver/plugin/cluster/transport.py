"""HTTPS to the API server over the standard library's ``http.client``: the cluster adapters' one transport.

The adapters send raw JSON and read raw JSON (never the client's models), so of the ``kubernetes`` client they
needed only its connection settings and REST layer; that layer brings urllib3 (whose HTTP/2 probe imports
``importlib.metadata``) and the client's ``Configuration`` with its own imports: about 5 MiB of every node
driver's memory (docs/reliability.md). Here the same job in one module: TLS with the server's CA, client
certificates, a server name override and ``insecure-skip-tls-verify``; a bearer token read fresh (the in-cluster
service account's rotates); an HTTP proxy through CONNECT with ``no_proxy``; a small pool of kept-alive
connections; and streaming answers for watches.

Settings come from the pod's service account (:func:`in_cluster`, the files and variables client-go's
``rest.InClusterConfig`` reads) or from a ``kubernetes`` client ``Configuration`` a kubeconfig loader filled in
(:func:`from_client_configuration`), so a kubeconfig means what it means to the client: exec plugins, auth
providers, merged files.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import os
import platform
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from dradriver import __version__
from dradriver.errors import ConfigError

# Where a pod's service account is mounted, and the variables the kubelet sets for the API server's service.
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# client-go re-reads a file-backed token at most once a minute; a projected token is renewed well before expiry.
TOKEN_REREAD_SECONDS = 60.0
USER_AGENT = f"dradriver/{__version__} (linux/{platform.machine() or 'unknown'}) python-http.client"
# Sent again after the server closed a reused connection, whether or not it had read them (Go's isReplayable).
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
# (connect, read) seconds; a watch asks for a longer read timeout.
Timeout = tuple[float, float]


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
    """Where the API server is and how to reach it."""

    url: str  # scheme://host[:port][/prefix]
    authorization: Callable[[], str | None] = lambda: None
    ca_file: str | None = None
    ca_data: str | None = None  # PEM text, as a kubeconfig's certificate-authority-data decodes to
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    check_hostname: bool = True
    server_name: str | None = None  # the TLS server name to send and check instead of the URL's host
    proxy: str | None = None  # http://host:port
    proxy_headers: Mapping[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif not self.check_hostname:
            context.check_hostname = False
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


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
    proxy, no_proxy = _environment_proxy(url)
    return Endpoint(
        url,
        FileToken(SERVICE_ACCOUNT_TOKEN),
        ca_file=SERVICE_ACCOUNT_CA,
        proxy=_checked_proxy(proxy, url, no_proxy, "the environment's https_proxy"),
    )


def _checked_proxy(proxy: str | None, url: str, no_proxy: str, source: str) -> str | None:
    """``proxy`` unless ``no_proxy`` exempts ``url``; a proxy that is not http:// is refused, naming ``source``."""
    if not proxy or _bypasses_proxy(url, no_proxy):
        return None
    if urlsplit(proxy).scheme != "http" or not urlsplit(proxy).hostname:
        raise ConfigError(
            f"{source} {proxy} is not an http://host:port proxy; dradriver reaches the API server through an HTTP "
            "CONNECT proxy only (or none: list the API server in no_proxy)"
        )
    return proxy


def from_client_configuration(configuration: Any) -> Endpoint:
    """The settings a ``kubernetes.client.Configuration`` holds (filled in by the client's kubeconfig loader)."""
    # The client's Configuration holds the kubeconfig's proxy-url, or else the environment's proxy variables.
    proxy = _checked_proxy(configuration.proxy, configuration.host, configuration.no_proxy or "", "the proxy")

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
    loopback addresses always; else a ``no_proxy`` entry that is ``*``, an IP network holding its address, its
    host or ``host:port``, or a domain its host is in (``example.com``, ``.example.com``, ``*.example.com``)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host == "localhost" or (address is not None and address.is_loopback):
        return True
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*" or entry == parts.netloc.lower():
            return True
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(entry.strip("[]"), strict=False):
                    return True
        domain = entry.removeprefix("*").lstrip(".")
        if host == domain or host.endswith("." + domain):
            return True
    return False


def _environment_proxy(url: str) -> tuple[str | None, str]:
    """The proxy the environment names for ``url`` (``https_proxy``/``HTTPS_PROXY``, for http ``http_proxy``)
    and the ``no_proxy`` list, as client-go's ``ProxyFromEnvironment`` reads them."""
    scheme = urlsplit(url).scheme

    def variable(name: str) -> str:
        return os.environ.get(name.upper()) or os.environ.get(name.lower()) or ""  # Go's order

    return variable(f"{scheme}_proxy") or None, variable("no_proxy")


class _Connection(http.client.HTTPSConnection):
    """One kept-alive connection: TLS with the endpoint's server name, the read timeout set after connecting
    (``timeout`` is the connect timeout)."""

    def __init__(self, host: str, port: int | None, *, context: ssl.SSLContext | None, server_name: str | None):
        # A plain-HTTP connection gets a bare context it never uses (the default one would load the system CAs).
        super().__init__(host, port, context=context or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        self.tls = context is not None
        self.server_name = server_name
        self.read_timeout: float | None = None

    def _tunnel(self) -> None:
        # Python 3.11 writes "CONNECT fd00::1:443"; the authority form needs brackets around an IPv6 address
        # (3.12 adds them itself, and leaves an address already in brackets as it is).
        host: str = self._tunnel_host  # type: ignore[has-type]
        if ":" in host and not host.startswith("["):
            self._tunnel_host = f"[{host}]"
            try:
                super()._tunnel()  # type: ignore[misc]
            finally:
                self._tunnel_host = host
        else:
            super()._tunnel()  # type: ignore[misc]

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and through a proxy the CONNECT tunnel
        if self.tls:
            name = self.server_name or self._tunnel_host or self.host
            self.sock = self._context.wrap_socket(self.sock, server_hostname=name)  # type: ignore[attr-defined]
        self.sock.settimeout(self.read_timeout)


class Response:
    """An answer: ``status``, ``read()`` (the whole body; the connection goes back to the pool), and for a
    stream ``read1()``, with ``shutdown()`` to end a blocked read from another thread and ``close()``."""

    def __init__(
        self, transport: Transport, connection: _Connection, answer: http.client.HTTPResponse, sock: socket.socket
    ) -> None:
        self._transport = transport
        self._connection = connection
        self._answer = answer
        self._sock = sock  # the connection forgets it when the answer says "close"; shutdown() needs it
        self.status = answer.status
        self.headers = answer.headers

    def read(self) -> bytes:
        try:
            data = self._answer.read()
        except BaseException:
            self._connection.close()
            raise
        if self._answer.will_close:
            self._connection.close()
        else:
            self._transport._give_back(self._connection)
        return data

    def read1(self, size: int = 65536) -> bytes:
        return self._answer.read1(size)

    def shutdown(self) -> None:
        # The plain socket's shutdown: SSLSocket.shutdown would also drop its TLS object under a reader.
        socket.socket.shutdown(self._sock, socket.SHUT_RD)

    def close(self) -> None:
        """End the answer; its connection never goes back to the pool (a half-read stream cannot be reused)."""
        self._answer.close()
        self._connection.close()


class Transport:
    """Requests to one API server over a pool of kept-alive connections (at most ``pool_size`` idle).

    ``retries``: how many times a request is sent again on a new connection when the *reused* one it went out
    on turns out closed by the server (its idle timeout raced our request), with Go's transport's rule (and so
    client-go's): a GET, HEAD or OPTIONS always, any other method only if sending it failed, since a server that
    closed after reading it may have acted on it. Anything else is the caller's to retry."""

    def __init__(self, endpoint: Endpoint, *, retries: int = 1, pool_size: int = 4) -> None:
        self.endpoint = endpoint
        self.retries = retries
        self._pool_size = pool_size
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
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._closed = False

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
        """Send one request and return the answer once its status line and headers arrived. Raises ``OSError``
        (``ssl.SSLError`` included) or ``http.client.HTTPException`` when the server cannot be reached or answers
        no HTTP."""
        target = self.url(path, query)
        send_headers = {"User-Agent": USER_AGENT, **(headers or {})}
        authorization = self.endpoint.authorization()
        if authorization:
            send_headers["Authorization"] = authorization
        if self.endpoint.proxy and not self._tls:
            host = f"[{self._host}]" if ":" in self._host else self._host
            target = f"http://{host}:{self._port}{target}"  # a plain-HTTP proxy takes the absolute form
            send_headers.update(self._proxy_headers())
        attempt = 0
        while True:
            connection, reused = self._take()
            connection.timeout, connection.read_timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout[1])
            sent = False
            try:
                connection.request(method, target, body=body, headers=send_headers)
                sent = True
                sock = connection.sock
                answer = connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
                connection.close()
                if reused and attempt < self.retries and (method in _REPLAYABLE or not sent):
                    attempt += 1
                    continue  # the server closed a kept-alive connection as we reused it
                raise
            except TimeoutError as err:
                connection.close()
                limits = f"connect timeout {timeout[0]:g} s, read timeout {timeout[1]:g} s"
                raise TimeoutError(f"timed out ({limits})") from err
            except BaseException:
                connection.close()
                raise
            return Response(self, connection, answer, sock)

    def close(self) -> None:
        """Close the idle connections; answers still being read close theirs when done."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self) -> tuple[_Connection, bool]:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if not _dropped(connection):
                    return connection, True
                connection.close()
        return self._new_connection(), False

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(connection)
                return
        connection.close()

    def _new_connection(self) -> _Connection:
        if self._tls and self._context is None:
            try:
                self._context = self.endpoint.ssl_context()  # built at the first connection: files read then
            except (OSError, ValueError) as err:
                raise ssl.SSLError(f"cannot set up TLS for {self.endpoint.url}: {err}") from err
        proxy = urlsplit(self.endpoint.proxy) if self.endpoint.proxy else None
        host, port = (proxy.hostname or "", proxy.port or 80) if proxy else (self._host, self._port)
        connection = _Connection(host, port, context=self._context if self._tls else None, server_name=None)
        if self._tls:
            connection.server_name = self.endpoint.server_name
        if proxy and self._tls:
            connection.set_tunnel(self._host, self._port, headers=self._proxy_headers())
        return connection

    def _proxy_headers(self) -> dict[str, str]:
        """The endpoint's proxy headers, with ``Proxy-Authorization`` from the proxy URL's user and password (as
        Go's transport sends them) unless a header gives one."""
        headers = dict(self.endpoint.proxy_headers)
        proxy = urlsplit(self.endpoint.proxy or "")
        if proxy.username is not None and not any(k.lower() == "proxy-authorization" for k in headers):
            user = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
            headers["Proxy-Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        return headers


def _dropped(connection: _Connection) -> bool:
    """Whether an idle connection was closed by the server (readable while idle: EOF or stray bytes). poll, not
    select: select refuses file descriptors from 1024 up."""
    sock = connection.sock
    if sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
