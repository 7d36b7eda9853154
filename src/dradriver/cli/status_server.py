"""The ``--metrics-address`` endpoint: Prometheus metrics on /metrics, kube-apiserver's three probes: /livez
(restart me if this fails), /readyz (send me work) and /healthz (every check together, for people and monitors),
and JSON documents for tools (/allocations: which pod holds which device, read by ``dradriver top``)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dradriver.errors import ConfigError

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, dict[str, Any]]]


class StatusServer:
    """Serves metrics and the probes until ``stop``; each check says yes or no and why (a JSON object)."""

    def __init__(
        self,
        address: str,
        readiness: Readiness,
        liveness: Readiness | None = None,
        health: Readiness | None = None,
        documents: Mapping[str, Callable[[], Any]] | None = None,
    ) -> None:
        """``liveness`` (default: always alive) decides /livez, ``readiness`` /readyz and ``health`` (default:
        ``liveness``) /healthz; a check that says no gets 503 with its reasons. ``documents`` are further paths
        answered with the JSON their function returns (``/allocations`` for ``dradriver top``)."""
        host, port_number = parse_address("--metrics-address", address)
        self.readiness = readiness
        self.liveness = liveness
        self.health = health
        self.documents: dict[str, Callable[[], Any]] = dict(documents or {})
        try:
            self._server = _listen(host, port_number, _handler_for(self), wildcard=not address.rpartition(":")[0])
        except OSError as err:
            raise _unbindable("--metrics-address", address, err) from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving metrics and readiness port=%d", self.port)

    def stop(self) -> None:
        """Stop serving (if started) and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler_for(status: StatusServer) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``status`` (the HTTP server makes one handler per request)."""

    class Handler(_Handler):
        server_of = status

    return Handler


class _Handler(BaseHTTPRequestHandler):
    """One request to a :class:`StatusServer`: ``server_of`` is set by :func:`_handler_for`."""

    server_of: StatusServer

    def do_GET(self) -> None:
        status = self.server_of
        path = urlsplit(self.path).path  # a query (?verbose, as kube-apiserver's probes take) is ignored
        if path == "/metrics":
            self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
        elif path == "/livez":
            self._probe("alive", "liveness", status.liveness)
        elif path == "/healthz":
            self._probe("healthy", "health" if status.health else "liveness", status.health or status.liveness)
        elif path == "/readyz":
            ready, detail = self._run_check("ready", "readiness", status.readiness)
            body = json.dumps({"ready": ready, **detail}, default=str).encode() + b"\n"
            self._reply(200 if ready else 503, body, "application/json")
        elif path in status.documents:
            self._document(path, status.documents[path])
        else:
            paths = ", ".join(["/metrics", "/livez", "/readyz", "/healthz", *status.documents])
            self._reply(404, f"not found: try {paths}\n".encode(), "text/plain")

    def _document(self, path: str, build: Callable[[], Any]) -> None:
        try:
            body = json.dumps(build(), default=str).encode() + b"\n"
        except Exception as err:
            log.exception("building %s failed; answering 500", path)
            body = json.dumps({"error": f"{type(err).__name__}: {err}"}).encode() + b"\n"
            self._reply(500, body, "application/json")
            return
        self._reply(200, body, "application/json")

    def _probe(self, what: str, name: str, check: Readiness | None) -> None:
        good, detail = self._run_check(what, name, check) if check is not None else (True, {})
        if good:
            self._reply(200, b"ok\n", "text/plain")
        else:
            body = json.dumps({what: False, **detail}, default=str).encode() + b"\n"
            self._reply(503, body, "application/json")

    def _run_check(self, what: str, name: str, check: Readiness) -> tuple[bool, dict[str, Any]]:
        """A check that raises says no (503 naming it) rather than dropping the connection unanswered."""
        try:
            return check()
        except Exception as err:
            log.exception("the %s check for %s raised; answering 503", name, self.path)
            return False, {"failedCheck": name, "error": f"{type(err).__name__}: {err}"}

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("status request %s", format % args)


class _Ipv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _DualStackServer(_Ipv6Server):
    """Listens on every IPv6 and IPv4 address: a pod's IP (which probes call) may be of either family."""

    def server_bind(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _listen(host: str, port: int, handler: type[BaseHTTPRequestHandler], *, wildcard: bool) -> ThreadingHTTPServer:
    """The HTTP server for ``host``: of its address family, or dual-stack for ``:PORT`` where the host has IPv6."""
    if wildcard and socket.has_dualstack_ipv6():
        return _DualStackServer(("::", port), handler)
    if socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0] == socket.AF_INET6:
        return _Ipv6Server((host, port), handler)
    return ThreadingHTTPServer((host, port), handler)


def parse_address(flag: str, address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (all interfaces); an IPv6 host in brackets."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {address!r} is not HOST:PORT or :PORT with a port from 0 to 65535 (e.g. :8080)")
    return host.removeprefix("[").removesuffix("]") or "0.0.0.0", int(port)


def check_bindable(flag: str, address: str) -> None:
    """Refuse an address the status server could not listen on (a port in use, a host not of this machine)."""
    host, port = parse_address(flag, address)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
            probe.bind((host, port))
    except OSError as err:
        raise _unbindable(flag, address, err) from None


def _unbindable(flag: str, address: str, err: OSError) -> ConfigError:
    reason = err.strerror or str(err)
    return ConfigError(
        f"{flag} {address!r}: cannot listen there ({reason}); choose a free port or an address of this host"
    )
