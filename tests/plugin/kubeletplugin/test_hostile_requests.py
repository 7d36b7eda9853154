"""Hostile input over gRPC: any claim references in a request, and any content in the claims the API server
returns for them. Every claim gets a result (devices or an error naming it), the server never fails the call."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kubelet_plugin_fakes import DRIVER, FakeClaimSource

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from dradriver.plugin.kubeletplugin.plugin import KubeletPlugin

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)
results = st.lists(
    st.fixed_dictionaries(
        {"request": st.text(max_size=8), "driver": st.sampled_from([DRIVER, "other.example.com", ""])},
        optional={"pool": st.sampled_from(["node-a", "node-b"]), "device": st.text(max_size=20), "x": json_values},
    ),
    max_size=3,
)
statuses = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"allocation": st.fixed_dictionaries({"devices": st.fixed_dictionaries({"results": results})})}
    ),
)
refs = st.tuples(st.text(max_size=20), st.text(max_size=20), st.text(min_size=1, max_size=40))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(st.tuples(refs, statuses, st.booleans()), min_size=1, max_size=4, unique_by=lambda b: b[0][2]))
def test_any_request_and_any_claim_content_gets_a_result_per_claim(
    plugin: KubeletPlugin, claims: FakeClaimSource, batch: list[tuple[tuple[str, str, str], Any, bool]]
) -> None:
    request = []
    for (namespace, name, uid), status, stored in batch:
        if stored:
            claims.add({"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}, "status": status})
        request.append(Claim(namespace, name, uid))
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        prepared = kubelet.prepare(request)
        assert set(prepared) == {c.uid for c in request}
        for claim in request:
            result = prepared[claim.uid]
            assert result.error or result.devices, claim
        unprepared = kubelet.unprepare(request)
        assert set(unprepared) == {c.uid for c in request}
