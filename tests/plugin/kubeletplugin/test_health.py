"""The health stream: the complete list at once, again on every change, and as a periodic heartbeat."""

from __future__ import annotations

import queue
import threading
from typing import Any

import grpc
import pytest

from dradriver.api.generated import dra_health_v1alpha1_pb2 as pb
from dradriver.plugin.handler import DeviceHealth, HealthBoard, HealthStatus
from dradriver.plugin.kubeletplugin.kubelet_client import KUBELET_HEALTH_VERSIONS, KubeletClient

from .conftest import PluginFactory

TIMEOUT = 10.0


def _devices(response: pb.NodeWatchResourcesResponse) -> list[tuple[str, str, int, int, int, str]]:
    return [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.last_updated_time,
            d.health_check_timeout_seconds,
            d.message,
        )
        for d in response.devices
    ]


class StreamReader:
    """Reads a health stream on a thread so the test can wait for each message with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.messages: queue.Queue[pb.NodeWatchResourcesResponse | BaseException] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for message in self.stream:
                self.messages.put(message)
        except grpc.RpcError as err:
            self.messages.put(err)

    def next(self) -> pb.NodeWatchResourcesResponse:
        """The next message, of either version (the fields and enum values are the same in v1 and v1alpha1)."""
        item = self.messages.get(timeout=TIMEOUT)
        assert not isinstance(item, BaseException), item
        assert type(item).__name__ == "NodeWatchResourcesResponse", item
        return item  # type: ignore[return-value]


GPU0_OK = DeviceHealth(
    pool="node-a", device="gpu-0", status=HealthStatus.HEALTHY, last_updated=1_700_000_000, timeout_seconds=60
)
GPU1_OK = DeviceHealth(pool="node-a", device="gpu-1", status=HealthStatus.HEALTHY, last_updated=1_700_000_000)


def test_the_plugin_advertises_health_v1_and_v1alpha1_and_a_1_37_kubelet_picks_v1(
    make_plugin: PluginFactory, kubelet: KubeletClient
) -> None:
    make_plugin().start()
    with kubelet.register() as registered:
        assert [v for v in registered.info.supported_versions if "Health" in v] == list(KUBELET_HEALTH_VERSIONS)
        assert registered.health_version == "v1.DRAResourceHealth"


@pytest.mark.parametrize("version", KUBELET_HEALTH_VERSIONS)
def test_stream_sends_the_list_at_once_and_on_every_change(
    make_plugin: PluginFactory, health: HealthBoard, kubelet: KubeletClient, version: str
) -> None:
    health.set_devices([GPU0_OK, GPU1_OK])
    make_plugin().start()
    # A kubelet that knows only ``version`` (v1alpha1: 1.34-1.36) uses it.
    only = KubeletClient(kubelet.registry_dir, health_versions=(version,))
    with only.register() as registered:
        assert registered.health_version == version
        reader = StreamReader(registered.watch_health())
        assert _devices(reader.next()) == [
            ("node-a", "gpu-0", pb.HEALTHY, 1_700_000_000, 60, ""),
            ("node-a", "gpu-1", pb.HEALTHY, 1_700_000_000, 0, ""),
        ]
        failed = DeviceHealth(
            pool="node-a",
            device="gpu-1",
            status=HealthStatus.UNHEALTHY,
            last_updated=1_700_000_100,
            message="XID 79: GPU has fallen off the bus",
        )
        health.set_devices([GPU0_OK, failed])
        assert _devices(reader.next())[1] == (
            "node-a",
            "gpu-1",
            pb.UNHEALTHY,
            1_700_000_100,
            0,
            "XID 79: GPU has fallen off the bus",
        )
        reader.stream.cancel()


def test_stream_repeats_the_list_periodically(
    make_plugin: PluginFactory, health: HealthBoard, kubelet: KubeletClient
) -> None:
    health.set_devices([GPU0_OK])
    make_plugin(health_interval=0.05).start()
    with kubelet.register() as registered:
        reader = StreamReader(registered.watch_health())
        # Three messages without any change: the first at once, then heartbeats.
        expected = [("node-a", "gpu-0", pb.HEALTHY, 1_700_000_000, 60, "")]
        assert [_devices(reader.next()) for _ in range(3)] == [expected] * 3
        reader.stream.cancel()


def test_stop_ends_open_streams_and_unsubscribes(
    make_plugin: PluginFactory, health: HealthBoard, kubelet: KubeletClient
) -> None:
    plugin = make_plugin()
    plugin.start()
    with kubelet.register() as registered:
        reader = StreamReader(registered.watch_health())
        assert _devices(reader.next()) == []
        plugin.stop()
        reader.thread.join(TIMEOUT)
        assert not reader.thread.is_alive()
    # The stream's subscription is gone: a change notifies nobody and raises nothing.
    health.set_devices([GPU0_OK])


def test_health_board_notifies_subscribers_until_they_unsubscribe() -> None:
    board = HealthBoard()
    calls: list[int] = []
    unsubscribe = board.subscribe(lambda: calls.append(1))
    board.set_devices([GPU0_OK])
    unsubscribe()
    board.set_devices([])
    assert calls == [1]
    assert board.device_health() == ()
