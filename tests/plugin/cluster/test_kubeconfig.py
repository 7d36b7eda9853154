"""The one rule by which every command finds its client configuration (--kubeconfig, $KUBECONFIG, in a pod the
service account, ~/.kube/config), and the checks of a kubeconfig before the client reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import ConfigError
from dradriver.plugin.cluster import transport
from dradriver.plugin.cluster.kube import load_endpoint


def kubeconfig(path: Path, server: str, *, current: str | None = "c", **extra: Any) -> Path:
    """A kubeconfig with one context ``c`` pointing at ``server`` (``extra`` replaces whole sections)."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        **({"current-context": current} if current is not None else {}),
        **extra,
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Every source of the rule there at once, each pointing at a server of its own; a test takes them away."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_text("read at the first request")
    monkeypatch.setattr(transport, "SERVICE_ACCOUNT_TOKEN", str(tmp_path / "token"))
    monkeypatch.setattr(transport, "SERVICE_ACCOUNT_CA", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    variable = kubeconfig(tmp_path / "variable", "https://variable.example:6443")
    monkeypatch.setenv("KUBECONFIG", str(variable))
    return {
        "flag": kubeconfig(tmp_path / "flag", "https://flag.example:6443"),
        "variable": variable,
        "home": kubeconfig(home / ".kube/config", "https://home.example:6443"),
    }


def test_the_flag_then_the_variable_then_the_service_account_then_the_home_file(
    sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_endpoint(str(sources["flag"])).url == "https://flag.example:6443"
    assert load_endpoint().url == "https://variable.example:6443"  # before the pod's own service account
    monkeypatch.delenv("KUBECONFIG")
    in_pod = load_endpoint()
    assert (in_pod.url, in_pod.authorization()) == ("https://10.96.0.1:443", "Bearer pod-token")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert load_endpoint().url == "https://home.example:6443"
    sources["home"].unlink()
    with pytest.raises(ConfigError, match=r"^no Kubernetes client configuration: .* pass --kubeconfig FILE or set"):
        load_endpoint()


def test_a_context_given_in_a_pod_passes_over_the_service_account(
    sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service account has no contexts: as with kubectl in a pod, --context is looked for in a kubeconfig.
    monkeypatch.delenv("KUBECONFIG")
    assert load_endpoint(context="c").url == "https://home.example:6443"
    sources["home"].unlink()
    with pytest.raises(ConfigError, match=r"^no Kubernetes client configuration for --context c: .* has no contexts"):
        load_endpoint(context="c")
    assert load_endpoint().url == "https://10.96.0.1:443"


def test_kubeconfig_files_merge_as_kubectl_merges_them(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first file to set current-context wins (the Python client alone would take the last one); a listed file
    # that does not exist is skipped; a context may come from one file and its cluster from another.
    first = kubeconfig(tmp_path / "first", "https://first.example:6443", current="other", clusters=[])
    second = kubeconfig(
        tmp_path / "second",
        "https://second.example:6443",
        current="c",
        contexts=[{"name": "other", "context": {"cluster": "c", "user": "u"}}],
    )
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{first}:{second}")
    assert load_endpoint().url == "https://second.example:6443"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{tmp_path / 'gone'}")
    with pytest.raises(ConfigError, match=r"^\$KUBECONFIG .*/absent:.*/gone: none of the files it lists exists; point"):
        load_endpoint()


def test_a_context_is_chosen_and_checked(sources: dict[str, Path], tmp_path: Path) -> None:
    two = kubeconfig(
        tmp_path / "two",
        "https://a.example:6443",
        clusters=[
            {"name": "c", "cluster": {"server": "https://a.example:6443"}},
            {"name": "d", "cluster": {"server": "https://d.example:6443"}},
        ],
        contexts=[
            {"name": "c", "context": {"cluster": "c", "user": "u"}},
            {"name": "d", "context": {"cluster": "d", "user": "u"}},
        ],
    )
    assert load_endpoint(str(two), context="d").url == "https://d.example:6443"
    with pytest.raises(ConfigError, match=r"--context e is not one of its contexts \(contexts: c, d\); pass one of"):
        load_endpoint(str(two), context="e")


def test_a_key_twice_in_a_kubeconfig_is_read_as_client_go_reads_it_the_last_kept(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    # clientcmd decodes a kubeconfig through sigs.k8s.io/yaml's lenient YAMLToJSON (its codec is not strict): the
    # last value of a key stands, as the kubernetes client's loader (PyYAML) takes it too.
    path = tmp_path / "twice"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: other\ncurrent-context: c\n"
        "clusters:\n- name: c\n  cluster:\n    server: https://first.example:6443\n"
        "    server: https://last.example:6443\n"
        "contexts:\n- name: c\n  context: {cluster: c}\n"
    )
    assert load_endpoint(str(path)).url == "https://last.example:6443"


@pytest.mark.parametrize("users", [[{"name": "someone-else", "user": {"token": "t"}}], []])
def test_a_context_naming_a_user_that_is_not_defined_connects_without_credentials(
    sources: dict[str, Path], tmp_path: Path, users: list[dict[str, Any]]
) -> None:
    # As client-go: the context's user is where credentials come from, and none is anonymous (its getAuthInfo
    # requires the user only when --user names it).
    path = kubeconfig(tmp_path / "anonymous", "https://anonymous.example:6443", users=users)
    endpoint = load_endpoint(str(path))
    assert endpoint.url == "https://anonymous.example:6443"
    assert (endpoint.authorization(), endpoint.cert_file, endpoint.key_file) == (None, None, None)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"current-context": None}, r"no current-context is set; choose one with `kubectl config use-context NAME`"),
        ({"clusters": [{"name": "c", "cluster": {}}]},
         r"cluster 'c' has no server; set it: kubectl config set-cluster c --server https://HOST:PORT"),
        ({"clusters": []}, r"context 'c' names cluster 'c', which is not defined \(it defines no clusters\)"),
        ({"clusters": [{"name": "c", "cluster": {"server": "https://c.example", "proxy-url": 3128}}]},
         r"cluster 'c' has a proxy-url that is a number, not a URL; set it: kubectl config set-cluster c"),
        ({"contexts": "c"}, r"contexts is a string, not a list"),
        ({"users": [{"user": {}}]}, r"users\[0\] has no name"),
        ({"users": [{"name": "u", "user": {"client-certificate": "/nowhere/u.crt", "client-key": "/nowhere/u.key"}}]},
         r"the Kubernetes client cannot use it: .*/nowhere/u\.crt.*; fix what it names, or point --kubeconfig"),
    ],
)  # fmt: skip
def test_a_kubeconfig_the_client_cannot_use_is_one_line_naming_it(
    sources: dict[str, Path], tmp_path: Path, sections: dict[str, Any], message: str
) -> None:
    path = kubeconfig(tmp_path / "broken", "https://broken.example:6443")
    config = {**json.loads(path.read_text()), **sections}
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(ConfigError, match=rf"^--kubeconfig {path}: {message}") as refused:
        load_endpoint(str(path))
    assert "\n" not in str(refused.value)


@pytest.fixture
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable set: a test sets those it means."""
    for name in ("ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.usefixtures("no_proxy_variables")
def test_a_kubeconfig_without_proxy_url_takes_the_environments_proxy_by_gos_rules(
    sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As kubectl: ALL_PROXY is not read and upper case comes first (the kubernetes client's Configuration reads
    # ALL_PROXY and prefers lower case; its proxy is not the one we use).
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    assert load_endpoint(str(sources["flag"])).proxy is None
    monkeypatch.setenv("HTTPS_PROXY", "http://upper.internal:3128")
    monkeypatch.setenv("https_proxy", "http://lower.internal:3128")
    assert load_endpoint(str(sources["flag"])).proxy == "http://upper.internal:3128"
    monkeypatch.setenv("NO_PROXY", "flag.example")
    assert load_endpoint(str(sources["flag"])).proxy is None


@pytest.mark.usefixtures("no_proxy_variables")
def test_a_kubeconfigs_proxy_url_is_used_whatever_no_proxy_says_and_for_loopback_too(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # client-go takes a cluster's proxy-url with http.ProxyURL: for every request, no exemption.
    cluster = {"server": "https://127.0.0.1:6443", "proxy-url": "http://proxy.internal:3128"}
    path = kubeconfig(tmp_path / "proxied", "", clusters=[{"name": "c", "cluster": cluster}])
    monkeypatch.setenv("HTTPS_PROXY", "http://environment.internal:3128")
    monkeypatch.setenv("NO_PROXY", "*")
    assert load_endpoint(str(path)).proxy == "http://proxy.internal:3128"
    cluster["proxy-url"] = "socks5://alice:s3cret@proxy.internal:1080"  # quoted without user and password
    path = kubeconfig(tmp_path / "socks", "", clusters=[{"name": "c", "cluster": cluster}])
    with pytest.raises(ConfigError, match=r"^the kubeconfig's proxy-url socks5://proxy.internal:1080 is not an http"):
        load_endpoint(str(path))
