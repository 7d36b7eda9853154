"""A small JSON client for a real kube-apiserver (TLS, client certificate): what the cluster tests need, no more.

Kept apart from the driver's own client on purpose: the tests judge what the driver wrote through a path it
does not share.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3

T = TypeVar("T")
# How long a request answered 429 (Too Many Requests) is asked again before the 429 is the answer.
TOO_MANY_REQUESTS_SECONDS = 30.0

# plural -> (API path prefix, namespaced)
RESOURCES: dict[str, tuple[str, bool]] = {
    "nodes": ("/api/v1", False),
    "namespaces": ("/api/v1", False),
    "pods": ("/api/v1", True),
    "serviceaccounts": ("/api/v1", True),
    "events": ("/api/v1", True),
    "resourcequotas": ("/api/v1", True),
    "leases": ("/apis/coordination.k8s.io/v1", True),
    "resourceslices": ("/apis/resource.k8s.io/v1", False),
    "deviceclasses": ("/apis/resource.k8s.io/v1", False),
    "devicetaintrules": ("/apis/resource.k8s.io/v1", False),
    "resourceclaims": ("/apis/resource.k8s.io/v1", True),
    "resourceclaimtemplates": ("/apis/resource.k8s.io/v1", True),
    "daemonsets": ("/apis/apps/v1", True),
    "computedomains": ("/apis/resource.dradriver.dev/v1beta1", True),
    "computedomaincliques": ("/apis/resource.dradriver.dev/v1beta1", True),
}


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any] | str) -> None:
        self.status = status
        self.body = body
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class Credentials:
    """A client certificate (``cert_file``/``key_file``) or a bearer ``token``."""

    server: str
    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None


class Kube:
    """GET/LIST/CREATE/PATCH/DELETE of JSON objects, plus ``wait`` on a condition."""

    def __init__(self, creds: Credentials) -> None:
        self.server = creds.server
        self._auth = {"Authorization": f"Bearer {creds.token}"} if creds.token else {}
        self._http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(creds.ca_file),
            cert_file=str(creds.cert_file) if creds.cert_file else None,
            key_file=str(creds.key_file) if creds.key_file else None,
            timeout=urllib3.Timeout(connect=5.0, read=30.0),
            retries=False,
            maxsize=4,
        )

    def path(self, plural: str, name: str = "", namespace: str = "", sub: str = "") -> str:
        prefix, namespaced = RESOURCES[plural]
        parts = [prefix]
        if namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(plural)
        if name:
            parts.append(name)
        if sub:
            parts.append(sub)
        return "/".join(parts)

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json", **query: str
    ) -> Any:
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Content-Type": content_type, **self._auth}
        # 429 is "not now", as while a resource's storage (re)initializes after its CRD was created or changed: the
        # request was not served, so it is asked again for a while, as client-go does.
        deadline = time.monotonic() + TOO_MANY_REQUESTS_SECONDS
        response = self._http.request(method, url, body=data, headers=headers)
        while response.status == 429 and time.monotonic() < deadline:
            time.sleep(0.5)
            response = self._http.request(method, url, body=data, headers=headers)
        text = response.data.decode()
        if response.status >= 300:
            try:
                raise ApiError(response.status, json.loads(text))
            except json.JSONDecodeError:
                raise ApiError(response.status, text) from None
        return json.loads(text) if text else None

    def healthy(self, path: str = "/readyz") -> bool:
        """Whether ``path`` (a plain-text health endpoint) answers 200."""
        try:
            return bool(self._http.request("GET", self.server + path).status == 200)
        except urllib3.exceptions.HTTPError:
            return False

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", self.path(plural, name, namespace))
        return result

    def find(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        try:
            return self.get(plural, name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, plural: str, namespace: str = "", **query: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.request("GET", self.path(plural, namespace=namespace), **query)["items"]
        return items

    def create(self, plural: str, obj: dict[str, Any], namespace: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", self.path(plural, namespace=namespace), obj)
        return result

    def update(self, plural: str, obj: dict[str, Any], sub: str = "") -> dict[str, Any]:
        meta = obj["metadata"]
        path = self.path(plural, meta["name"], meta.get("namespace", ""), sub)
        result: dict[str, Any] = self.request("PUT", path, obj)
        return result

    def patch(
        self, plural: str, name: str, patch: dict[str, Any], namespace: str = "", sub: str = ""
    ) -> dict[str, Any]:
        path = self.path(plural, name, namespace, sub)
        result: dict[str, Any] = self.request("PATCH", path, patch, content_type="application/merge-patch+json")
        return result

    def delete(self, plural: str, name: str, namespace: str = "", **query: str) -> None:
        try:
            self.request("DELETE", self.path(plural, name, namespace), **query)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def delete_all(self, plural: str, namespace: str = "", **query: str) -> None:
        self.request("DELETE", self.path(plural, namespace=namespace), **query)

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
        """The first truthy value of ``probe`` within ``timeout`` (every 100 ms: a REST poll, as kubectl wait)."""
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            pause.wait(0.1)
