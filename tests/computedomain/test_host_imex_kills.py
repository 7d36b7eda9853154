"""Host-managed IMEX (``--imex-mode hostManaged``): a kill right after every change a channel claim's prepare and
unprepare make on the node (the checkpoint written, the CDI spec written or removed), then a new plugin process on
the same state and CDI directories, leaves nothing behind once the kubelet's next calls come: the claim's retried
prepare gives the channel, its unprepare removes spec and record, and no Node is labelled on the way.

The changes are not listed here: a clean prepare and unprepare count them first, so a write added later is killed
after too."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.fake_rest import FakeRest
from support.fault_walk import Changes, Crash

from dradriver.computedomain import api, node
from dradriver.computedomain.node import ComputeDomainDriver
from tests.computedomain.test_host_imex import HostService, _driver
from tests.computedomain.test_node import NODE_PATH, UID, _claim, node_and_domain

CLAIM = _claim("c1", "channel-0", api.channel_config(UID, "Single"))


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostService]:
    service = HostService(tmp_path / "host-imex")
    service.start()
    yield service
    service.stop()


def count_changes(monkeypatch: pytest.MonkeyPatch, changes: Changes) -> None:
    """Count every file the plugin writes (checkpoint, CDI spec) and every CDI spec it removes, once done."""
    write = node.write_atomically
    remove = ComputeDomainDriver._remove_cdi

    def counted_write(path: Path, text: str) -> None:
        changes.before()
        write(path, text)
        changes.record(f"wrote {path.name}")

    def counted_remove(self: ComputeDomainDriver, claim_uid: str) -> None:
        changes.before()
        existed = self._cdi_path(claim_uid).exists()
        remove(self, claim_uid)
        if existed:
            changes.record(f"removed the CDI spec of {claim_uid}")

    monkeypatch.setattr(node, "write_atomically", counted_write)
    monkeypatch.setattr(ComputeDomainDriver, "_remove_cdi", counted_remove)


def prepare(driver: ComputeDomainDriver) -> None:
    result = driver.prepare_resource_claims([CLAIM])[CLAIM.uid]
    assert result.error is None, result.error


def unprepare(driver: ComputeDomainDriver) -> None:
    assert driver.unprepare_resource_claims([CLAIM.ref]) == {CLAIM.uid: None}


def assert_nothing_left(driver: ComputeDomainDriver, rest: FakeRest, tmp_path: Path, where: str) -> None:
    """No record, no file in the CDI directory (a spec or a temp file), no Node label."""
    assert driver.checkpoint.load() == {}, where
    assert sorted(p.name for p in (tmp_path / "cdi").glob("*")) == [], where
    assert "labels" not in rest.get(NODE_PATH)["metadata"], where


def assert_channel_given(rest: FakeRest, tmp_path: Path, where: str) -> None:
    """The claim's spec gives channel 0; no Node is labelled (the host's daemon serves the domain)."""
    spec = json.loads((tmp_path / "cdi" / f"{api.CDI_VENDOR}-claim_{CLAIM.uid}.json").read_text())
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == ["/dev/nvidia-caps-imex-channels/channel0"], where
    assert "labels" not in rest.get(NODE_PATH)["metadata"], where


def changes_of_a_clean_run(tmp_path: Path, host: HostService, changes: Changes) -> tuple[list[str], list[str]]:
    rest = node_and_domain()
    driver = _driver(rest, tmp_path, host)
    changes.arm(None)
    prepare(driver)
    preparing = list(changes.made)
    changes.arm(None)
    unprepare(driver)
    assert_nothing_left(driver, rest, tmp_path, "the clean run")
    return preparing, list(changes.made)


# After a kill in prepare the kubelet retries it (the pod is still there) or unprepares (the pod was deleted);
# after one in unprepare it sends the unprepare again.
@pytest.mark.parametrize(
    ("phase", "after"), [("prepare", "retried"), ("prepare", "unprepared"), ("unprepare", "retried")]
)
def test_a_kill_after_every_change_leaves_nothing_once_the_kubelet_calls_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: HostService, phase: str, after: str
) -> None:
    changes = Changes()
    count_changes(monkeypatch, changes)
    preparing, unpreparing = changes_of_a_clean_run(tmp_path / "probe", host, changes)
    # What the walk covers today: the record and the spec, written and taken away.
    assert preparing == ["wrote checkpoint.json", f"wrote {api.CDI_VENDOR}-claim_{CLAIM.uid}.json"]
    assert unpreparing == [f"removed the CDI spec of {CLAIM.uid}", "wrote checkpoint.json"]
    for kill_after, change in enumerate(preparing if phase == "prepare" else unpreparing, start=1):
        where = f"{phase} killed after change {kill_after} ({change}), then {after}"
        directory = tmp_path / f"{phase}-{kill_after}"
        rest = node_and_domain()
        first = _driver(rest, directory, host)
        if phase == "unprepare":
            prepare(first)
        changes.arm(kill_after)
        call: Callable[[ComputeDomainDriver], None] = prepare if phase == "prepare" else unprepare
        with pytest.raises(Crash):
            call(first)
        changes.arm(None)  # the next process's changes are counted anew, none killed
        restarted = _driver(rest, directory, host)  # a new process on the same checkpoint and CDI directory
        if after == "retried":
            call(restarted)
            if phase == "prepare":
                assert_channel_given(rest, directory, where)
                unprepare(restarted)
        else:
            unprepare(restarted)
        assert_nothing_left(restarted, rest, directory, where)
        prepare(restarted)  # the same claim again
        assert_channel_given(rest, directory, where)
        unprepare(restarted)
        assert_nothing_left(restarted, rest, directory, where)
