"""The kubernetes-client adapter of the cluster port, against the API server stand-in over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import ApiEnv, api_env

from dradriver.errors import ConfigError
from dradriver.plugin.cluster import (
    ApiUnavailableError,
    ClusterError,
    ConflictError,
    InvalidObjectError,
    NotFoundError,
    WatchEvent,
    WatchExpiredError,
)
from dradriver.plugin.cluster import kube as kube_cluster
from dradriver.plugin.cluster.kube import KubeCluster, load_transport

DRIVER = "gpu.dradriver.dev"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiEnv]:
    with api_env(tmp_path) as env:
        yield env


def a_slice(name: str = "", *, driver: str = DRIVER, node: str = "node-1", devices: int = 1) -> dict[str, Any]:
    meta = {"name": name} if name else {"generateName": f"00000-{driver}-{node}-"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(devices)],
        },
    }


def a_claim(name: str = "claim-1", namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}},
    }


def test_get_resource_claim_returns_the_json_form_with_the_bearer_token_sent(api: ApiEnv) -> None:
    created = api.server.create("resourceclaims", a_claim())
    claim = api.cluster.get_resource_claim("ns", "claim-1")
    assert claim["metadata"]["uid"] == created["metadata"]["uid"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.dradriver.dev"
    assert api.server.requests and all(r.authorized for r in api.server.requests)


def test_a_missing_claim_raises_not_found_naming_it(api: ApiEnv) -> None:
    with pytest.raises(NotFoundError, match="ResourceClaim ns/gone") as raised:
        api.cluster.get_resource_claim("ns", "gone")
    assert raised.value.status == 404


def test_fields_unknown_to_the_client_models_are_kept(api: ApiEnv) -> None:
    api.server.validate = False  # a newer server would know this field
    api.server.create("resourceslices", {**a_slice("s1"), "futureField": {"x": 1}})
    items, _ = api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    assert items[0]["futureField"] == {"x": 1}


def test_claim_status_update_patches_only_status_devices_and_checks_the_resource_version(api: ApiEnv) -> None:
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}],
            "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}}],
        }
    }
    api.server.create("resourceclaims", {**a_claim(), "status": {"allocation": allocation}})
    claim = api.cluster.get_resource_claim("ns", "claim-1")
    claim["status"]["allocation"] = {"tampered": True}  # never sent: the scheduler's, compared byte for byte
    claim["status"]["devices"] = [
        {
            "driver": DRIVER,
            "pool": "node-1",
            "device": "gpu-0",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    ]
    updated = api.cluster.update_resource_claim_status(claim)
    assert updated["status"]["devices"][0]["device"] == "gpu-0"
    assert updated["status"]["allocation"] == allocation
    [patch] = [r for r in api.server.requests if r.method == "PATCH"]
    assert patch.path.endswith("/resourceclaims/claim-1/status")
    with pytest.raises(ConflictError, match="ResourceClaim ns/claim-1 status"):
        api.cluster.update_resource_claim_status(claim)  # stale resourceVersion now
    cleared = api.cluster.get_resource_claim("ns", "claim-1")
    cleared["status"].pop("devices")
    assert "devices" not in api.cluster.update_resource_claim_status(cleared)["status"]


def test_get_node_returns_its_uid(api: ApiEnv) -> None:
    node = api.server.create("nodes", {"metadata": {"name": "node-1"}})
    assert api.cluster.get_node("node-1")["metadata"]["uid"] == node["metadata"]["uid"]


def test_patch_node_sends_a_merge_patch_that_sets_and_removes_labels(api: ApiEnv) -> None:
    api.server.create("nodes", {"metadata": {"name": "node-1", "labels": {"team": "a", "nvidia.com/gpu.count": "8"}}})
    patched = api.cluster.patch_node(
        "node-1", {"metadata": {"labels": {"nvidia.com/gpu.count": None, "nvidia.com/gpu.present": "true"}}}
    )
    assert patched["metadata"]["labels"] == {"team": "a", "nvidia.com/gpu.present": "true"}
    [patch] = [r for r in api.server.requests if r.method == "PATCH"]
    assert patch.path == "/api/v1/nodes/node-1"
    with pytest.raises(ClusterError, match="PATCH Node node-2: HTTP 404"):
        api.cluster.patch_node("node-2", {"metadata": {"labels": {"a": "b"}}})


def test_list_nodes_returns_every_node(api: ApiEnv) -> None:
    for name in ("node-1", "node-2"):
        api.server.create("nodes", {"metadata": {"name": name}})
    assert sorted(n["metadata"]["name"] for n in api.cluster.list_nodes()) == ["node-1", "node-2"]


def test_list_filters_by_driver_and_node_and_returns_a_resource_version(api: ApiEnv) -> None:
    api.server.create("resourceslices", a_slice("mine"))
    api.server.create("resourceslices", a_slice("other-node", node="node-2"))
    api.server.create("resourceslices", a_slice("other-driver", driver="nic.example.com"))
    items, rv = api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    assert [i["metadata"]["name"] for i in items] == ["mine"]
    assert rv == api.server.resource_version
    discovery, request = [r for r in api.server.requests if r.method == "GET"]
    assert discovery.path == "/apis/resource.k8s.io"  # the version to speak, asked once
    assert request.query["fieldSelector"] == f"spec.driver={DRIVER},spec.nodeName=node-1"


def test_create_with_generate_name_gets_a_name_uid_and_resource_version(api: ApiEnv) -> None:
    stored = api.cluster.create_resource_slice(a_slice())
    meta = stored["metadata"]
    assert (
        meta["name"].startswith(f"00000-{DRIVER}-node-1-") and len(meta["name"]) == len(f"00000-{DRIVER}-node-1-") + 5
    )
    assert meta["uid"] and meta["resourceVersion"]


def test_an_invalid_slice_is_rejected_with_422_naming_the_device(api: ApiEnv) -> None:
    bad = a_slice()
    bad["spec"]["devices"][0]["name"] = "GPU_0"
    with pytest.raises(InvalidObjectError, match="GPU_0") as raised:
        api.cluster.create_resource_slice(bad)
    assert raised.value.status == 422 and raised.value.reason == "Invalid"


def test_the_stand_in_rejects_fields_the_schema_does_not_know(api: ApiEnv) -> None:
    with pytest.raises(InvalidObjectError, match="bogusField"):
        api.cluster.create_resource_slice({**a_slice(), "bogusField": 1})


def test_update_with_a_stale_resource_version_is_a_conflict(api: ApiEnv) -> None:
    stored = api.cluster.create_resource_slice(a_slice("s1"))
    stored["spec"]["devices"].append({"name": "gpu-1"})
    updated = api.cluster.update_resource_slice(stored)
    assert len(updated["spec"]["devices"]) == 2
    with pytest.raises(ConflictError, match="ResourceSlice s1"):
        api.cluster.update_resource_slice(stored)


def test_delete_checks_uid_and_resource_version_preconditions(api: ApiEnv) -> None:
    stored = api.cluster.create_resource_slice(a_slice("s1"))
    meta = stored["metadata"]
    with pytest.raises(ConflictError, match="Precondition failed"):
        api.cluster.delete_resource_slice("s1", uid="other-uid", resource_version=meta["resourceVersion"])
    with pytest.raises(ConflictError, match="resourceVersion in precondition: 999"):
        api.cluster.delete_resource_slice("s1", uid=meta["uid"], resource_version="999")
    api.cluster.delete_resource_slice("s1", uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert api.server.get("resourceslices", "s1") is None
    with pytest.raises(NotFoundError, match="DELETE ResourceSlice s1: HTTP 404"):
        api.cluster.delete_resource_slice("s1", uid=meta["uid"], resource_version=meta["resourceVersion"])


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_and_throttling_are_api_unavailable(api: ApiEnv, status: int) -> None:
    api.server.fail_next("GET", "/resourceslices", status)
    with pytest.raises(ApiUnavailableError) as raised:
        api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    assert raised.value.retryable and raised.value.status == status
    api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")


def test_a_request_the_server_does_not_answer_in_time_is_api_unavailable(tmp_path: Path) -> None:
    with api_env(tmp_path, request_timeout=(1.0, 0.2)) as env:
        env.server.delay_next("GET", "/nodes/", 2.0)
        with pytest.raises(ApiUnavailableError, match="Node node-1"):
            env.cluster.get_node("node-1")


def test_an_unreachable_server_is_api_unavailable(tmp_path: Path) -> None:
    with api_env(tmp_path) as env:
        cluster = env.cluster
    with pytest.raises(ApiUnavailableError, match="unreachable"):
        cluster.get_node("node-1")


def _events(stream: Any, count: int) -> list[WatchEvent]:
    return [next(stream) for _ in range(count)]


def test_watch_streams_added_modified_deleted_after_the_given_version(api: ApiEnv) -> None:
    api.server.create("resourceslices", a_slice("before"))
    _, rv = api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    stream = api.cluster.watch_resource_slices(
        driver=DRIVER, node_name="node-1", resource_version=rv, timeout_seconds=30
    )
    try:
        assert next(stream).type == "BOOKMARK"
        created = api.cluster.create_resource_slice(a_slice("s1"))
        api.server.create("resourceslices", a_slice("elsewhere", node="node-2"))
        created["spec"]["devices"].append({"name": "gpu-1"})
        api.cluster.update_resource_slice(created)
        api.server.delete("resourceslices", "s1")
        events = _events(stream, 3)
    finally:
        stream.close()
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("ADDED", "s1"),
        ("MODIFIED", "s1"),
        ("DELETED", "s1"),
    ]
    assert int(events[-1].resource_version) > int(events[0].resource_version)


def test_watch_resumes_from_a_resource_version_with_the_events_since(api: ApiEnv) -> None:
    _, rv = api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    api.server.create("resourceslices", a_slice("missed"))
    stream = api.cluster.watch_resource_slices(
        driver=DRIVER, node_name="node-1", resource_version=rv, timeout_seconds=30
    )
    try:
        event = next(stream)
    finally:
        stream.close()
    assert (event.type, event.object["metadata"]["name"]) == ("ADDED", "missed")


def test_watch_from_a_compacted_version_raises_watch_expired(api: ApiEnv) -> None:
    api.server.create("resourceslices", a_slice("s1"))
    api.server.create("resourceslices", a_slice("s2"))
    api.server.compact()
    stream = api.cluster.watch_resource_slices(
        driver=DRIVER, node_name="node-1", resource_version="1", timeout_seconds=30
    )
    with pytest.raises(WatchExpiredError, match="HTTP 410: too old resource version"):
        next(stream)


def test_watch_ends_when_the_server_times_it_out_or_drops_it(api: ApiEnv) -> None:
    rv = api.server.resource_version
    timed = api.cluster.watch_resource_slices(driver=DRIVER, node_name="node-1", resource_version=rv, timeout_seconds=0)
    assert [e.type for e in timed] == ["BOOKMARK"]
    dropped = api.cluster.watch_resource_slices(
        driver=DRIVER, node_name="node-1", resource_version=rv, timeout_seconds=30
    )
    assert next(dropped).type == "BOOKMARK"
    api.server.drop_watches()
    assert list(dropped) == []


def test_closing_a_watch_from_another_thread_ends_a_blocked_read(api: ApiEnv) -> None:
    stream = api.cluster.watch_resource_slices(
        driver=DRIVER, node_name="node-1", resource_version=api.server.resource_version, timeout_seconds=60
    )
    assert next(stream).type == "BOOKMARK"
    done = threading.Event()
    consumed: list[WatchEvent] = []

    def consume() -> None:
        consumed.extend(stream)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert api.server.wait_until(lambda: api.server.active_watches == 1)
    stream.close()
    assert done.wait(5)
    assert consumed == []


def test_load_transport_reads_an_explicit_kubeconfig(api: ApiEnv, tmp_path: Path) -> None:
    path = api.server.write_kubeconfig(tmp_path / "explicit")
    cluster = KubeCluster(load_transport(str(path)))
    api.server.create("nodes", {"metadata": {"name": "n"}})
    assert cluster.get_node("n")["metadata"]["name"] == "n"
    cluster.close()


def test_load_transport_falls_back_to_the_kubeconfig_variable(
    api: ApiEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(api.server.write_kubeconfig(tmp_path / "env")))
    transport = load_transport()
    assert transport.endpoint.url == api.server.url
    transport.close()


def test_load_transport_explains_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.*--kubeconfig"):
        load_transport(str(tmp_path / "missing"))


def _in_fresh_interpreter(code: str, **env: str) -> Any:
    """Run ``code`` in a new interpreter (its modules are what is checked) and return the JSON it prints."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_in_a_pod_the_adapter_loads_neither_the_client_nor_its_kubeconfig_loader(tmp_path: Path) -> None:
    # The client's Configuration brings multiprocessing, its ApiClient pydantic, its kubeconfig loader oauthlib,
    # requests and dateutil: none of them has a job in a pod (docs/reliability.md). urllib3 does: the transport.
    (tmp_path / "token").write_text("pod-token\n")
    (tmp_path / "ca.crt").write_text("not read before the first request")
    code = f"""
import json, sys
from dradriver.plugin.cluster import kube, transport
transport.SERVICE_ACCOUNT_TOKEN = {str(tmp_path / "token")!r}  # the pod's mounted files
transport.SERVICE_ACCOUNT_CA = {str(tmp_path / "ca.crt")!r}
cluster = kube.KubeCluster.from_kubeconfig()
endpoint = kube.load_transport().endpoint
unwanted = ("kubernetes.client", "kubernetes.config.kube_config", "pydantic", "dateutil", "requests", "oauthlib")
print(json.dumps({{
    "url": endpoint.url,
    "authorization": endpoint.authorization(),
    "loaded": sorted(m for m in unwanted if m in sys.modules),
}}))
"""
    seen = _in_fresh_interpreter(code, KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_SERVICE_PORT="443")
    assert seen == {"url": "https://10.0.0.1:443", "authorization": "Bearer pod-token", "loaded": []}


def test_the_kubernetes_package_still_offers_everything_it_exports() -> None:
    # kube_cluster loads `kubernetes` and `kubernetes.config` lazily; other code in the process must not notice.
    code = """
import json
import dradriver.plugin.cluster.kube
import kubernetes
from kubernetes import dynamic, watch
from kubernetes.config import ConfigException, load_kube_config
import kubernetes.config
print(json.dumps([
    kubernetes.__version__ == kubernetes.client.__version__,
    callable(load_kube_config) and issubclass(ConfigException, Exception),
    hasattr(dynamic, "DynamicClient") and hasattr(watch, "Watch") and hasattr(kubernetes.utils, "create_from_dict"),
    hasattr(kubernetes.config, "load_incluster_config"),
    hasattr(kubernetes, "no_such_part"),
]))
"""
    assert _in_fresh_interpreter(code) == [True, True, True, True, False]


@pytest.fixture
def lazy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``lazypkg`` on sys.path whose ``__init__`` the test writes, loaded by ``_lazy_package``."""
    (tmp_path / "lazypkg").mkdir()
    (tmp_path / "lazypkg" / "part.py").write_text("PART = 'part'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "lazypkg" / "__init__.py"
    for name in [n for n in sys.modules if n == "lazypkg" or n.startswith(("lazypkg.", "lazygate"))]:
        del sys.modules[name]


def test_a_thread_asking_a_lazy_package_while_another_runs_its_init_waits_for_it(lazy_package: Path) -> None:
    # As `import` does: a second thread never sees the package half initialised.
    (lazy_package.parent.parent / "lazygate.py").write_text(
        "import threading\nstarted, release = threading.Event(), threading.Event()\n"
    )
    lazy_package.write_text("from lazygate import started, release\nstarted.set()\nrelease.wait(10)\nVALUE = 42\n")
    import lazygate  # type: ignore[import-not-found]

    kube_cluster._lazy_package("lazypkg")
    package: Any = sys.modules["lazypkg"]
    seen: dict[str, object] = {}

    def read(key: str) -> None:
        try:
            seen[key] = package.VALUE
        except AttributeError as err:
            seen[key] = err

    first = threading.Thread(target=read, args=("first",))
    first.start()
    assert lazygate.started.wait(10)
    second = threading.Thread(target=read, args=("second",))
    second.start()
    second.join(0.5)  # not synchronisation: only gives a broken implementation the time to answer early
    lazygate.release.set()
    first.join(10)
    second.join(10)
    assert seen == {"first": 42, "second": 42}


def test_a_lazy_package_whose_init_failed_fails_again_the_same_way(lazy_package: Path) -> None:
    # An eagerly imported package that failed is imported afresh by the next import, which fails the same way.
    lazy_package.write_text("raise ImportError('lazypkg needs somedependency')\n")
    kube_cluster._lazy_package("lazypkg")
    package: Any = sys.modules["lazypkg"]
    for _ in range(2):
        with pytest.raises(ImportError, match="needs somedependency"):
            package.VALUE  # noqa: B018
    assert package.part.PART == "part"  # its submodules still import


def test_the_newest_resource_version_the_server_serves_is_spoken(api: ApiEnv) -> None:
    api.server.resource_versions = ["v1", "v1beta2", "v1beta1"]
    assert api.cluster.resource_version() == "v1"


def test_a_server_without_dra_is_refused_saying_what_it_needs(api: ApiEnv) -> None:
    api.server.resource_versions = ["v1alpha3"]
    with pytest.raises(ClusterError, match=r"serves resource.k8s.io v1alpha3, none of v1, v1beta2, v1beta1.*1\.32"):
        api.cluster.resource_version()


def test_a_server_that_does_not_serve_the_group_at_all_is_refused_the_same_way(api: ApiEnv) -> None:
    # 1.32/1.33 with DRA off (their default) answer the group's discovery with a plain 404: the reason and the fix
    # must still reach the log, not "404 page not found" (seen on a real 1.33 server, tests/cluster/).
    api.server.resource_versions = []
    with pytest.raises(
        ClusterError, match=r"does not serve resource.k8s.io at all, none of v1, .*runtime-config="
    ) as refused:
        api.cluster.resource_version()
    assert not isinstance(refused.value, NotFoundError)


def test_an_older_server_is_spoken_to_in_its_version(api: ApiEnv) -> None:
    # The stand-in stores v1 objects only: a v1beta1 server's paths are not found there, which shows the adapter
    # asks for the version discovery chose.
    api.server.resource_versions = ["v1beta1"]
    with pytest.raises(ClusterError) as raised:
        api.cluster.list_resource_slices(driver=DRIVER, node_name="node-1")
    [request] = [r for r in api.server.requests if r.path.endswith("/resourceslices")]
    assert request.path == "/apis/resource.k8s.io/v1beta1/resourceslices"
    # A path not served is not "not found": nothing may take it for a deleted object.
    assert raised.value.status == 404 and not isinstance(raised.value, NotFoundError)


def test_a_claim_is_gone_only_when_the_api_server_names_it_not_found(api: ApiEnv) -> None:
    # kube-apiserver names a missing object in its 404 (details.name); a 404 for a path it does not serve (a DRA
    # version turned off since discovery) names nothing, and read as "deleted" it would unprepare running pods.
    with pytest.raises(NotFoundError, match="GET ResourceClaim default/no-such-claim: HTTP 404"):
        api.cluster.get_resource_claim("default", "no-such-claim")
    api.cluster.resource_version()  # discovery done: v1
    api.server.resource_versions = ["v1beta1"]  # the server stops serving v1
    with pytest.raises(ClusterError) as raised:
        api.cluster.get_resource_claim("default", "no-such-claim")
    assert not isinstance(raised.value, NotFoundError) and "does not serve this path" in str(raised.value)
    # Discovery runs again at the next call and finds the version now served.
    assert api.cluster.resource_version() == "v1beta1"
