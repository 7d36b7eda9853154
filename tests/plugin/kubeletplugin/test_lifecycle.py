"""The instance lock in both modes, the rolling-update socket names, and the socket server and watcher."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest

from dradriver.plugin.kubeletplugin import lifecycle
from dradriver.plugin.kubeletplugin.lifecycle import (
    MAX_SOCKET_PATH_BYTES,
    AlreadyRunningError,
    InstanceLock,
    SocketServer,
)
from dradriver.plugin.kubeletplugin.plugin import rolling_update_dra_socket, rolling_update_registration_socket


def test_fixed_name_instances_exclude_each_other(tmp_path: Path) -> None:
    first = InstanceLock(tmp_path / "plugin.lock")
    first.acquire("driver d")
    with pytest.raises(AlreadyRunningError, match="PID"):
        InstanceLock(tmp_path / "plugin.lock").acquire("driver d")
    first.release()
    InstanceLock(tmp_path / "plugin.lock").acquire("driver d")


def test_pods_of_a_rolling_update_overlap_but_a_pod_runs_once(tmp_path: Path) -> None:
    old = InstanceLock(tmp_path / "plugin.lock", pod_uid="uid-old")
    new = InstanceLock(tmp_path / "plugin.lock", pod_uid="uid-new")
    old.acquire("driver d")
    new.acquire("driver d")
    with pytest.raises(AlreadyRunningError, match="another process of pod uid-new"):
        InstanceLock(tmp_path / "plugin.lock", pod_uid="uid-new").acquire("driver d")
    old.release()
    assert not (tmp_path / "plugin-uid-old.lock").exists()  # updates leave no files behind
    new.release()


def test_fixed_and_per_pod_names_never_mix(tmp_path: Path) -> None:
    rolling = InstanceLock(tmp_path / "plugin.lock", pod_uid="uid-a")
    rolling.acquire("driver d")
    with pytest.raises(AlreadyRunningError, match="rolling-update"):
        InstanceLock(tmp_path / "plugin.lock").acquire("driver d")
    rolling.release()
    fixed = InstanceLock(tmp_path / "plugin.lock")
    fixed.acquire("driver d")
    late = InstanceLock(tmp_path / "plugin.lock", pod_uid="uid-b")
    with pytest.raises(AlreadyRunningError, match="without a pod UID"):
        late.acquire("driver d")
    assert not (tmp_path / "plugin-uid-b.lock").exists() or late.release() is None
    fixed.release()
    late.acquire("driver d")  # a failed attempt held nothing
    late.release()


def test_registration_socket_names_fall_back_to_a_hash_when_too_long() -> None:
    uid = "6b0e3b9c-2f0e-4a9e-8f5e-1c2d3e4f5a6b"
    short = rolling_update_registration_socket(Path("/var/lib/kubelet/plugins_registry"), "gpu.dradriver.dev", uid)
    assert short.name == f"gpu.dradriver.dev-{uid}-reg.sock"
    deep = Path("/" + "d" * 50)
    hashed = rolling_update_registration_socket(deep, "gpu.dradriver.dev", uid)
    assert hashed.name.startswith("gpu.dradriver.dev-") and uid not in hashed.name
    assert len(bytes(hashed)) <= MAX_SOCKET_PATH_BYTES
    deeper = Path("/" + "d" * 72)
    last = rolling_update_registration_socket(deeper, "gpu.dradriver.dev", uid)
    assert last.name.startswith("dra-") and len(last.name) == len("dra-") + 16 + len("-reg.sock")
    assert "/" not in last.name and "+" not in last.name


def test_dra_socket_names_fall_back_to_a_hash_when_too_long() -> None:
    uid = "6b0e3b9c-2f0e-4a9e-8f5e-1c2d3e4f5a6b"
    short = rolling_update_dra_socket(Path("/var/lib/kubelet/plugins/compute-domain.dradriver.dev"), uid)
    assert short.name == f"dra-{uid}.sock"
    # The node tests' kubelet root with the second driver's directory: 110 bytes with the UID.
    deep = Path("/tmp/dra-n-jqy3lb68/kubelet/plugins/compute-domain.dradriver.dev")
    hashed = rolling_update_dra_socket(deep, uid)
    assert hashed.name.startswith("dra-") and uid not in hashed.name and len(hashed.name) == len("dra-.sock") + 16
    assert len(bytes(hashed)) <= MAX_SOCKET_PATH_BYTES
    assert rolling_update_dra_socket(deep, uid) == hashed  # stable: the same pod finds its socket again


class _Recorder:
    """A handler that records how many calls run at once."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def _call(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.entered.set()
        self.release.wait(5)
        with self.lock:
            self.running -= 1

    def prepare_resource_claims(self, claims):  # type: ignore[no-untyped-def]
        self._call()
        return {c["metadata"]["uid"]: None for c in claims}

    def unprepare_resource_claims(self, claims):  # type: ignore[no-untyped-def]
        self._call()
        return {c.uid: None for c in claims}


def test_instances_of_a_rolling_update_never_prepare_at_the_same_time(tmp_path: Path) -> None:
    import threading

    from dradriver.plugin.handler import ClaimRef
    from dradriver.plugin.kubeletplugin.lifecycle import SerializedHandler

    recorder = _Recorder()
    old = SerializedHandler(recorder, tmp_path / "serialize.lock")
    new = SerializedHandler(recorder, tmp_path / "serialize.lock")
    first = threading.Thread(target=old.prepare_resource_claims, args=([{"metadata": {"uid": "a"}}],))
    first.start()
    assert recorder.entered.wait(5)
    second = threading.Thread(target=new.unprepare_resource_claims, args=([ClaimRef("ns", "b", "b")],))
    second.start()
    second.join(0.3)  # bounded wait: the second call must still be blocked on the file lock
    assert second.is_alive() and recorder.running == 1
    recorder.release.set()
    first.join(5)
    second.join(5)
    assert recorder.most == 1 and not second.is_alive()


def test_a_socket_server_whose_directory_vanishes_while_starting_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory deleted between the bind and the chmod: start raises and leaves no server running."""
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    servers: list[grpc.Server] = []
    server = SocketServer(plugin_dir / "dra.sock", servers.append, max_workers=1)
    real_chmod = os.chmod

    def chmod_after_the_directory_went(path: str | os.PathLike[str], mode: int) -> None:
        shutil.rmtree(plugin_dir)
        real_chmod(path, mode)

    monkeypatch.setattr(lifecycle.os, "chmod", chmod_after_the_directory_went)
    with pytest.raises(FileNotFoundError, match=r"plugin/\.\w+\.sock"):  # the chmod of the bound socket
        server.start()
    monkeypatch.undo()
    assert servers[0].wait_for_termination(timeout=5) is False  # False: terminated, not timed out
