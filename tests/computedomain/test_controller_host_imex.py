"""The ComputeDomain controller with ``--imex-mode hostManaged`` (issue #38 item 3, docs/computedomains.md
"Host-managed IMEX"): the workload claim template alone, the domain Ready once admitted, and what a domain left from
``driverManaged`` removed once no Node uses it; pass by pass and on informers, on the in-memory API server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.fake_rest import FakeRest

from dradriver.computedomain import api
from dradriver.computedomain.controller import HOST_MANAGED_REASON, Controller, ControllerSettings
from dradriver.computedomain.kube import path_of
from dradriver.computedomain.watching import WatchingController

NS = "dradriver"
UID = "uid-job"
CD_PATH = path_of(api.API_VERSION, "computedomains", "team", "job")
WORKLOAD = path_of("resource.k8s.io/v1", "resourceclaimtemplates", "team", "job-ch")
DAEMONSET = path_of("apps/v1", "daemonsets", NS, f"computedomain-daemon-{UID}")
DAEMON_TEMPLATE = path_of("resource.k8s.io/v1", "resourceclaimtemplates", NS, f"computedomain-daemon-{UID}")
CLIQUE = path_of(api.API_VERSION, "computedomaincliques", NS, f"{UID}.c")
NODE = path_of("v1", "nodes", None, "a")
DEADLINE = 15.0


@pytest.fixture
def rest() -> FakeRest:
    return FakeRest()


def _domain(rest: FakeRest, *, num_nodes: int = 2) -> None:
    rest.put(
        CD_PATH,
        {
            "apiVersion": api.API_VERSION,
            "kind": "ComputeDomain",
            "metadata": {"name": "job", "namespace": "team", "uid": UID, "generation": 1},
            "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": "job-ch"}}},
        },
    )


def _controller(rest: FakeRest, *, host_managed: bool = True) -> Controller:
    settings = ControllerSettings(namespace=NS, image="dradriver:test", host_managed=host_managed)
    return Controller(rest, settings)  # type: ignore[arg-type]


def _status(rest: FakeRest) -> dict[str, Any]:
    status: dict[str, Any] = rest.get(CD_PATH).get("status", {})
    return status


def _condition(rest: FakeRest, kind: str) -> dict[str, Any]:
    return next(c for c in _status(rest)["conditions"] if c["type"] == kind)


def _driver_managed_leftovers(rest: FakeRest) -> None:
    """A domain converged by a driverManaged controller, its daemon on node a (labelled, as the plugin does)."""
    _controller(rest, host_managed=False).sync()
    rest.apply(
        CLIQUE,
        {
            "metadata": {"name": f"{UID}.c", "namespace": NS, "labels": {api.DOMAIN_LABEL: UID}},
            "daemons": [{"nodeName": "a", "ipAddress": "10.0.0.1", "cliqueID": "c", "status": "Ready"}],
        },
        manager="cd-daemon-a",
    )
    rest.put(NODE, {"metadata": {"name": "a", "labels": {api.DOMAIN_LABEL: UID, "keep": "me"}}})
    assert rest.find(DAEMONSET) and rest.find(DAEMON_TEMPLATE)


def test_a_domain_gets_its_workload_template_no_daemonset_and_is_ready_once_admitted(rest: FakeRest) -> None:
    _domain(rest)
    _controller(rest).sync()
    assert rest.get(CD_PATH)["metadata"]["finalizers"] == [api.FINALIZER]
    config = rest.get(WORKLOAD)["spec"]["spec"]["devices"]["config"][0]["opaque"]
    assert config == {"driver": api.DRIVER_NAME, "parameters": api.channel_config(UID, "Single")}
    assert not rest.find(DAEMONSET) and not rest.find(DAEMON_TEMPLATE)
    assert not rest.list(path_of(api.API_VERSION, "computedomaincliques", NS))
    status = _status(rest)
    # Ready with no nodes listed although numNodes is 2: no daemon of its own reports; the hosts' are asked at prepare.
    assert (status["status"], status["nodes"]) == ("Ready", [])
    ready, daemons = _condition(rest, "Ready"), _condition(rest, "DaemonsReady")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", HOST_MANAGED_REASON, 1)
    assert "--imex-mode hostManaged" in ready["message"] and "answers READY" in ready["message"]
    assert (daemons["status"], daemons["reason"]) == ("True", HOST_MANAGED_REASON)


def test_a_second_pass_writes_nothing(rest: FakeRest) -> None:
    _domain(rest)
    controller = _controller(rest)
    controller.sync()
    before = sum(rest.writes.values())
    controller.sync()
    assert sum(rest.writes.values()) == before


def test_a_workload_template_name_taken_keeps_the_domain_not_ready_saying_why(rest: FakeRest) -> None:
    rest.put(WORKLOAD, {"kind": "ResourceClaimTemplate", "metadata": {"name": "job-ch", "namespace": "team"}})
    _domain(rest)
    _controller(rest).sync()
    ready = _condition(rest, "Ready")
    assert (_status(rest)["status"], ready["status"], ready["reason"]) == ("NotReady", "False", "CannotConverge")
    assert "exists but was not made for this ComputeDomain" in ready["message"]


def test_an_invalid_spec_is_reported_as_in_driver_managed_mode(rest: FakeRest) -> None:
    rest.put(CD_PATH, {"metadata": {"name": "job", "namespace": "team", "uid": UID}, "spec": {"numNodes": 1}})
    _controller(rest).sync()
    ready = _condition(rest, "Ready")
    assert (_status(rest)["status"], ready["reason"]) == ("NotReady", "InvalidSpec")


def test_deletion_removes_the_template_and_the_finalizer(rest: FakeRest) -> None:
    _domain(rest)
    controller = _controller(rest)
    controller.sync()
    rest.merge_patch(CD_PATH, {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    controller.sync()
    assert rest.get(CD_PATH)["metadata"]["finalizers"] == []
    assert not rest.find(WORKLOAD)


def test_daemons_left_from_driver_managed_stay_while_a_node_uses_them_then_go(rest: FakeRest) -> None:
    _domain(rest)
    _driver_managed_leftovers(rest)
    controller = _controller(rest)
    controller.sync()
    # Node a still runs a workload whose channel the domain's own daemon serves: nothing of it is touched.
    assert rest.find(DAEMONSET) and rest.find(DAEMON_TEMPLATE) and rest.find(CLIQUE)
    assert rest.get(NODE)["metadata"]["labels"][api.DOMAIN_LABEL] == UID
    ready = _condition(rest, "Ready")
    assert ready["status"] == "True" and "stays until node(s) a unprepare" in ready["message"], ready
    assert _status(rest)["nodes"] == []
    # The plugin unlabels the node at that claim's unprepare: the daemon is idle, and goes.
    rest.merge_patch(NODE, {"metadata": {"labels": {api.DOMAIN_LABEL: None}}})
    controller.sync()
    assert not rest.find(DAEMONSET) and not rest.find(DAEMON_TEMPLATE) and not rest.find(CLIQUE)
    assert rest.find(WORKLOAD) and rest.get(NODE)["metadata"]["labels"] == {"keep": "me"}
    assert "stays until" not in _condition(rest, "Ready")["message"]


def test_a_labelled_node_without_a_daemonset_left_holds_nothing_back(rest: FakeRest) -> None:
    _domain(rest)
    _driver_managed_leftovers(rest)
    rest.delete(DAEMONSET)
    _controller(rest).sync()
    assert not rest.find(DAEMON_TEMPLATE) and not rest.find(CLIQUE)
    assert "stays until" not in _condition(rest, "Ready")["message"]


def test_a_daemonset_of_that_name_not_made_for_the_domain_is_never_deleted(rest: FakeRest) -> None:
    rest.put(DAEMONSET, {"kind": "DaemonSet", "metadata": {"name": f"computedomain-daemon-{UID}", "namespace": NS}})
    _domain(rest)
    _controller(rest).sync()
    assert rest.find(DAEMONSET)
    assert _status(rest)["status"] == "Ready"


def _wait(what: str, condition: Callable[[], Any]) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_on_informers_a_domain_goes_ready_and_the_unlabelled_node_ends_the_leftover_daemonset(rest: FakeRest) -> None:
    _domain(rest)
    _driver_managed_leftovers(rest)
    watching = WatchingController(_controller(rest), rest)
    stop = threading.Event()
    thread = threading.Thread(target=watching.run, args=(stop,), kwargs={"leading": lambda: True})
    thread.start()
    try:
        _wait("the domain Ready", lambda: _status(rest).get("status") == "Ready")
        assert rest.find(DAEMONSET)
        # The node's label going is an event of the node informer: it brings the domain back, and the DaemonSet goes.
        rest.merge_patch(NODE, {"metadata": {"labels": {api.DOMAIN_LABEL: None}}})
        _wait("the leftover DaemonSet removed", lambda: not rest.find(DAEMONSET) and not rest.find(CLIQUE))
        assert not rest.find(DAEMON_TEMPLATE) and rest.find(WORKLOAD)
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
