"""The ResourceSlice publisher, driven through the real kubernetes client against the API server stand-in."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apiserver import ApiEnv, api_env

from dradriver.plugin.cluster.memory import MemoryCluster
from dradriver.plugin.resourceslice.publisher import Backoff, Publisher, PublisherOptions, SliceSpec, slice_index

DRIVER = "gpu.dradriver.dev"
NODE = "node-1"


class Sleeps:
    """The injected sleep: records each backoff delay and returns at once (or blocks on demand)."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.hold = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.delays.append(seconds)
        if self.hold.is_set():
            self.held.set()
            self.release.wait(10)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiEnv]:
    with api_env(tmp_path) as env:
        env.server.create("nodes", {"metadata": {"name": NODE}})
        yield env


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


PublisherFactory = Callable[..., Publisher]


@pytest.fixture
def make_publisher(api: ApiEnv, sleeps: Sleeps) -> Iterator[PublisherFactory]:
    started: list[Publisher] = []

    def make(
        pools: dict[str, list[SliceSpec]], *, start: bool = True, cluster: Any = None, **options: Any
    ) -> Publisher:
        publisher = Publisher(
            cluster or api.cluster,
            PublisherOptions(
                driver=DRIVER, node_name=NODE, backoff=Backoff(initial=0.1, maximum=2.0, jitter=0.0), **options
            ),
            pools=pools,
            sleep=sleeps,
        )
        if start:
            publisher.start()
            started.append(publisher)
        return publisher

    yield make
    sleeps.release.set()
    for publisher in started:
        publisher.stop()


def gpu(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def spec(*names: str, **extra: Any) -> SliceSpec:
    return SliceSpec.of(devices=[gpu(n, **extra) for n in names])


def slices(api: ApiEnv) -> list[dict[str, Any]]:
    """Our slices on the server, in index order."""
    found = [
        s for s in api.server.list("resourceslices") if s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE
    ]
    return sorted(found, key=lambda s: (s["spec"]["pool"]["name"], s["metadata"]["name"]))


def device_names(api: ApiEnv) -> list[list[str]]:
    return [[d["name"] for d in s["spec"].get("devices", [])] for s in slices(api)]


def pool_fields(api: ApiEnv) -> set[tuple[str, int, int]]:
    return {
        (s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
        for s in slices(api)
    }


def methods(records: list[Any]) -> list[str]:
    return [r.method for r in records]


# -- publishing ------------------------------------------------------------------------------------------


def test_first_publish_creates_the_slice_owned_by_the_node(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0", "gpu-1")]})
    assert publisher.wait_synced(10)
    [published] = slices(api)
    node = api.server.get("nodes", NODE)
    assert node is not None
    assert published["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"], "controller": True}
    ]
    assert published["metadata"]["name"].startswith(f"00000-{DRIVER}-{NODE}-")
    assert published["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    status = publisher.status
    assert status.ready and status.last_error is None and status.last_success is not None
    assert status.generations == {NODE: 1}


def test_republishing_the_same_pools_writes_nothing(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    pools = {NODE: [spec("gpu-0"), spec("gpu-1")]}
    publisher = make_publisher(pools)
    assert publisher.wait_synced(10)
    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0"), spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []
    assert any(r.method == "GET" for r in api.server.requests_since(mark))  # it did look


def test_a_restarted_publisher_adopts_its_slices_without_writing(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    pools = {NODE: [spec("gpu-0"), spec("gpu-1")]}
    first = make_publisher(pools)
    assert first.wait_synced(10)
    first.stop()
    mark = api.server.mark()
    second = make_publisher(pools)
    assert second.wait_synced(10)
    assert api.server.writes_since(mark) == []
    assert second.status.generations == {NODE: 1}


def test_publishing_with_taints_is_idempotent_although_the_server_adds_time_added(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    taint = {"key": "gpu.dradriver.dev/xid", "value": "79", "effect": "NoSchedule"}
    publisher = make_publisher({NODE: [spec("gpu-0", taints=[taint])]})
    assert publisher.wait_synced(10)
    assert "timeAdded" in slices(api)[0]["spec"]["devices"][0]["taints"][0]
    mark = api.server.mark()
    publisher.sync_now()
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []


def test_quantities_the_server_rewrote_in_canonical_form_count_as_unchanged(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    publisher = make_publisher(
        {NODE: [SliceSpec.of(devices=[{"name": "gpu-0", "capacity": {"memory": {"value": "1024Mi"}}}])]}
    )
    assert publisher.wait_synced(10)
    [stored] = slices(api)
    stored["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi"
    mark = api.server.mark()
    api.server.replace("resourceslices", stored)  # as the real server stores it
    publisher.sync_now()
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []


def test_a_zero_counter_the_server_rewrote_in_canonical_form_counts_as_unchanged(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    counters = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "0Gi"}}}]
    publisher = make_publisher({NODE: [SliceSpec.of(shared_counters=counters)]})
    assert publisher.wait_synced(10)
    [stored] = slices(api)
    stored["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] = "0"
    mark = api.server.mark()
    api.server.replace("resourceslices", stored)  # the real server stores 0Gi as "0"
    publisher.sync_now()
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []


# -- others changing our slices ----------------------------------------------------------------------------


def test_a_slice_deleted_by_someone_else_is_recreated(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert api.server.wait_until(lambda: api.server.active_watches == 1)
    [old] = slices(api)
    api.server.delete("resourceslices", old["metadata"]["name"])  # e.g. the kubelet at its start
    assert api.server.wait_until(lambda: len(slices(api)) == 1)
    [new] = slices(api)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert device_names(api) == [["gpu-0"]]
    assert pool_fields(api) == {(NODE, 1, 1)}


def test_a_slice_edited_by_someone_else_is_restored_in_place(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0", "gpu-1")]})
    assert publisher.wait_synced(10)
    assert api.server.wait_until(lambda: api.server.active_watches == 1)
    [stored] = slices(api)
    stored["spec"]["devices"] = stored["spec"]["devices"][:1]
    mark = api.server.mark()
    api.server.replace("resourceslices", stored)
    assert api.server.wait_until(
        lambda: device_names(api) == [["gpu-0", "gpu-1"]] and len(api.server.writes_since(mark)) == 1
    )
    assert methods(api.server.writes_since(mark)) == ["PUT"]
    assert slices(api)[0]["metadata"]["uid"] == stored["metadata"]["uid"]
    assert pool_fields(api) == {(NODE, 1, 1)}


def test_slices_of_our_driver_and_node_that_match_nothing_are_deleted(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    def stray(name: str, pool: str, generation: int = 1) -> None:
        api.server.create(
            "resourceslices",
            {
                "metadata": {"name": name},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                    "devices": [gpu("gpu-9")],
                },
            },
        )

    stray("old-naming-scheme", NODE)
    stray("00007-index-beyond-the-pool", NODE)
    stray("00000-a-pool-no-longer-wanted", "gone")
    api.server.create(
        "resourceslices",
        {
            "metadata": {"name": "someone-elses"},
            "spec": {
                "driver": "nic.example.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            },
        },
    )
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0"]]
    assert api.server.get("resourceslices", "someone-elses") is not None
    assert pool_fields(api) == {(NODE, 2, 1)}


# -- failures --------------------------------------------------------------------------------------------


def test_api_errors_are_retried_with_growing_backoff_until_publishing_succeeds(
    api: ApiEnv, make_publisher: PublisherFactory, sleeps: Sleeps
) -> None:
    api.server.fail_next("POST", "/resourceslices", 500, count=2)
    api.server.fail_next("GET", "/resourceslices", 503, count=1)
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0"]]
    assert len(sleeps.delays) == 3
    assert sleeps.delays == sorted(sleeps.delays) and sleeps.delays[0] < sleeps.delays[-1]
    assert publisher.status.ready and publisher.status.consecutive_failures == 0


def test_backoff_is_bounded(api: ApiEnv, make_publisher: PublisherFactory, sleeps: Sleeps) -> None:
    api.server.fail_next("GET", "/resourceslices", 500, count=8)
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert max(sleeps.delays) == 2.0


def test_a_failure_is_surfaced_in_the_status_while_retrying(
    api: ApiEnv, make_publisher: PublisherFactory, sleeps: Sleeps
) -> None:
    sleeps.hold.set()
    api.server.fail_next("POST", "/resourceslices", 503, message="etcd is down")
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert sleeps.held.wait(10)
    status = publisher.status
    assert not status.ready
    assert status.last_error is not None and "503" in status.last_error and "etcd is down" in status.last_error
    assert status.consecutive_failures == 1
    sleeps.hold.clear()
    sleeps.release.set()
    assert publisher.wait_synced(10)
    assert publisher.status.ready


def test_a_conflict_on_update_is_resolved_by_listing_again(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    api.server.fail_next("PUT", "/resourceslices/", 409)
    publisher.update({NODE: [spec("gpu-0", "gpu-1")]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0", "gpu-1"]]


def test_publishing_resumes_after_the_watch_is_dropped(
    api: ApiEnv, make_publisher: PublisherFactory, sleeps: Sleeps
) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert api.server.wait_until(lambda: api.server.active_watches == 1)
    watches = sum(r.watch for r in api.server.requests)
    api.server.drop_watches()
    assert api.server.wait_until(
        lambda: sum(r.watch for r in api.server.requests) > watches and api.server.active_watches == 1
    )
    assert sleeps.delays, "a dropped watch waits for the backoff before listing again"
    api.server.delete("resourceslices", slices(api)[0]["metadata"]["name"])
    assert api.server.wait_until(lambda: device_names(api) == [["gpu-0"]])


def test_an_expired_watch_410_gone_is_followed_by_a_fresh_list_and_watch(
    api: ApiEnv, make_publisher: PublisherFactory, sleeps: Sleeps
) -> None:
    def compact_first() -> None:  # etcd compacted past the version the publisher is about to watch from
        api.server.create("nodes", {"metadata": {"name": "unrelated"}})
        api.server.compact()

    api.server.before_next("GET", r"/resourceslices\?.*watch=true", compact_first)
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    # The 410 ends that watch: the publisher backs off, lists again and watches from the fresh version.
    assert api.server.wait_until(
        lambda: sum(r.watch for r in api.server.requests) == 2 and api.server.active_watches == 1
    )
    assert sleeps.delays, "a 410 waits for the backoff before listing again"
    assert publisher.status.ready
    api.server.delete("resourceslices", slices(api)[0]["metadata"]["name"])
    assert api.server.wait_until(lambda: device_names(api) == [["gpu-0"]])


def test_a_create_answered_too_late_is_retried_without_a_duplicate_slice(tmp_path: Path, sleeps: Sleeps) -> None:
    """The client gives up on a slow POST that the server still carries out: the retry lists, finds the slice
    and creates no second one."""
    with api_env(tmp_path, request_timeout=(2.0, 0.3)) as env:
        env.server.create("nodes", {"metadata": {"name": NODE}})
        env.server.delay_next("POST", "/resourceslices", 1.0)
        publisher = Publisher(
            env.cluster,
            PublisherOptions(driver=DRIVER, node_name=NODE, backoff=Backoff(initial=0.1, maximum=2.0, jitter=0.0)),
            pools={NODE: [spec("gpu-0")]},
            sleep=sleeps,
        )
        publisher.start()
        try:
            assert publisher.wait_synced(10)
            assert env.server.wait_until(lambda: len(slices(env)) == 1 and env.server.active_watches == 1)
            assert device_names(env) == [["gpu-0"]] and len(slices(env)) == 1
            assert sleeps.delays and publisher.status.ready
        finally:
            publisher.stop()


def test_a_real_conflict_with_another_writer_of_our_slice_is_resolved_by_listing_again(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    """Someone else writes our slice between our list and our update: the server answers 409 (a stale
    resourceVersion, not an injected status); the next pass lists, and our content wins."""
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)

    def someone_else_writes() -> None:
        [stored] = slices(api)
        stored["metadata"].setdefault("labels", {})["edited-by"] = "someone-else"
        api.server.replace("resourceslices", stored)

    api.server.before_next("PUT", "/resourceslices/", someone_else_writes)
    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0", "gpu-1")]})
    assert api.server.wait_until(lambda: device_names(api) == [["gpu-0", "gpu-1"]])
    assert publisher.wait_synced(10)
    statuses = [r.status for r in api.server.writes_since(mark) if r.method == "PUT"]
    assert statuses[:2] == [409, 200]
    assert pool_fields(api) == {(NODE, 1, 1)}


def test_stop_is_prompt_and_leaves_the_slices_published(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert api.server.wait_until(lambda: api.server.active_watches == 1)
    publisher.stop(timeout=5)
    assert api.server.wait_until(lambda: api.server.active_watches == 0, 5)
    assert device_names(api) == [["gpu-0"]]


# -- generations and inventory changes -----------------------------------------------------------------------


def test_generation_is_bumped_when_slices_are_added_and_kept_for_a_single_update(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    publisher.update({NODE: [spec("gpu-0"), spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {(NODE, 2, 2)}

    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0"), spec("gpu-1", "gpu-2")]})
    assert publisher.wait_synced(10)
    assert methods(api.server.writes_since(mark)) == ["PUT"]
    assert pool_fields(api) == {(NODE, 2, 2)}

    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0", "gpu-3"), spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert methods(api.server.writes_since(mark)) == ["PUT", "PUT"]
    assert pool_fields(api) == {(NODE, 3, 2)}
    assert publisher.status.generations == {NODE: 3}


def test_an_existing_higher_generation_is_respected(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    node = api.server.get("nodes", NODE)
    assert node is not None
    api.server.create(
        "resourceslices",
        {
            "metadata": {
                "name": f"00000-{DRIVER}-{NODE}-abcde",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": NODE,
                        "uid": node["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 7, "resourceSliceCount": 1},
                "devices": [gpu("gpu-0")],
            },
        },
    )
    mark = api.server.mark()
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []
    publisher.update({NODE: [spec("gpu-0"), spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {(NODE, 8, 2)}


def test_fewer_slices_delete_the_extra_ones_and_bump_the_generation(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0"), spec("gpu-1"), spec("gpu-2")]})
    assert publisher.wait_synced(10)
    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0", "gpu-1")]})
    assert publisher.wait_synced(10)
    writes = methods(api.server.writes_since(mark))
    assert writes == ["DELETE", "DELETE", "PUT"]  # deletes first, then updates
    assert device_names(api) == [["gpu-0", "gpu-1"]]
    assert slice_index(slices(api)[0]["metadata"]["name"]) == 0
    assert pool_fields(api) == {(NODE, 2, 1)}


def test_many_devices_split_by_the_caller_are_published_as_several_slices(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    taint = [{"key": "k", "effect": "NoSchedule"}]
    names = [f"gpu-{i}" for i in range(100)]
    publisher = make_publisher({NODE: [spec(*names[:64], taints=taint), spec(*names[64:], taints=taint)]})
    assert publisher.wait_synced(10)
    assert [len(d) for d in device_names(api)] == [64, 36]
    assert pool_fields(api) == {(NODE, 1, 2)}


def test_several_pools_and_a_counter_slice_are_published_together(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    counters = SliceSpec.of(shared_counters=[{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}])
    partition = gpu(
        "gpu-0-mig-1g10gb-0",
        consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}],
    )
    publisher = make_publisher({"pool-a": [counters, SliceSpec.of(devices=[partition])], "pool-b": [spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {("pool-a", 1, 2), ("pool-b", 1, 1)}
    publisher.update({"pool-b": [spec("gpu-1")]})
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {("pool-b", 1, 1)}


# -- validation ------------------------------------------------------------------------------------------


def test_an_invalid_pool_is_not_published_and_the_status_names_the_device(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    tainted = [f"gpu-{i}" for i in range(65)]
    publisher = make_publisher(
        {
            "bad": [spec(*tainted, taints=[{"key": "k", "effect": "NoSchedule"}])],
            "good": [spec("gpu-x")],
            "worse": [spec("GPU_Y")],
        }
    )
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {("good", 1, 1)}
    status = publisher.status
    assert not status.ready
    assert set(status.invalid_pools) == {"bad", "worse"}
    assert any("max-devices" in p for p in status.invalid_pools["bad"])
    assert any("GPU_Y" in p and "device-name-dns-label" in p for p in status.invalid_pools["worse"])
    assert not any(r.status == 422 for r in api.server.requests)

    publisher.update(
        {
            "bad": [
                spec(*tainted[:64], taints=[{"key": "k", "effect": "NoSchedule"}]),
                spec(tainted[64], taints=[{"key": "k", "effect": "NoSchedule"}]),
            ],
            "good": [spec("gpu-x")],
        }
    )
    assert publisher.wait_synced(10)
    assert pool_fields(api) == {("bad", 1, 2), ("good", 1, 1)}
    assert publisher.status.ready and publisher.status.invalid_pools == {}


def test_an_invalid_update_leaves_the_published_pool_alone(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0")]})
    assert publisher.wait_synced(10)
    mark = api.server.mark()
    publisher.update({NODE: [spec("gpu-0", "gpu-0")]})
    assert publisher.wait_synced(10)
    assert api.server.writes_since(mark) == []
    assert device_names(api) == [["gpu-0"]]
    assert "device-name-unique" in publisher.status.invalid_pools[NODE][0]


# -- without a thread, and over the in-memory cluster ---------------------------------------------------


def test_reconcile_runs_one_pass_synchronously(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: [spec("gpu-0"), spec("gpu-1")]}, start=False)
    first = publisher.reconcile()
    assert (first.created, first.updated, first.deleted) == (2, 0, 0)
    assert publisher.reconcile().writes == 0


def test_the_publisher_works_over_the_in_memory_cluster(make_publisher: PublisherFactory) -> None:
    memory = MemoryCluster()
    memory.add_node(NODE)
    publisher = make_publisher({NODE: [spec("gpu-0")]}, cluster=memory)
    assert publisher.wait_synced(10)
    [stored] = memory.slice_objects()
    memory.delete_slice_by_name(stored["metadata"]["name"])
    publisher.sync_now()
    assert publisher.wait_synced(10)
    assert [s["spec"]["devices"][0]["name"] for s in memory.slice_objects()] == ["gpu-0"]


class FightingCluster(MemoryCluster):
    """Someone else rewrites every slice right after we write it, so the publisher can never win."""

    def __init__(self) -> None:
        super().__init__()
        self.our_writes = 0
        self._round = 0

    def create_resource_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = super().create_resource_slice(obj)
        self._fight(stored)
        return stored

    def update_resource_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = super().update_resource_slice(obj)
        self._fight(stored)
        return stored

    def _fight(self, stored: dict[str, Any]) -> None:
        self.our_writes += 1
        self._round += 1
        edited = copy.deepcopy(stored)
        edited["spec"]["devices"][0]["attributes"]["owner"] = {"int": self._round}
        super().update_resource_slice(edited)


def test_a_writer_fighting_over_the_slices_makes_the_publisher_back_off_instead_of_spinning(
    make_publisher: PublisherFactory, sleeps: Sleeps
) -> None:
    fighting = FightingCluster()
    fighting.add_node(NODE)
    sleeps.hold.set()
    make_publisher({NODE: [spec("gpu-0")]}, cluster=fighting)
    assert sleeps.held.wait(10), f"no backoff after {fighting.our_writes} writes"
    assert fighting.our_writes == 3  # one create, then two passes that restored the slice


def _mixed_taints() -> SliceSpec:
    blocking = [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]
    informational = [{"key": f"{DRIVER}/xid", "value": "31", "effect": "None"}]
    return SliceSpec.of(devices=[gpu("gpu-0", taints=blocking), gpu("gpu-1", taints=informational), gpu("gpu-2")])


def test_where_the_server_drops_taints_tainted_devices_are_withdrawn_once_noticed(
    api: ApiEnv, make_publisher: PublisherFactory, caplog: pytest.LogCaptureFixture
) -> None:
    api.server.drop_device_taints = True
    publisher = make_publisher({NODE: [_mixed_taints()]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-1", "gpu-2"]]
    assert all("taints" not in d for d in slices(api)[0]["spec"]["devices"])
    assert publisher.status.taints_dropped
    # Health changes later: still withdrawn, and said only once.
    publisher.update({NODE: [spec("gpu-0", "gpu-1", "gpu-2", taints=[{"key": "k", "effect": "NoExecute"}])]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [[]]
    publisher.update({NODE: [spec("gpu-0", "gpu-1", "gpu-2")]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0", "gpu-1", "gpu-2"]]
    assert caplog.text.count("dropped devices[].taints") == 1


def _partitioned() -> list[SliceSpec]:
    """The 1.35 layout: a counter set in its own slice, a whole GPU and a MIG device consuming it, and a GPU that
    consumes nothing."""
    counters = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    consume = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    small = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}]
    devices = [gpu("gpu-0", consumesCounters=consume), gpu("gpu-0-mig-0", consumesCounters=small), gpu("gpu-1")]
    return [SliceSpec.of(shared_counters=counters), SliceSpec.of(devices=devices)]


def test_where_the_server_drops_shared_counters_the_devices_consuming_them_are_withdrawn(
    api: ApiEnv, make_publisher: PublisherFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Stripped of their counters, gpu-0 and its MIG device would look independent: both could be allocated.
    api.server.drop_counters = True
    publisher = make_publisher({NODE: _partitioned()})
    assert publisher.wait_synced(10)
    assert device_names(api) == [[], ["gpu-1"]]
    assert not any(s["spec"].get("sharedCounters") for s in slices(api))
    assert publisher.status.counters_dropped
    publisher.update({NODE: _partitioned()})
    assert publisher.wait_synced(10)
    assert device_names(api) == [[], ["gpu-1"]]
    assert caplog.text.count("dropped the slices' shared counters") == 1
    assert "DRAPartitionableDevices" in caplog.text


def test_a_server_that_keeps_counters_gets_every_device(api: ApiEnv, make_publisher: PublisherFactory) -> None:
    publisher = make_publisher({NODE: _partitioned()})
    assert publisher.wait_synced(10)
    assert device_names(api) == [[], ["gpu-0", "gpu-0-mig-0", "gpu-1"]]
    assert not publisher.status.counters_dropped


def test_withdrawal_can_be_switched_off_then_tainted_devices_stay_offered(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    api.server.drop_device_taints = True
    publisher = make_publisher({NODE: [_mixed_taints()]}, withdraw_tainted_if_dropped=False)
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0", "gpu-1", "gpu-2"]]
    assert publisher.status.taints_dropped


def test_a_server_that_keeps_taints_gets_them_and_nothing_is_withdrawn(
    api: ApiEnv, make_publisher: PublisherFactory
) -> None:
    publisher = make_publisher({NODE: [_mixed_taints()]})
    assert publisher.wait_synced(10)
    assert device_names(api) == [["gpu-0", "gpu-1", "gpu-2"]]
    assert not publisher.status.taints_dropped
    assert [t["effect"] for t in slices(api)[0]["spec"]["devices"][0]["taints"]] == ["NoSchedule"]


def test_a_spec_takes_kubernetes_client_models_in_their_json_form() -> None:
    from kubernetes.client import V1Device

    spec = SliceSpec.of(devices=[V1Device(name="gpu-0", attributes=None)])
    assert spec.devices == ({"name": "gpu-0"},)
