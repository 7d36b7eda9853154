"""KubeletPlugin over real unix sockets, driven by the kubelet stand-in."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.kubelet_plugin_fakes import CDI_VENDOR, DRIVER, FakeClaimSource, FakeHandler, make_claim

from dradriver.api.generated import pluginregistration_v1_pb2
from dradriver.errors import ConfigError
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, RegistrationRejected, discover
from dradriver.plugin.kubeletplugin.lifecycle import AlreadyRunningError, StopBudget
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin

from .conftest import PluginFactory

TIMEOUT = 10.0


def wait_for(condition: object, timeout: float = TIMEOUT) -> bool:
    """Poll ``condition()`` until true or ``timeout``; returns its last value."""
    ready = threading.Event()
    deadline = threading.Timer(timeout, ready.set)
    deadline.start()
    try:
        while not condition():  # type: ignore[operator]
            if ready.wait(0.01):
                return bool(condition())  # type: ignore[operator]
        return True
    finally:
        deadline.cancel()


def test_get_info_advertises_driver_endpoint_and_services(plugin: KubeletPlugin, kubelet: KubeletClient) -> None:
    [reg] = discover(kubelet.registry_dir)
    assert reg == plugin.registration_socket
    assert reg.name == f"{DRIVER}-reg.sock"
    info = kubelet.get_info(reg)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.plugin_dir / "dra.sock")
    assert Path(info.endpoint).is_absolute()
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_health_is_not_advertised_without_a_health_source(make_plugin: PluginFactory, kubelet: KubeletClient) -> None:
    plugin = make_plugin(health_source=None)
    plugin.start()
    info = kubelet.get_info(plugin.registration_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def test_registration_handshake_picks_v1_and_records_success(plugin: KubeletPlugin, kubelet: KubeletClient) -> None:
    with kubelet.register() as registered:
        assert registered.version == "v1.DRAPlugin"
    status = plugin.registration.wait_for_reports(1, TIMEOUT)
    assert status is not None and status.registered


def test_an_older_kubelet_picks_v1beta1(plugin: KubeletPlugin, sock_dir: Path) -> None:
    old = KubeletClient(sock_dir / "registry", supported_versions=["v1beta1.DRAPlugin"])
    with old.register() as registered:
        assert registered.version == "v1beta1.DRAPlugin"


def test_rejected_registration_is_logged_and_a_retry_succeeds(
    plugin: KubeletPlugin, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dradriver.plugin.kubeletplugin.registration")
    picky = KubeletClient(sock_dir / "registry", supported_versions=["v2.DRAPlugin"])
    with pytest.raises(RegistrationRejected):
        picky.register()
    status = plugin.registration.wait_for_reports(1, TIMEOUT)
    assert status is not None and not status.registered
    assert "none of the plugin's versions" in caplog.text and DRIVER in caplog.text
    # The plugin keeps serving: the kubelet's next attempt works.
    with KubeletClient(sock_dir / "registry").register() as registered:
        assert registered.version == "v1.DRAPlugin"
    status = plugin.registration.wait_for_reports(2, TIMEOUT)
    assert status is not None and status.registered


@pytest.mark.parametrize("versions", [["v1.DRAPlugin"], ["v1beta1.DRAPlugin"]], ids=["v1", "v1beta1"])
def test_prepare_and_unprepare_over_each_version(
    plugin: KubeletPlugin, sock_dir: Path, claims: FakeClaimSource, handler: FakeHandler, versions: list[str]
) -> None:
    share = "4f0a51b3-6c1f-4d0e-9c8e-2b7f3f7b9a10"
    claims.add(
        make_claim(
            "a",
            "uid-a",
            results=[
                {"request": "gpu/large", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": share},
                {"request": "other", "driver": "nic.example.com", "pool": "node-a", "device": "nic-0"},
            ],
        )
    )
    claims.add(make_claim("b", "uid-b", allocated=False))
    with KubeletClient(sock_dir / "registry", supported_versions=versions).register() as kubelet:
        result = kubelet.prepare([Claim("default", "a", "uid-a"), Claim("default", "b", "uid-b")])
        assert set(result) == {"uid-a", "uid-b"}
        assert result["uid-a"].error == ""
        expected = {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-0",
            "cdi_device_ids": [f"{CDI_VENDOR}=uid-a-gpu-0"],
        }
        if versions == ["v1.DRAPlugin"]:
            expected["share_id"] = share
        assert result["uid-a"].devices == [expected]
        assert "not allocated" in result["uid-b"].error
        handler.unprepare_errors = {"uid-b": "nothing to undo went wrong"}
        assert kubelet.unprepare([Claim("default", "a", "uid-a"), Claim("default", "b", "uid-b")]) == {
            "uid-a": "",
            "uid-b": "nothing to undo went wrong",
        }


def test_v1_leaves_share_id_unset_when_the_device_has_none(
    plugin: KubeletPlugin, kubelet: KubeletClient, claims: FakeClaimSource
) -> None:
    claims.add(make_claim("a", "uid-a"))
    with kubelet.register() as registered:
        [device] = registered.prepare([Claim("default", "a", "uid-a")])["uid-a"].devices
    assert "share_id" not in device


def test_handler_exception_does_not_break_the_server(
    plugin: KubeletPlugin, kubelet: KubeletClient, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    claims.add(make_claim("a", "uid-a"))
    claims.add(make_claim("b", "uid-b"))
    handler.raise_for = {"uid-a"}
    with kubelet.register() as registered:
        result = registered.prepare([Claim("default", "a", "uid-a"), Claim("default", "b", "uid-b")])
        assert "simulated driver failure" in result["uid-a"].error
        assert result["uid-b"].error == "" and result["uid-b"].devices
        handler.raise_for = set()
        assert registered.prepare([Claim("default", "a", "uid-a")])["uid-a"].error == ""


def test_a_huge_batch_is_answered_over_grpc(plugin: KubeletPlugin, kubelet: KubeletClient) -> None:
    batch = [Claim("default", f"claim-{i}", f"uid-{i:05d}-{'x' * 100}") for i in range(20000)]
    with kubelet.register() as registered:
        result = registered.prepare(batch)
    assert len(result) == 20000
    assert all("cannot get claim" in entry.error for entry in result.values())


def test_claims_of_different_uids_are_prepared_concurrently(
    plugin: KubeletPlugin, kubelet: KubeletClient, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    claims.add(make_claim("a", "uid-a"))
    claims.add(make_claim("b", "uid-b"))
    gate = threading.Event()
    handler.gates = {"uid-a": gate}
    with kubelet.register() as registered:
        blocked = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert handler.wait_until_inside("uid-a")
        # uid-a is still inside the handler, yet uid-b goes through.
        assert registered.prepare([Claim("default", "b", "uid-b")])["uid-b"].error == ""
        assert handler.max_calls_inside == 2
        gate.set()
        assert blocked.result(TIMEOUT).claims["uid-a"].error == ""


def test_calls_for_the_same_claim_are_serialised(
    plugin: KubeletPlugin, kubelet: KubeletClient, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    claims.add(make_claim("a", "uid-a"))
    gate = threading.Event()
    handler.gates = {"uid-a": gate}
    with kubelet.register() as registered:
        first = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert handler.wait_until_inside("uid-a")
        second = registered.prepare_future([Claim("default", "a", "uid-a")])
        # The second call has reached the lock and waits there while the first is inside the handler.
        assert plugin.claim_locks.wait_until_waiting("uid-a", 1, TIMEOUT)
        assert len(handler.prepare_batches) == 1
        gate.set()
        assert first.result(TIMEOUT).claims["uid-a"].error == ""
        assert second.result(TIMEOUT).claims["uid-a"].error == ""
    assert len(handler.prepare_batches) == 2
    assert handler.max_inside_per_uid == 1


def test_unknown_methods_get_unimplemented(plugin: KubeletPlugin) -> None:
    for path in (plugin.dra_socket, plugin.registration_socket):
        with grpc.insecure_channel(f"unix:{path}") as channel:
            call = channel.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeFrobnicate",
                request_serializer=lambda _: b"",
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError, match="UNIMPLEMENTED") as err:
                call(None, timeout=TIMEOUT)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_dra_socket_serves_before_the_registration_socket_appears(make_plugin: PluginFactory, sock_dir: Path) -> None:
    plugin = make_plugin()
    registry = sock_dir / "registry"
    registry.mkdir()
    outcome: list[object] = []

    def kubelet_watching() -> None:
        # Like the kubelet's inotify watcher: act the moment the socket exists.
        wait_for(lambda: discover(registry))
        info = KubeletClient(registry).get_info(discover(registry)[0])
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=0.5)
                outcome.append("ready")
            except grpc.FutureTimeoutError as err:
                outcome.append(err)

    watcher = threading.Thread(target=kubelet_watching)
    watcher.start()
    plugin.start()
    watcher.join(TIMEOUT)
    assert outcome == ["ready"]


def test_stale_socket_files_are_replaced(make_plugin: PluginFactory, sock_dir: Path, kubelet: KubeletClient) -> None:
    plugin = make_plugin()
    for path in (plugin.dra_socket, plugin.registration_socket):
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()  # a socket file nobody listens on, as a crashed process leaves it
    (plugin.plugin_dir / "plugin.lock").write_text("12345\n")  # the lock's old PID does not matter
    plugin.start()
    with kubelet.register() as registered:
        assert registered.prepare([]) == {}


def test_a_second_instance_is_refused_with_the_lock_and_pid(
    plugin: KubeletPlugin, make_plugin: PluginFactory, kubelet: KubeletClient
) -> None:
    second = make_plugin()
    with pytest.raises(AlreadyRunningError) as err:
        second.start()
    message = str(err.value)
    assert str(plugin.plugin_dir / "plugin.lock") in message
    assert f"PID {os.getpid()}" in message
    assert DRIVER in message and "node-a" in message
    # The refused instance touched nothing of the running one.
    with kubelet.register() as registered:
        assert registered.prepare([]) == {}


def test_the_registration_socket_is_recreated_after_deletion(plugin: KubeletPlugin, kubelet: KubeletClient) -> None:
    plugin.registration_socket.unlink()
    assert wait_for(plugin.registration_socket.exists)
    with kubelet.register() as registered:
        assert registered.version == "v1.DRAPlugin"


def test_the_registration_socket_is_recreated_when_the_registry_directory_is(
    plugin: KubeletPlugin, kubelet: KubeletClient
) -> None:
    shutil.rmtree(plugin.registry_dir)
    plugin.registry_dir.mkdir()
    assert wait_for(lambda: discover(plugin.registry_dir) == [plugin.registration_socket])
    with kubelet.register() as registered:
        assert registered.version == "v1.DRAPlugin"


def test_stop_removes_both_sockets_and_releases_the_lock(make_plugin: PluginFactory) -> None:
    plugin = make_plugin()
    plugin.start()
    plugin.stop()
    assert not plugin.registration_socket.exists()
    assert not plugin.dra_socket.exists()
    plugin.stop()  # a second stop is harmless
    again = make_plugin()
    again.start()
    assert again.dra_socket.exists()


def test_stop_removes_the_registration_socket_before_the_dra_server_stops(
    make_plugin: PluginFactory, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    plugin = make_plugin(stop_grace=TIMEOUT)
    plugin.start()
    claims.add(make_claim("a", "uid-a"))
    gate = threading.Event()
    handler.gates = {"uid-a": gate}
    kubelet = KubeletClient(plugin.registry_dir)
    with kubelet.register() as registered:
        in_flight = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert handler.wait_until_inside("uid-a")
        stopper = threading.Thread(target=plugin.stop)
        stopper.start()
        # The plugin is deregistered while a DRA call is still in flight, and that call still completes.
        assert wait_for(lambda: not plugin.registration_socket.exists())
        assert handler.inside["uid-a"] == 1
        gate.set()
        assert in_flight.result(TIMEOUT).claims["uid-a"].error == ""
        stopper.join(TIMEOUT)
    assert not plugin.dra_socket.exists()


def test_stop_keeps_the_instance_lock_until_a_call_cancelled_by_the_grace_period_leaves_the_handler(
    make_plugin: PluginFactory, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    # gRPC cancels the kubelet's call after the grace period, but the handler's thread runs on: the lock must
    # not pass to a new instance (which would reconcile the checkpoint) while the old one still prepares.
    plugin = make_plugin(stop_grace=0.05)
    plugin.start()
    claims.add(make_claim("a", "uid-a"))
    gate = threading.Event()
    handler.gates = {"uid-a": gate}
    with KubeletClient(plugin.registry_dir).register() as registered:
        in_flight = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert handler.wait_until_inside("uid-a")
        stopper = threading.Thread(target=plugin.stop)
        stopper.start()
        with pytest.raises(grpc.RpcError, match=r"(?s)UNAVAILABLE.*Cancelling all calls"):  # gRPC's server stopped
            in_flight.result(TIMEOUT)
        with pytest.raises(AlreadyRunningError):
            make_plugin().start()
        gate.set()
        stopper.join(TIMEOUT)
    assert not stopper.is_alive()
    make_plugin().start()


class _BlockingClaimSource(FakeClaimSource):
    """A claim source whose GETs wait for ``release``; ``entered`` is set when one is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.entered.set()
        assert self.release.wait(TIMEOUT)
        return super().get_resource_claim(namespace, name)


def test_a_prepare_still_fetching_its_claim_when_the_plugin_stops_keeps_the_instance_lock(
    make_plugin: PluginFactory,
) -> None:
    source = _BlockingClaimSource()
    source.add(make_claim("a", "uid-a"))
    plugin = make_plugin(claim_source=source, stop_grace=0.05)
    plugin.start()
    with KubeletClient(plugin.registry_dir).register() as registered:
        in_flight = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert source.entered.wait(TIMEOUT)
        stopper = threading.Thread(target=plugin.stop)
        stopper.start()
        with pytest.raises(grpc.RpcError, match=r"(?s)UNAVAILABLE.*Cancelling all calls"):  # gRPC's server stopped
            in_flight.result(TIMEOUT)
        with pytest.raises(AlreadyRunningError):
            make_plugin().start()
        source.release.set()
        stopper.join(TIMEOUT)
    assert not stopper.is_alive()
    make_plugin().start()


def test_bad_options_are_config_errors(make_plugin: PluginFactory, sock_dir: Path) -> None:
    with pytest.raises(ConfigError, match="driver name 'GPU_driver' is not a lower-case DNS subdomain"):
        make_plugin(driver_name="GPU_driver")
    with pytest.raises(ConfigError, match="must be positive"):
        make_plugin(health_interval=0)
    deep = sock_dir / ("d" * 120)
    with pytest.raises(ConfigError, match="more than the 107 a unix socket address can hold"):
        make_plugin(plugin_dir=deep).start()


@pytest.mark.parametrize("which", ["plugin_dir", "registry_dir"])
def test_an_unusable_directory_is_a_config_error_naming_it(
    make_plugin: PluginFactory, sock_dir: Path, which: str
) -> None:
    blocker = sock_dir / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(ConfigError, match=re.escape(str(blocker / "sub")) + ".*Not a directory"):
        make_plugin(**{which: blocker / "sub"}).start()


def test_an_unwritable_lock_file_is_a_config_error_naming_it(make_plugin: PluginFactory, sock_dir: Path) -> None:
    (sock_dir / "plugin" / "plugin.lock").mkdir(parents=True)  # a directory cannot be opened for writing
    with pytest.raises(ConfigError, match=r"lock file .*plugin\.lock"):
        make_plugin().start()


def test_get_info_answers_the_raw_protobuf(plugin: KubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix:{plugin.registration_socket}") as channel:
        raw = channel.unary_unary("/pluginregistration.Registration/GetInfo")(b"", timeout=TIMEOUT)
    info = pluginregistration_v1_pb2.PluginInfo.FromString(raw)
    assert info.name == DRIVER


def test_run_until_serves_until_the_event_is_set(make_plugin: PluginFactory, kubelet: KubeletClient) -> None:
    plugin = make_plugin()
    stop = threading.Event()
    runner = threading.Thread(target=plugin.run_until, args=(stop,))
    runner.start()
    assert wait_for(lambda: discover(plugin.registry_dir))
    with kubelet.register() as registered:
        assert registered.prepare([]) == {}
    stop.set()
    runner.join(TIMEOUT)
    assert not runner.is_alive()
    assert not plugin.registration_socket.exists()


def test_sockets_are_owner_only(plugin: KubeletPlugin) -> None:
    import stat

    for path in (plugin.dra_socket, plugin.registration_socket):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and mode & 0o077 == 0, f"{path}: {oct(mode)}"


def test_a_failure_injected_after_the_claim_get_is_that_claims_error(
    plugin: KubeletPlugin, claims: FakeClaimSource, handler: FakeHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dradriver import faults

    claims.add(
        make_claim("a", "uid-a", results=[{"request": "r", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}])
    )
    monkeypatch.setenv(faults.CRASH_ENV, "claim-fetched=fail")
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        error = kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"].error
        assert "injected failure at claim-fetched" in error
        monkeypatch.delenv(faults.CRASH_ENV)
        assert kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"].error == ""


def test_stop_ends_within_its_budget_even_with_a_call_stuck_in_the_handler(
    make_plugin: PluginFactory, claims: FakeClaimSource, handler: FakeHandler
) -> None:
    """Kubernetes kills the pod terminationGracePeriodSeconds after SIGTERM: stop must not wait longer than it was
    given (here nothing at all), even though the grace and drain periods alone are 25 s."""
    plugin = make_plugin(stop_grace=5.0, stop_drain=20.0)
    plugin.start()
    claims.add(make_claim("a", "uid-a"))
    gate = threading.Event()
    handler.gates = {"uid-a": gate}
    with KubeletClient(plugin.registry_dir).register() as registered:
        in_flight = registered.prepare_future([Claim("default", "a", "uid-a")])
        assert handler.wait_until_inside("uid-a")
        stopper = threading.Thread(target=plugin.stop, kwargs={"budget": StopBudget(0.0)})
        stopper.start()
        stopper.join(TIMEOUT)  # far less than the 25 s the plugin's own periods allow
        assert not stopper.is_alive()
        gate.set()
        with pytest.raises(grpc.RpcError, match=r"(?s)UNAVAILABLE.*Cancelling all calls"):  # gRPC's server stopped
            in_flight.result(TIMEOUT)
    assert not plugin.dra_socket.exists()


def test_a_stop_budget_is_shared_by_the_steps_and_caps_each():
    now = [100.0]
    budget = StopBudget(25.0, clock=lambda: now[0])
    assert budget.left() == 25.0
    assert budget.left(5.0) == 5.0  # a step's own limit when there is more left
    now[0] += 22.0
    assert budget.left(5.0) == 3.0  # what is left when that is less
    now[0] += 10.0
    assert budget.left() == 0.0 and budget.left(5.0) == 0.0


@pytest.mark.parametrize("pod_uid", [None, "pod-1"], ids=["fixed-names", "rolling-update"])
def test_a_plugin_directory_deleted_under_the_plugin_comes_back_with_its_socket_lock_and_registration(
    make_plugin: PluginFactory, claims: FakeClaimSource, caplog: pytest.LogCaptureFixture, pod_uid: str | None
) -> None:
    plugin = make_plugin(pod_uid=pod_uid)
    plugin.start()
    caplog.set_level(logging.INFO, logger="dradriver.plugin.kubeletplugin.plugin")
    claims.add(make_claim("a", "uid-a"))
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        assert kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"].error == ""
    caplog.clear()
    shutil.rmtree(plugin.plugin_dir)
    # Both sockets are re-created (the registration socket anew, so the kubelet registers the new endpoint).
    assert wait_for(lambda: "created registration socket" in caplog.text and plugin.dra_socket.is_socket())
    assert "DRA socket is gone" in caplog.text and "serving DRA services again" in caplog.text
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        assert kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"].error == ""
    assert plugin.registration.wait_for_reports(2, TIMEOUT) is not None
    # The instance lock was taken again on the new file(s): a second instance is still refused.
    with pytest.raises(AlreadyRunningError):
        make_plugin(pod_uid=pod_uid).start()
    with pytest.raises(AlreadyRunningError):
        make_plugin(pod_uid="pod-2" if pod_uid is None else None).start()


def test_a_restarted_kubelet_that_removed_the_registration_socket_re_dials_and_re_sent_prepares_agree(
    plugin: KubeletPlugin, claims: FakeClaimSource
) -> None:
    claims.add(make_claim("a", "uid-a"))
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        before = kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"]
    plugin.registration_socket.unlink()  # the kubelet restarting cleans its registry directory
    assert wait_for(plugin.registration_socket.is_socket)
    with KubeletClient(plugin.registry_dir).register() as restarted:
        assert restarted.prepare([Claim("default", "a", "uid-a")])["uid-a"] == before
    status = plugin.registration.wait_for_reports(2, TIMEOUT)
    assert status is not None and status.registered


def test_a_failing_write_back_after_the_plugin_directory_came_back_is_retried_and_the_plugin_registers_again(
    make_plugin: PluginFactory, claims: FakeClaimSource, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's write-back (its checkpoint) may fail once, e.g. on a full disk: it is called again at the next
    check until it works, and the registration socket is re-created all the same."""
    calls: list[int] = []
    written = threading.Event()

    def write_back() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        written.set()

    plugin = make_plugin(on_plugin_dir_recreated=write_back)
    plugin.start()
    caplog.set_level(logging.INFO, logger="dradriver.plugin.kubeletplugin.plugin")
    caplog.clear()
    shutil.rmtree(plugin.plugin_dir)
    assert written.wait(TIMEOUT), f"the write-back was not tried again after failing (calls: {len(calls)})"
    assert wait_for(lambda: "created registration socket" in caplog.text)
    claims.add(make_claim("a", "uid-a"))
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        assert kubelet.prepare([Claim("default", "a", "uid-a")])["uid-a"].error == ""
    assert len(calls) == 2


def test_a_second_start_changes_nothing_and_one_stop_ends_every_thread_and_socket(make_plugin: PluginFactory) -> None:
    before = set(threading.enumerate())
    plugin = make_plugin()
    plugin.start()
    sockets = {path: path.stat().st_ino for path in (plugin.dra_socket, plugin.registration_socket)}
    plugin.start()
    assert {path: path.stat().st_ino for path in sockets} == sockets  # the serving sockets were not replaced
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        assert kubelet.prepare([]) == {}
    plugin.stop()
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
    assert [t for t in set(threading.enumerate()) - before if t.name == "socket-watcher"] == []


def test_stop_bounds_its_wait_for_a_stuck_socket_check_by_the_budget(
    make_plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A socket check that hangs (here the driver's write-back after the plugin directory came back) must not
    hold a stop beyond its budget: the stop goes on and says the watcher did not stop."""
    inside, release = threading.Event(), threading.Event()

    def stuck_write_back() -> None:
        inside.set()
        release.wait(TIMEOUT)

    plugin = make_plugin(on_plugin_dir_recreated=stuck_write_back)
    plugin.start()
    try:
        shutil.rmtree(plugin.plugin_dir)
        assert inside.wait(TIMEOUT)
        caplog.set_level(logging.WARNING, logger="dradriver.plugin.kubeletplugin.plugin")
        stopper = threading.Thread(target=plugin.stop, kwargs={"budget": StopBudget(0.2)})
        stopper.start()
        stopper.join(TIMEOUT)
        assert not stopper.is_alive()
        assert "socket watcher did not stop" in caplog.text
        assert not plugin.registration_socket.exists()
    finally:
        release.set()


def test_a_socket_re_created_while_the_plugin_stops_is_not_left_serving(
    make_plugin: PluginFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher re-creating the DRA socket (the plugin directory deleted) when a stop that could not wait for
    it goes on: the new server must not outlive the stop, serving on a socket no instance lock covers."""
    inside, release = threading.Event(), threading.Event()
    plugin = make_plugin()
    plugin.start()
    real_add = plugin._add_dra_services

    def slow_add(server: Any) -> None:  # the re-creation's new server, held until the stop has gone on
        inside.set()
        release.wait(TIMEOUT)
        real_add(server)

    monkeypatch.setattr(plugin, "_add_dra_services", slow_add)
    try:
        shutil.rmtree(plugin.plugin_dir)
        assert inside.wait(TIMEOUT)
        plugin.stop(budget=StopBudget(0.2))
    finally:
        release.set()
    assert wait_for(lambda: not any(t.name == "socket-watcher" for t in threading.enumerate()))
    assert not plugin.dra_socket.exists()
    assert not plugin.registration_socket.exists()
