"""The --metrics-address endpoint: metrics, liveness and readiness with its reasons."""

import json
import urllib.error
import urllib.request

import pytest

from dradriver.cli.status_server import StatusServer
from dradriver.errors import ConfigError


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_serves_metrics_liveness_and_readiness_with_reasons():
    state = {"ready": False}
    server = StatusServer("127.0.0.1:0", lambda: (state["ready"], {"registered": state["ready"]}))
    server.start()
    try:
        assert fetch(server.port, "/livez") == (200, "ok\n")
        assert fetch(server.port, "/healthz") == (200, "ok\n")
        code, body = fetch(server.port, "/readyz")
        assert code == 503 and json.loads(body) == {"ready": False, "registered": False}
        state["ready"] = True
        assert fetch(server.port, "/readyz")[0] == 200
        code, body = fetch(server.port, "/metrics")
        assert code == 200 and "python_info" in body
        assert fetch(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_a_bad_address_names_the_flag():
    with pytest.raises(ConfigError, match="--metrics-address"):
        StatusServer("localhost:http", lambda: (True, {}))


def test_a_busy_port_is_a_config_error_naming_the_flag() -> None:
    import socket

    import pytest

    from dradriver.cli.status_server import StatusServer
    from dradriver.errors import ConfigError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="--metrics-address"):
            StatusServer(f"127.0.0.1:{busy.getsockname()[1]}", lambda: (True, {}))


def test_livez_is_503_with_its_reasons_when_liveness_says_no():
    alive = {"ok": True}
    server = StatusServer(
        "127.0.0.1:0", lambda: (True, {}), lambda: (alive["ok"], {"draSocket": alive["ok"], "registrationSocket": True})
    )
    server.start()
    try:
        assert fetch(server.port, "/livez") == (200, "ok\n")
        assert fetch(server.port, "/healthz") == (200, "ok\n")  # without its own check: liveness's
        alive["ok"] = False
        code, body = fetch(server.port, "/livez")
        assert code == 503 and json.loads(body) == {"alive": False, "draSocket": False, "registrationSocket": True}
        assert fetch(server.port, "/healthz")[0] == 503
    finally:
        server.stop()


def test_each_probe_answers_its_own_check():
    """kube-apiserver's convention: /livez (restart me), /readyz (send me work), /healthz (everything)."""
    published = {"ok": True}
    server = StatusServer(
        "127.0.0.1:0",
        lambda: (published["ok"], {"slicesPublished": published["ok"]}),
        lambda: (True, {"draSocket": True, "registrationSocket": True}),
        lambda: (published["ok"], {"draSocket": True, "slicesPublished": published["ok"]}),
    )
    server.start()
    try:
        assert [fetch(server.port, p)[0] for p in ("/livez", "/readyz", "/healthz")] == [200, 200, 200]
        published["ok"] = False  # an API outage: not ready, not healthy, but alive (no restart)
        assert fetch(server.port, "/livez") == (200, "ok\n")
        assert fetch(server.port, "/readyz")[0] == 503
        code, body = fetch(server.port, "/healthz")
        assert code == 503 and json.loads(body) == {"healthy": False, "draSocket": True, "slicesPublished": False}
    finally:
        server.stop()


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(response.status)


def test_the_default_wildcard_address_answers_probes_over_ipv4_and_ipv6() -> None:
    # Probes call the pod's IP, which is an IPv6 address on single-stack IPv6 clusters.
    server = StatusServer(":0", lambda: (True, {}))
    server.start()
    try:
        assert _get(f"http://127.0.0.1:{server.port}/healthz") == 200
        assert _get(f"http://[::1]:{server.port}/healthz") == 200
    finally:
        server.stop()


def test_an_ipv6_address_in_brackets_is_served() -> None:
    server = StatusServer("[::1]:0", lambda: (True, {}))
    server.start()
    try:
        assert _get(f"http://[::1]:{server.port}/readyz") == 200
    finally:
        server.stop()


def test_a_query_string_does_not_change_the_endpoint():
    # kube-apiserver's probes take ?verbose (a probe copied from its docs), Prometheus scrapes may add parameters.
    server = StatusServer("127.0.0.1:0", lambda: (True, {}))
    server.start()
    try:
        assert fetch(server.port, "/livez?verbose") == (200, "ok\n")
        assert fetch(server.port, "/healthz?verbose=1") == (200, "ok\n")
        assert fetch(server.port, "/readyz?verbose")[0] == 200
        code, body = fetch(server.port, "/metrics?name[]=python_info")
        assert code == 200 and "python_info" in body
        assert fetch(server.port, "/nope?x")[0] == 404
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("path", "what", "failed"),
    [("/readyz", "ready", "readiness"), ("/livez", "alive", "liveness"), ("/healthz", "healthy", "health")],
)
def test_a_check_that_raises_answers_503_naming_it(path, what, failed, caplog):
    def broken() -> tuple[bool, dict]:
        raise RuntimeError("state lock poisoned")

    def fine() -> tuple[bool, dict]:
        return True, {}

    checks = {name: broken if name == failed else fine for name in ("readiness", "liveness", "health")}
    server = StatusServer("127.0.0.1:0", checks["readiness"], checks["liveness"], checks["health"])
    server.start()
    try:
        code, body = fetch(server.port, path)
        assert code == 503
        assert json.loads(body) == {what: False, "failedCheck": failed, "error": "RuntimeError: state lock poisoned"}
        assert fetch(server.port, path)[0] == 503  # the server still answers afterwards
    finally:
        server.stop()
    assert any(failed in r.getMessage() and r.exc_info for r in caplog.records)
