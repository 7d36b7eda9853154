"""The periodic claim re-check: claims deleted behind the kubelet's back are unprepared while the driver runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.driver.prepare.recheck import ClaimLookup, recheck_claims
from dradriver.plugin.handler import ClaimConsumer, ClaimRef
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from tests.driver.prepare.test_state_mig import H100, Node, claim


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path, "hgx-h100-80gb")
    yield node
    assert node.store is not None
    node.store.close()


def test_a_deleted_claim_is_unprepared_and_its_mig_instance_freed_others_kept(h100: Node) -> None:
    h100.prepare(claim("gone", f"{H100}-mig-3g40gb-0"))
    h100.prepare(claim("kept", f"{H100}-mig-3g40gb-4"))
    h100.prepare(claim("unknown", H100.replace("1b", "43")))
    held: list[str] = []
    locks = ClaimLocks()

    @contextlib.contextmanager
    def hold(uid: str) -> Iterator[None]:
        held.append(uid)
        with locks.hold([uid]):
            yield

    pod = ClaimConsumer(resource="pods", name="worker", uid="pod-1")

    def lookup(ref: ClaimRef) -> ClaimLookup:
        # None: the API server cannot tell now. "kept" was prepared without its pods recorded.
        exists = {"gone": False, "kept": True}.get(ref.uid)
        return ClaimLookup(exists, (pod,) if exists else ())

    gone = recheck_claims(h100.driver, lookup, hold=hold)
    assert [r.uid for r in gone] == ["gone"]
    assert sorted(held) == ["gone", "kept"]  # "kept" only to note its pod
    assert h100.driver.checkpoint.get("kept").reserved_for == [pod]  # type: ignore[union-attr]
    assert sorted(r.uid for r in h100.driver.checkpoint.records()) == ["kept", "unknown"]
    assert h100.instances() == [(9, 4, 1)]
    assert "k8s.gpu.dradriver.dev-claim_gone.json" not in h100.cdi_files()
    held.clear()
    assert recheck_claims(h100.driver, lookup, hold=hold) == [] and held == []  # nothing left to do


def test_a_claim_the_kubelet_unprepared_meanwhile_is_left_alone(h100: Node) -> None:
    h100.prepare(claim("raced", f"{H100}-mig-3g40gb-0"))

    @contextlib.contextmanager
    def kubelet_first(uid: str) -> Iterator[None]:
        # The kubelet's unprepare held the claim's lock first and finished.
        assert h100.driver.unprepare_resource_claims([ClaimRef("default", "claim-raced", uid)]) == {uid: None}
        yield

    assert recheck_claims(h100.driver, lambda _ref: ClaimLookup(False), hold=kubelet_first) == []
    h100.assert_clean()
