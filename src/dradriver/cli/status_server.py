"""The ``--metrics-address`` endpoint: Prometheus metrics on /metrics, readiness on /readyz, liveness on /healthz."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, dict[str, Any]]]


class StatusServer:
    """Serves metrics and readiness until ``stop``; ``readiness`` says whether the driver is ready and why."""

    def __init__(self, address: str, readiness: Readiness) -> None:
        host, _, port = address.rpartition(":")
        try:
            port_number = int(port)
        except ValueError:
            from dradriver.errors import ConfigError

            raise ConfigError(f"--metrics-address {address!r} is not HOST:PORT or :PORT (e.g. :8080)") from None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    self._reply(200, b"ok\n", "text/plain")
                elif self.path == "/readyz":
                    ready, detail = outer.readiness()
                    body = json.dumps({"ready": ready, **detail}, default=str).encode() + b"\n"
                    self._reply(200 if ready else 503, body, "application/json")
                else:
                    self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("status request %s", format % args)

        self.readiness = readiness
        try:
            self._server = ThreadingHTTPServer((host or "0.0.0.0", port_number), Handler)
        except OSError as err:
            from dradriver.errors import ConfigError

            raise ConfigError(
                f"cannot serve metrics and probes on {address!r}: {err.strerror or err}; choose another "
                "--metrics-address (DRADRIVER_METRICS_ADDRESS), or an empty one to turn it off"
            ) from err
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving metrics and readiness port=%d", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
