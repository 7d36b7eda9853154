"""The ComputeDomain controller, pass by pass on an in-memory API server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.fake_rest import FakeRest

from dradriver.computedomain import api
from dradriver.computedomain.controller import Controller, ControllerSettings
from dradriver.computedomain.kube import path_of
from dradriver.plugin.cluster.port import ApiUnavailableError, ForbiddenError

NS = "dradriver"
UID = "uid-job"
CD_PATH = path_of(api.API_VERSION, "computedomains", "team", "job")
CLIQUE_PATH = path_of(api.API_VERSION, "computedomaincliques", NS, f"{UID}.c")
PASSES_OK = "dradriver_computedomain_controller_passes_total"
RECONCILE_ERRORS = "dradriver_computedomain_reconcile_errors_total"
DOMAINS = "dradriver_computedomains"


def _domain(rest: FakeRest, *, num_nodes: int = 2, mode: str = "Single") -> None:
    rest.put(
        CD_PATH,
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": "job", "namespace": "team", "uid": UID, "generation": 1},
            "spec": {
                "numNodes": num_nodes,
                "channel": {"resourceClaimTemplate": {"name": "job-ch"}, "allocationMode": mode},
            },
        },
    )


def _daemon_pod(rest: FakeRest, node: str, *, clique: str = "c") -> None:
    rest.put(
        path_of("v1", "pods", NS, f"daemon-{node}"),
        {
            "metadata": {"name": f"daemon-{node}", "labels": {api.DOMAIN_LABEL: UID, api.CLIQUE_LABEL: clique}},
            "spec": {"nodeName": node},
            "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]},
        },
    )


def _join(rest: FakeRest, node: str, status: str = "NotReady") -> None:
    rest.apply(
        CLIQUE_PATH,
        {
            "metadata": {"name": f"{UID}.c", "namespace": NS, "labels": {api.DOMAIN_LABEL: UID}},
            "daemons": [{"nodeName": node, "ipAddress": f"10.0.0.{len(node)}", "cliqueID": "c", "status": status}],
        },
        manager=f"cd-daemon-{node}",
    )


@pytest.fixture
def rest() -> FakeRest:
    return FakeRest()


@pytest.fixture
def controller(rest: FakeRest) -> Controller:
    return Controller(rest, ControllerSettings(namespace=NS, image="dradriver:test"))  # type: ignore[arg-type]


def _status(rest: FakeRest) -> dict[str, Any]:
    status: dict[str, Any] = rest.get(CD_PATH).get("status", {})
    return status


def test_a_domain_gets_its_finalizer_templates_and_daemonset(rest: FakeRest, controller: Controller) -> None:
    _domain(rest, mode="All")
    controller.sync()
    assert rest.get(CD_PATH)["metadata"]["finalizers"] == [api.FINALIZER]
    workload = rest.get(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"))
    config = workload["spec"]["spec"]["devices"]["config"][0]["opaque"]
    assert config == {"driver": api.DRIVER_NAME, "parameters": api.channel_config(UID, "All")}
    daemonset = rest.get(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {api.DOMAIN_LABEL: UID}
    assert pod["resourceClaims"] == [
        {"name": "compute-domain-daemon", "resourceClaimTemplateName": f"computedomain-daemon-{UID}"}
    ]
    assert rest.find(path_of("resource.k8s.io/v1", "resourceclaimtemplates", NS, f"computedomain-daemon-{UID}"))
    assert _status(rest)["status"] == "NotReady"


def test_under_nvidias_names_a_domain_of_nvidias_group_gets_nvidias_finalizer_labels_classes_and_daemons(
    rest: FakeRest,
) -> None:
    """--compat nvidia: the controller serves resource.nvidia.com and writes only NVIDIA's names; its daemons are
    told (DRADRIVER_COMPAT) so their cliques are of that group too."""
    names = api.NVIDIA
    path = path_of(names.api_version, "computedomains", "team", "job")
    rest.put(
        path,
        {
            "apiVersion": names.api_version,
            "kind": "ComputeDomain",
            "metadata": {"name": "job", "namespace": "team", "uid": UID, "generation": 1},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-ch"}}},
        },
    )
    _domain(rest)  # one of our group, which this controller does not serve
    settings = ControllerSettings(namespace=NS, image="dradriver:test", names=names)
    Controller(rest, settings).sync()  # type: ignore[arg-type]
    assert rest.get(path)["metadata"]["finalizers"] == ["resource.nvidia.com/computeDomain"]
    assert "finalizers" not in rest.get(CD_PATH)["metadata"]
    workload = rest.get(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"))
    assert workload == api.workload_claim_template(rest.get(path), names) | {"metadata": workload["metadata"]}
    assert workload["metadata"]["labels"][names.domain_label] == UID
    daemon = rest.get(path_of("resource.k8s.io/v1", "resourceclaimtemplates", NS, f"computedomain-daemon-{UID}"))
    request = daemon["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "compute-domain-daemon.nvidia.com"
    pod = rest.get(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"resource.nvidia.com/computeDomain": UID}
    assert {"name": "DRADRIVER_COMPAT", "value": "nvidia"} in pod["containers"][0]["env"]
    assert rest.get(path)["status"]["status"] == "NotReady"


def _nvidias_objects(rest: FakeRest, uid: str) -> list[str]:
    """What NVIDIA's controller makes for domain ``uid`` (team/job): the workload and daemon claim templates and the
    IMEX DaemonSet, each with its label and its finalizer (and another's, which stays); their paths."""
    names = api.NVIDIA
    paths = [
        path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"),
        path_of("resource.k8s.io/v1", "resourceclaimtemplates", NS, f"computedomain-daemon-{uid}"),
        path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{uid}"),
    ]
    for path in paths:
        namespace, name = path.split("/")[-3], path.split("/")[-1]
        meta = {"name": name, "namespace": namespace, "labels": {names.domain_label: uid}}
        rest.put(path, {"metadata": meta | {"finalizers": [names.finalizer, "example.com/other"]}})
    return paths


@pytest.mark.parametrize("domain_left", [True, False], ids=["domain-deleted", "domain-vanished"])
def test_under_nvidias_names_objects_nvidias_controller_made_lose_its_finalizer_and_go(
    rest: FakeRest, domain_left: bool
) -> None:
    """NVIDIA's controller finalizes its templates and DaemonSets with resource.nvidia.com/computeDomain and takes
    it off itself before deleting them; adopted under --compat nvidia, ours takes it off too (and only it), so
    they do not stay Terminating, and the sweep does not DELETE them again every pass."""
    rest.finalizing = True
    names = api.NVIDIA
    path = path_of(names.api_version, "computedomains", "team", "job")
    if domain_left:
        meta = {"name": "job", "namespace": "team", "uid": UID, "finalizers": [names.finalizer]}
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        spec = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-ch"}}}
        rest.put(path, {"apiVersion": names.api_version, "kind": "ComputeDomain", "metadata": meta, "spec": spec})
    made = _nvidias_objects(rest, UID)
    for leftover in made:
        rest.delete(leftover)  # as a DELETE before ours ran would have left them: Terminating
    controller = Controller(rest, ControllerSettings(namespace=NS, image="dradriver:test", names=names))  # type: ignore[arg-type]
    controller.sync()
    for leftover in made:
        assert rest.get(leftover)["metadata"]["finalizers"] == ["example.com/other"]
    assert not rest.find(path)
    rest.writes.clear()
    controller.sync()  # still Terminating, held by another's finalizer: nothing of ours to do
    assert not rest.writes, rest.writes
    for leftover in made:  # what holds them now is another's; no more writes of ours
        rest.json_patch(leftover, [{"op": "remove", "path": "/metadata/finalizers/0"}])
    controller.sync()
    assert not any(rest.find(leftover) for leftover in made)
    assert not [write for write in rest.writes if write.startswith("DELETE")]


def test_daemon_pods_are_in_the_pod_network_unless_asked_and_get_the_extra_environment(rest: FakeRest) -> None:
    _domain(rest)
    Controller(rest, ControllerSettings(namespace=NS, image="dradriver:test")).sync()  # type: ignore[arg-type]
    plain = rest.get(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))["spec"]["template"]["spec"]
    assert "hostNetwork" not in plain
    # Unused peer names resolve in the hosts file (a sentinel address): no search-domain queries for the rest.
    assert plain["dnsConfig"] == {"options": [{"name": "ndots", "value": "1"}]}
    rest.delete(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))
    extra = {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}
    settings = ControllerSettings(namespace=NS, image="dradriver:test", daemon_host_network=True, daemon_env=(extra,))
    Controller(rest, settings).sync()  # type: ignore[arg-type]
    pod = rest.get(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    [container] = pod["containers"]
    assert container["env"][-1] == extra
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    # Longer than the kubelet's default of 1 s: the probe is a Python process running nvidia-imex-ctl.
    assert container["startupProbe"]["timeoutSeconds"] == container["readinessProbe"]["timeoutSeconds"] == 10


def test_a_second_pass_writes_nothing(rest: FakeRest, controller: Controller) -> None:
    _domain(rest)
    controller.sync()
    before = sum(rest.writes.values())
    controller.sync()
    assert sum(rest.writes.values()) == before


def test_daemons_are_numbered_lowest_free_and_keep_their_index(rest: FakeRest, controller: Controller) -> None:
    _domain(rest)
    controller.sync()
    for node in ("b", "a"):
        _daemon_pod(rest, node)
        _join(rest, node)
    controller.sync()
    indices = {d["nodeName"]: d["index"] for d in rest.get(CLIQUE_PATH)["daemons"]}
    assert indices == {"a": 0, "b": 1}
    # a goes, c comes: c takes the freed index 0, b keeps 1.
    rest.delete(path_of("v1", "pods", NS, "daemon-a"))
    _daemon_pod(rest, "ccc")
    _join(rest, "ccc")
    controller.sync()
    controller.sync()
    indices = {d["nodeName"]: d["index"] for d in rest.get(CLIQUE_PATH)["daemons"]}
    assert indices == {"b": 1, "ccc": 0}


def test_status_and_conditions_follow_the_daemons(rest: FakeRest, controller: Controller) -> None:
    _domain(rest, num_nodes=2)
    controller.sync()
    _daemon_pod(rest, "a")
    _join(rest, "a", "Ready")
    controller.sync()
    status = _status(rest)
    assert status["status"] == "NotReady"  # one of the two wanted
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["message"] == "1 of 1 IMEX daemons Ready (2 wanted)"
    assert conditions["DaemonsReady"]["status"] == "True"
    _daemon_pod(rest, "b")
    _join(rest, "b", "Ready")
    controller.sync()
    status = _status(rest)
    assert status["status"] == "Ready"
    assert [(n["name"], n["index"], n["status"]) for n in status["nodes"]] == [("a", 0, "Ready"), ("b", 1, "Ready")]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True", "DaemonsReady": "True"}


def test_a_daemon_on_a_node_without_a_clique_is_reported_from_its_pod(rest: FakeRest, controller: Controller) -> None:
    _domain(rest, num_nodes=1)
    controller.sync()
    _daemon_pod(rest, "plain", clique="")
    controller.sync()
    assert _status(rest)["nodes"] == [
        {"name": "plain", "ipAddress": "10.0.0.9", "cliqueID": "", "index": -1, "status": "Ready"}
    ]


def test_deletion_takes_everything_apart_without_waiting(rest: FakeRest, controller: Controller) -> None:
    _domain(rest)
    controller.sync()
    _daemon_pod(rest, "a")
    _join(rest, "a")
    node = path_of("v1", "nodes", None, "a")
    rest.put(node, {"metadata": {"name": "a", "labels": {api.DOMAIN_LABEL: UID, "keep": "me"}}})
    controller.sync()
    rest.merge_patch(CD_PATH, {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    controller.sync()
    assert rest.get(CD_PATH)["metadata"]["finalizers"] == []
    assert rest.get(node)["metadata"]["labels"] == {"keep": "me"}
    assert not rest.find(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))
    assert not rest.find(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"))
    assert not rest.find(CLIQUE_PATH)


def test_what_a_vanished_domain_left_is_swept(rest: FakeRest, controller: Controller) -> None:
    node = path_of("v1", "nodes", None, "a")
    rest.put(node, {"metadata": {"name": "a", "labels": {api.DOMAIN_LABEL: "gone"}}})
    controller.sync()
    assert rest.get(node)["metadata"]["labels"] == {}


def test_an_invalid_spec_is_reported_in_the_condition(rest: FakeRest, controller: Controller) -> None:
    rest.put(CD_PATH, {"metadata": {"name": "job", "namespace": "team", "uid": UID}, "spec": {"numNodes": 1}})
    controller.sync()
    ready = next(c for c in _status(rest)["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "channel" in ready["message"]


def test_a_node_that_moved_clique_is_dropped_from_its_old_one_and_listed_once(
    rest: FakeRest, controller: Controller
) -> None:
    """tray-a's fabric was re-registered into clique c2: its daemon pod now carries c2, its old entry in c must go
    (a node listed twice in status.nodes, a map by name, makes the API server refuse every status write)."""
    _domain(rest, num_nodes=1)
    controller.sync()
    _daemon_pod(rest, "a", clique="c")
    _join(rest, "a", "Ready")
    controller.sync()
    _daemon_pod(rest, "a", clique="c2")
    rest.apply(
        path_of(api.API_VERSION, "computedomaincliques", NS, f"{UID}.c2"),
        {
            "metadata": {"name": f"{UID}.c2", "namespace": NS,
                         "labels": {api.DOMAIN_LABEL: UID, api.CLIQUE_LABEL: "c2"}},
            "daemons": [{"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": "c2", "status": "Ready"}],
        },
        manager="cd-daemon-a",
    )  # fmt: skip
    controller.sync()
    assert rest.get(CLIQUE_PATH).get("daemons") == []
    assert [(n["name"], n["cliqueID"]) for n in _status(rest)["nodes"]] == [("a", "c2")]


def test_a_node_with_two_live_daemons_is_listed_once(rest: FakeRest, controller: Controller) -> None:
    _domain(rest, num_nodes=1)
    controller.sync()
    _daemon_pod(rest, "a", clique="")
    rest.put(
        path_of("v1", "pods", NS, "daemon-a-new"),
        {"metadata": {"name": "daemon-a-new", "labels": {api.DOMAIN_LABEL: UID, api.CLIQUE_LABEL: ""}},
         "spec": {"nodeName": "a"}, "status": {"podIP": "10.0.0.8"}},
    )  # fmt: skip
    controller.sync()
    assert [n["name"] for n in _status(rest)["nodes"]] == ["a"]


def _ready_condition(rest: FakeRest) -> dict[str, Any]:
    return next(c for c in _status(rest)["conditions"] if c["type"] == "Ready")


def test_a_template_of_that_name_not_made_for_the_domain_is_reported(rest: FakeRest, controller: Controller) -> None:
    rest.put(
        path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"),
        {"metadata": {"name": "job-ch", "namespace": "team"}, "spec": {}},
    )
    _domain(rest)
    controller.sync()
    ready = _ready_condition(rest)
    assert (ready["status"], ready["reason"]) == ("False", "CannotConverge")
    assert ready["message"] == (
        f"ResourceClaimTemplate team/job-ch exists but was not made for this ComputeDomain (no label "
        f"{api.DOMAIN_LABEL}={UID}): delete or rename that object, or recreate the ComputeDomain naming another "
        "spec.channel.resourceClaimTemplate.name"
    )
    # The DaemonSet and the daemon's template are made all the same; the status is not rewritten every pass, nor
    # is the taken name POSTed again: it is read until it goes.
    assert rest.find(path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}"))
    version = rest.get(CD_PATH)["metadata"].get("resourceVersion")
    writes = sum(rest.writes.values())
    controller.sync()
    assert rest.get(CD_PATH)["metadata"].get("resourceVersion") == version
    assert sum(rest.writes.values()) == writes
    # Once the other object is gone, the next pass makes the domain's own template.
    rest.delete(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"))
    controller.sync()
    made = rest.get(path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch"))
    assert made["metadata"]["labels"][api.DOMAIN_LABEL] == UID


def test_a_failed_create_is_reported_in_the_status(
    rest: FakeRest, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    create = rest.create

    def refuse_daemonsets(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if "/daemonsets" in path:
            raise ForbiddenError(f"POST {path}: HTTP 403: forbidden", status=403)
        return create(path, body)

    monkeypatch.setattr(rest, "create", refuse_daemonsets)
    _domain(rest)
    controller.sync()
    ready = _ready_condition(rest)
    assert ready["status"] == "False"
    assert ready["message"].startswith(f"creating DaemonSet {NS}/computedomain-daemon-{UID} failed (POST ")
    assert "HTTP 403" in ready["message"] and ready["message"].endswith("and its RBAC if it was refused")


def test_a_full_clique_is_reported_and_not_rewritten_every_pass(rest: FakeRest) -> None:
    controller = Controller(rest, ControllerSettings(namespace=NS, image="x", max_nodes_per_domain=1))  # type: ignore[arg-type]
    _domain(rest, num_nodes=2)
    controller.sync()
    for node in ("a", "b"):
        _daemon_pod(rest, node)
        _join(rest, node, "Ready")
    controller.sync()
    assert {d["nodeName"]: d.get("index") for d in rest.get(CLIQUE_PATH)["daemons"]} == {"a": 0, "b": None}
    assert _ready_condition(rest)["message"] == (
        f"clique {UID}.c is full: node b got no index (at most 1 daemons, --max-nodes-per-imex-domain); keep the "
        "job within that many nodes of one clique"
    )
    before = sum(rest.writes.values())
    controller.sync()
    assert sum(rest.writes.values()) == before


def _one_pass(controller: Controller, *, leading: bool = True) -> None:
    """Controller.run for exactly one turn of its loop (as the leader, or as a standby)."""
    stop = threading.Event()

    def lead() -> bool:
        stop.set()  # the loop ends after this turn
        return leading

    controller.run(stop, leading=lead, interval=0)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_metrics_count_passes_failed_reconciles_and_domains_by_status(
    rest: FakeRest, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    _domain(rest)
    passes, errors = _sample(PASSES_OK, outcome="ok"), _sample(RECONCILE_ERRORS, operation="converge")

    def refuse(path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        raise ForbiddenError(f"PATCH {path}: HTTP 403: forbidden", status=403)

    monkeypatch.setattr(rest, "json_patch", refuse)  # the finalizer cannot be added: the domain's reconcile fails
    _one_pass(controller)
    assert _sample(PASSES_OK, outcome="ok") == passes + 1
    assert _sample(RECONCILE_ERRORS, operation="converge") == errors + 1
    assert (_sample(DOMAINS, status="NotReady"), _sample(DOMAINS, status="Ready")) == (1, 0)


def test_a_pass_that_cannot_read_the_cluster_counts_as_an_error(
    rest: FakeRest, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _sample(PASSES_OK, outcome="error")

    def unreachable(path: str, **_: str) -> list[dict[str, Any]]:
        raise ApiUnavailableError(f"GET {path}: API server unreachable")

    monkeypatch.setattr(rest, "list", unreachable)
    _one_pass(controller)
    assert _sample(PASSES_OK, outcome="error") == failed + 1


def test_a_standby_reports_no_domains(rest: FakeRest, controller: Controller) -> None:
    _domain(rest)
    _one_pass(controller)
    assert _sample(DOMAINS, status="NotReady") == 1
    _one_pass(controller, leading=False)
    assert REGISTRY.get_sample_value(DOMAINS, {"status": "NotReady"}) is None  # the leader's figures only


def test_a_status_no_domain_has_any_more_leaves_the_domains_series(rest: FakeRest, controller: Controller) -> None:
    _domain(rest)
    domain = rest.get(CD_PATH)
    rest.put(CD_PATH, {**domain, "status": {"status": "Degraded"}})  # a status this controller never writes
    _one_pass(controller)  # counts what its snapshot found, and writes the domain's real status
    assert _sample(DOMAINS, status="Degraded") == 1
    _one_pass(controller)
    assert REGISTRY.get_sample_value(DOMAINS, {"status": "Degraded"}) is None


def test_liveness_fails_only_while_a_pass_makes_no_progress(
    rest: FakeRest, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dradriver.computedomain import controller as controller_module

    monkeypatch.setattr(controller_module, "STUCK_AFTER_SECONDS", -1.0)  # any pass in progress counts as stuck
    seen: list[bool] = []
    listing = rest.list

    def observed(path: str, **selectors: str) -> list[dict[str, Any]]:
        seen.append(controller.alive()[0])
        return listing(path, **selectors)

    monkeypatch.setattr(rest, "list", observed)
    assert controller.alive() == (True, {})
    _one_pass(controller)
    assert seen and not any(seen)
    assert controller.alive() == (True, {})
