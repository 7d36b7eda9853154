"""The cluster adapters' HTTPS transport (urllib3 with our settings and policy): what it sends, how it holds
connections, when it sends a request again, TLS, the service account and proxies; judged by what a server (a raw
recording one, or the API server stand-in over TLS) and a CONNECT proxy saw."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import select
import socket
import socketserver
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import TOKEN, FakeApiServer
from support.control_plane import write_pki

from dradriver.errors import ConfigError
from dradriver.plugin.cluster import ApiUnavailableError
from dradriver.plugin.cluster import transport as transport_module
from dradriver.plugin.cluster.kube import KubeCluster, client_package, load_configuration, load_transport
from dradriver.plugin.cluster.transport import Endpoint, FileToken, Transport, from_client_configuration, in_cluster
from dradriver.plugin.kubeletplugin.plugin import KubeletPluginOptions


@dataclass
class Seen:
    """What the recording server saw: each request (line, headers, body) and the connections it accepted."""

    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    connections: int = 0


@contextlib.contextmanager
def serving(handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    """``handler`` served on a loopback port by its own threads, for the block; its http:// address."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def recording_server(
    *, answers_per_connection: int = 0, answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
) -> Iterator[tuple[str, Seen]]:
    """An HTTP/1.1 server that answers every request with ``answer`` (a status line and headers) and ``{}`` on
    kept-alive connections and records it; ``answers_per_connection``: after that many answers it reads the next
    request on the connection and closes it unanswered (as a server whose idle timeout raced the request); an
    empty ``answer``: it never answers."""
    seen = Seen()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            seen.connections += 1
            answered = 0
            while True:
                line = self.rfile.readline()
                if not line:
                    return
                headers: dict[str, str] = {}
                while (header := self.rfile.readline().decode()) not in ("\r\n", ""):
                    key, value = header.split(":", 1)
                    headers[key.strip().lower()] = value.strip()
                body = self.rfile.read(int(headers.get("content-length", "0")))
                seen.requests.append((line.decode().strip(), headers, body))
                if answers_per_connection and answered == answers_per_connection:
                    return
                if not answer:
                    continue
                self.wfile.write(answer + b"Content-Length: 2\r\n\r\n{}")
                self.wfile.flush()
                answered += 1

    with serving(Handler) as url:
        yield url, seen


@contextlib.contextmanager
def connect_proxy(*, refuse: bool = False) -> Iterator[tuple[str, list[str]]]:
    """An HTTP CONNECT proxy (RFC 9110 §9.3.6) that records each tunnel's request line (and its
    Proxy-Authorization) and relays its bytes; ``refuse``: it answers 502 instead of connecting."""
    targets: list[str] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            method, target, _ = self.rfile.readline().decode().split()
            credentials = ""
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode().partition(":")
                if key.strip().lower() == "proxy-authorization":
                    credentials = " " + value.strip()
            targets.append(f"{method} {target}{credentials}")
            if refuse:
                self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            host, port = target.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as upstream:
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                ends = [self.connection, upstream]
                while True:
                    readable, _, _ = select.select(ends, [], [], 10)
                    if not readable:
                        return
                    for end in readable:
                        data = end.recv(65536)
                        if not data:
                            return
                        (upstream if end is self.connection else self.connection).sendall(data)

    with serving(Handler) as url:
        yield url, targets


def test_requests_carry_the_token_and_our_agent_and_share_one_kept_alive_connection() -> None:
    with recording_server() as (url, seen):
        transport = Transport(Endpoint(url, lambda: "Bearer t0k3n"))
        for path in ("/version", "/api/v1/nodes/a"):
            response = transport.request("GET", path, query=[("fieldSelector", "spec.nodeName=n 1")])
            assert response.status == 200 and response.read() == b"{}"
        transport.close()
    assert [line for line, _, _ in seen.requests] == [
        "GET /version?fieldSelector=spec.nodeName%3Dn%201 HTTP/1.1",
        "GET /api/v1/nodes/a?fieldSelector=spec.nodeName%3Dn%201 HTTP/1.1",
    ]
    assert all(h["authorization"] == "Bearer t0k3n" and h["user-agent"].startswith("dradriver/") for _, h, _ in
               seen.requests)  # fmt: skip
    assert seen.connections == 1


def test_a_kubeconfig_gives_the_same_request_the_clients_api_client_sends(tmp_path: Path) -> None:
    # Path prefix, percent-encoding, token, content type and body as the kubernetes client would send them.
    with recording_server() as (url, seen):
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": url + "/prefix"}}],
            "users": [{"name": "u", "user": {"token": "abc"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))  # fmt: skip
        body = {"spec": {"a": [1, "é"]}}
        query = [("fieldSelector", "spec.driver=d,spec.nodeName=n"), ("limit", "500")]
        headers = {"Accept": "application/json", "Content-Type": "application/merge-patch+json"}
        ours = load_transport(str(kubeconfig))
        ours.request("PATCH", "/apis/x/v1/namespaces/a b/things/t", query=query, headers=headers,
                     body=json.dumps(body).encode()).read()  # fmt: skip
        theirs = client_package().ApiClient(load_configuration(str(kubeconfig)))
        request = theirs.param_serialize(method="PATCH", resource_path="/apis/x/v1/namespaces/a b/things/t",
                                         query_params=query, header_params=headers, body=body,
                                         auth_settings=["BearerToken"])  # fmt: skip
        theirs.call_api(*request).read()
        ours.close()
        theirs.close()
    [(our_line, our_headers, our_body), (their_line, their_headers, their_body)] = seen.requests
    assert our_line == their_line
    assert our_body == their_body
    for name in ("authorization", "content-type", "accept"):
        assert our_headers[name].lower() == their_headers[name].lower(), name


def test_as_many_requests_at_once_as_the_kubelet_sends_keep_their_connections(caplog: pytest.LogCaptureFixture) -> None:
    # The kubelet sends the plugin up to max_workers prepares at once, each a claim GET and a status write; a pool
    # smaller than that closed the connections it could not keep ("Connection pool is full"): a TLS handshake each.
    at_once = KubeletPluginOptions.__dataclass_fields__["max_workers"].default
    everyone_in = threading.Barrier(at_once, timeout=10)  # every request waits for the others: all at once
    connections: list[int] = []

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            connections.append(1)
            while self.rfile.readline():
                while self.rfile.readline() not in (b"\r\n", b""):
                    pass
                with contextlib.suppress(threading.BrokenBarrierError):
                    everyone_in.wait()
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    with serving(Handler) as url, caplog.at_level(logging.WARNING):
        transport = Transport(Endpoint(url))
        with ThreadPoolExecutor(at_once) as pool:
            for _ in range(2):
                assert set(pool.map(lambda _: transport.request("GET", "/a").read(), range(at_once))) == {b"{}"}
        transport.close()
    assert not [record.getMessage() for record in caplog.records if "pool is full" in record.getMessage()]
    assert len(connections) == at_once  # the second round on the first round's connections


def test_a_get_the_server_dropped_on_a_reused_connection_is_sent_again_on_a_new_one() -> None:
    with recording_server(answers_per_connection=1) as (url, seen):
        transport = Transport(Endpoint(url))
        assert transport.request("GET", "/a").read() == b"{}"
        assert transport.request("GET", "/b").read() == b"{}"  # dropped once, answered on a new connection
        transport.close()
    assert [line.split()[1] for line, _, _ in seen.requests] == ["/a", "/b", "/b"] and seen.connections == 2


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_write_the_server_may_have_read_is_never_sent_twice(method: str) -> None:
    # The server read it before it closed the connection: it may have acted on it. The caller decides.
    with recording_server(answers_per_connection=1) as (url, seen):
        transport = Transport(Endpoint(url))
        assert transport.request("GET", "/a").read() == b"{}"
        with pytest.raises(OSError, match="Remote end closed connection without response"):
            transport.request(method, "/b", body=b"{}")
        transport.close()
    assert [line.split()[:2] for line, _, _ in seen.requests] == [["GET", "/a"], [method, "/b"]]


def test_a_get_that_timed_out_is_not_sent_again_and_the_error_names_both_limits() -> None:
    # A timeout is no dropped connection: as in Go, the caller decides (the publisher's and prepare's retries).
    with recording_server(answer=b"") as (url, seen):
        transport = Transport(Endpoint(url))
        with pytest.raises(TimeoutError, match=r"^timed out \(connect timeout 1 s, read timeout 0.2 s\)$"):
            transport.request("GET", "/slow", timeout=(1.0, 0.2))
        transport.close()
    assert [line for line, _, _ in seen.requests] == ["GET /slow HTTP/1.1"]


@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n", b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\n",
     b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\n"],
)  # fmt: skip
def test_every_status_comes_back_as_it_is_never_retried_or_followed(answer: bytes) -> None:
    # The adapters map statuses to errors and back off themselves (client-go's rate limiter and retries).
    with recording_server(answer=answer) as (url, seen):
        transport = Transport(Endpoint(url))
        response = transport.request("GET", "/a")
        assert (response.status, response.read()) == (int(answer.split()[1]), b"{}")
        transport.close()
    assert [line for line, _, _ in seen.requests] == ["GET /a HTTP/1.1"]


def test_an_unreachable_server_is_an_oserror_saying_why() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        transport = Transport(Endpoint(f"http://127.0.0.1:{unused.getsockname()[1]}"))
        with pytest.raises(OSError, match=r"^\[Errno 111\] Connection refused$"):
            transport.request("GET", "/version")


def test_tls_checks_the_server_against_the_ca_and_the_server_name(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    other = write_pki(tmp_path / "other")
    with FakeApiServer(tls=(pki.serving_cert, pki.serving_key)) as api:
        token = lambda: f"Bearer {TOKEN}"  # noqa: E731
        good = Transport(Endpoint(api.url, token, ca_file=str(pki.ca_cert)))
        assert json.loads(good.request("GET", "/version").read())["major"]
        # The serving certificate names kubernetes.default.svc, not other.example.
        named = Transport(Endpoint(api.url, token, ca_file=str(pki.ca_cert), server_name="kubernetes.default.svc"))
        assert named.request("GET", "/version").status == 200
        for endpoint in (
            Endpoint(api.url, token, ca_file=str(other.ca_cert)),
            Endpoint(api.url, token, ca_file=str(pki.ca_cert), server_name="other.example"),
        ):
            cluster = KubeCluster(Transport(endpoint))
            with pytest.raises(ApiUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
                cluster.server_version()
        skip = Transport(Endpoint(api.url, token, ca_file=str(other.ca_cert), verify=False))
        assert skip.request("GET", "/version").status == 200
        for transport in (good, named, skip):
            transport.close()


def test_a_rotated_token_file_is_read_again_and_a_missing_one_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = FileToken(str(path), reread=0)
    assert token() == "Bearer first"
    path.write_text("second")
    assert token() == "Bearer second"
    path.unlink()
    assert token() == "Bearer second"


def test_a_rotated_token_goes_out_with_the_next_request(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    with recording_server() as (url, seen):
        transport = Transport(Endpoint(url, FileToken(str(path), reread=0)))
        transport.request("GET", "/a").read()
        path.write_text("second\n")
        transport.request("GET", "/b").read()
        transport.close()
    assert [headers["authorization"] for _, headers, _ in seen.requests] == ["Bearer first", "Bearer second"]


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_text("read at the first connection")
    monkeypatch.setattr(transport_module, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    monkeypatch.setattr(transport_module, "SERVICE_ACCOUNT_CA", str(tmp_path / "ca.crt"))
    for name in ("https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


def test_in_a_pod_the_service_account_and_the_service_variables_are_read(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = in_cluster()
    assert (endpoint.url, endpoint.authorization(), endpoint.proxy) == ("https://10.96.0.1:443", "Bearer pod-token",
                                                                        None)  # fmt: skip
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    assert in_cluster().url == "https://[fd00:10:96::1]:443"


def test_in_a_pod_a_missing_variable_or_file_is_refused_naming_it(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(ConfigError, match=r"KUBERNETES_SERVICE_PORT must be set.*--kubeconfig"):
        in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (service_account / "token").unlink()
    with pytest.raises(ConfigError, match=r"service account token .*/token is missing.*automountServiceAccountToken"):
        load_transport()
    (service_account / "token").write_text("")
    with pytest.raises(ConfigError, match=r"token file .* is empty"):
        in_cluster()


def test_in_a_pod_the_ca_is_read_at_each_new_connection(
    service_account: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # As client-go's transport does (and the kubelet's rotated client certificates need): no restart for a new CA.
    pki = write_pki(tmp_path / "pki")
    with FakeApiServer(tls=(pki.serving_cert, pki.serving_key)) as api:
        (service_account / "token").write_text(TOKEN)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        transport = load_transport()
        with pytest.raises(OSError, match=r"NO_CERTIFICATE_OR_CRL_FOUND|no certificate or crl found"):
            transport.request("GET", "/version")
        (service_account / "ca.crt").write_bytes(pki.ca_cert.read_bytes())
        assert transport.request("GET", "/version").status == 200
        transport.close()


@pytest.mark.parametrize(
    ("host", "no_proxy", "proxied"),
    [("10.96.0.1", "", True), ("10.96.0.1", "10.0.0.0/8", False), ("10.96.0.1", "10.96.0.1", False),
     ("10.96.0.1", "10.96.0.1:443", False), ("10.96.0.1", "*", False), ("10.96.0.1", "example.com,10.97.0.0/16", True),
     ("api.example.com", "*.example.com", False), ("api.example.com", ".example.com", False),
     ("api.example.com", "example.com", False), ("api.example.org", "example.com", True),
     ("127.0.0.1", "", False), ("::1", "", False), ("localhost", "", False)],
)  # fmt: skip
def test_in_a_pod_the_environments_proxy_is_used_unless_no_proxy_or_loopback_exempts_the_server(
    service_account: Path, monkeypatch: pytest.MonkeyPatch, host: str, no_proxy: str, proxied: bool
) -> None:
    # Go's httpproxy rules, which client-go follows: loopback is never proxied.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert in_cluster().proxy == ("http://proxy.internal:3128" if proxied else None)


@pytest.mark.parametrize(
    ("server", "no_proxy", "proxied"),
    [("https://example.com:6443", ".example.com", True), ("https://example.com:6443", "*.example.com", True),
     ("https://api.example.com:6443", "*.example.com", False), ("https://example.com:6443", "example.com", False),
     ("https://notexample.com:6443", "example.com", True), ("https://API.Example.com:6443", "example.COM", False),
     ("https://api.example.com", "api.example.com:443", False), ("http://api.example.com", "api.example.com:80", False),
     ("https://api.example.com", "api.example.com:6443", True), ("https://10.96.0.1", "10.96.0.1:443", False),
     ("https://api.example.com:6443", "example.com:6443", False), ("https://api.example.com", "example.com:6443", True),
     ("https://api.example.com:6443", ".example.com:6443", False), ("https://[fd00::1]:6443", "[fd00::1]:6443", False),
     ("https://[fd00::1]:6443", "fd00::1", False), ("https://[fd00::1]:6443", "fd00::/64", False),
     ("https://[fd00::1]:6443", "[fd00::1]:443", True), ("https://10.96.0.1:6443", "10.96.0.0/12,x", False)],
)  # fmt: skip
def test_no_proxy_entries_match_as_in_gos_httpproxy(
    monkeypatch: pytest.MonkeyPatch, server: str, no_proxy: str, proxied: bool
) -> None:
    # golang.org/x/net/http/httpproxy: a leading "." or "*." matches subdomains only, an entry's port must equal
    # the URL's (its scheme's default port where it names none), a domain may carry a port.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    endpoint = from_client_configuration(client_package().Configuration(host=server))
    assert endpoint.proxy == ("http://proxy.internal:3128" if proxied else None)


def test_in_a_pod_the_upper_case_proxy_variables_come_first_as_in_go(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://upper.internal:3128")
    monkeypatch.setenv("https_proxy", "http://lower.internal:3128")
    assert in_cluster().proxy == "http://upper.internal:3128"


@pytest.mark.parametrize(
    ("variable", "proxy"),
    [("proxy.corp:3128", "http://proxy.corp:3128"), ("10.0.0.1:3128", "http://10.0.0.1:3128"),
     ("proxy.corp", "http://proxy.corp"), ("[fd00::1]:3128", "http://[fd00::1]:3128")],
)  # fmt: skip
def test_in_a_pod_a_proxy_without_a_scheme_is_an_http_proxy_as_in_go(
    service_account: Path, monkeypatch: pytest.MonkeyPatch, variable: str, proxy: str
) -> None:
    # Go's httpproxy: "a complete URL or a host[:port], in which case the http scheme is assumed".
    monkeypatch.setenv("HTTPS_PROXY", variable)
    assert in_cluster().proxy == proxy


def test_a_server_address_without_a_usable_port_is_refused_naming_where_it_came_from(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "https")
    with pytest.raises(ConfigError, match=r"https://10.96.0.1:https.*KUBERNETES_SERVICE_PORT"):
        load_transport()


def test_a_proxy_that_is_not_http_is_refused_saying_what_works(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", "socks5://proxy.internal:1080")
    with pytest.raises(ConfigError, match=r"socks5://proxy.internal:1080 is not an http://host:port proxy.*no_proxy"):
        in_cluster()


@pytest.mark.parametrize("variable", ["socks5://alice:s3cret@proxy.internal:1080", "ftp://alice:s3cret@proxy.internal"])
def test_a_refused_proxy_is_quoted_without_its_user_and_password(
    service_account: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", variable)
    with pytest.raises(ConfigError, match=r"HTTPS_PROXY (socks5|ftp)://proxy.internal(:1080)? is not") as refused:
        in_cluster()
    assert "alice" not in str(refused.value) and "s3cret" not in str(refused.value)


def test_an_endpoints_repr_shows_no_proxy_credentials() -> None:
    endpoint = Endpoint("https://10.1.2.3:6443", proxy="http://alice:s3cret@proxy.internal:3128",
                        proxy_headers={"Proxy-Authorization": "Basic YWxpY2U6czNjcmV0"})  # fmt: skip
    assert "s3cret" not in repr(endpoint) and "YWxpY2U6czNjcmV0" not in repr(endpoint)


def test_through_a_connect_proxy_tls_still_ends_at_the_api_server(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    with FakeApiServer(tls=(pki.serving_cert, pki.serving_key)) as api, connect_proxy() as (proxy, targets):
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
        # The proxy URL's user and password become its Proxy-Authorization, as Go's transport sends them.
        with_user = proxy.replace("http://", "http://ops:p%40ss@")
        endpoint = Endpoint(api.url, lambda: f"Bearer {TOKEN}", ca_file=str(pki.ca_cert), proxy=with_user)
        cluster = KubeCluster(Transport(endpoint))
        node: Any = cluster.get_node("n")
        cluster.close()
    assert node["metadata"]["name"] == "n"
    credentials = base64.b64encode(b"ops:p@ss").decode()
    assert targets == [f"CONNECT {api.url.removeprefix('https://')} Basic {credentials}"]


def test_through_a_proxy_a_plain_http_server_is_asked_in_absolute_form_with_the_proxy_credentials() -> None:
    with recording_server() as (proxy, seen):
        endpoint = Endpoint("http://10.1.2.3:8080/prefix", proxy=proxy.replace("http://", "http://ops:p%40ss@"))
        transport = Transport(endpoint)
        assert transport.request("GET", "/version", query=[("a", "b c")]).read() == b"{}"
        transport.close()
    [(line, headers, _)] = seen.requests
    assert line == "GET http://10.1.2.3:8080/prefix/version?a=b%20c HTTP/1.1"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"ops:p@ss").decode()


def test_a_tunnel_to_an_ipv6_api_server_names_it_in_brackets() -> None:
    with connect_proxy(refuse=True) as (proxy, targets):
        transport = Transport(Endpoint("https://[fd00:10:96::1]:6443", proxy=proxy))
        with pytest.raises(OSError, match="Tunnel connection failed: 502"):
            transport.request("GET", "/version")
    assert targets == ["CONNECT [fd00:10:96::1]:6443"]


def test_closing_a_watch_over_tls_from_another_thread_ends_a_blocked_read(tmp_path: Path) -> None:
    pki = write_pki(tmp_path / "pki")
    with FakeApiServer(tls=(pki.serving_cert, pki.serving_key)) as api:
        cluster = KubeCluster(Transport(Endpoint(api.url, lambda: f"Bearer {TOKEN}", ca_file=str(pki.ca_cert))))
        _, version = cluster.list_resource_slices(driver="d", node_name="n")
        stream = cluster.watch_resource_slices(driver="d", node_name="n", resource_version=version, timeout_seconds=60)
        assert next(stream).type == "BOOKMARK"
        done = threading.Event()

        def consume() -> None:
            list(stream)
            done.set()

        threading.Thread(target=consume, daemon=True).start()
        assert api.wait_until(lambda: api.active_watches == 1)
        stream.close()
        assert done.wait(5)
        cluster.close()
