"""The claim GET of a prepare against a misbehaving API server (the real client and the stand-in, over gRPC):
5xx, throttling and a server too slow to answer fail only the claim they hit, and the kubelet's re-sent prepare
succeeds once the fault ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apiserver import ApiEnv, api_env
from support.kubelet_plugin_fakes import CDI_VENDOR, make_claim

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient

from .conftest import PluginFactory


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiEnv]:
    # A read timeout short enough to test a server that does not answer in time.
    with api_env(tmp_path, request_timeout=(2.0, 0.5)) as env:
        yield env


def stored(api: ApiEnv, name: str) -> Claim:
    claim = make_claim(name, "")
    del claim["metadata"]["uid"]
    created = api.server.create("resourceclaims", claim)
    return Claim("default", name, created["metadata"]["uid"])


@pytest.fixture
def kubelet(api: ApiEnv, make_plugin: PluginFactory) -> Iterator[KubeletClient]:
    plugin = make_plugin(claim_source=api.cluster)
    plugin.start()
    yield KubeletClient(plugin.registry_dir)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_server_error_on_the_claim_get_fails_only_that_claim_and_a_re_sent_prepare_succeeds(
    api: ApiEnv, kubelet: KubeletClient, status: int
) -> None:
    hit, spared = stored(api, "hit"), stored(api, "spared")
    api.server.fail_next("GET", r"/resourceclaims/hit$", status, message="etcdserver: request timed out")
    with kubelet.register() as plugin:
        first = plugin.prepare([hit, spared])
        assert first[spared.uid].error == ""
        error = first[hit.uid].error
        assert first[hit.uid].devices == []
        assert f"cannot get claim default/hit (UID {hit.uid}) from the API server" in error
        assert str(status) in error and "etcdserver: request timed out" in error
        again = plugin.prepare([hit])[hit.uid]
    assert again.error == ""
    assert [d["cdi_device_ids"] for d in again.devices] == [[f"{CDI_VENDOR}={hit.uid}-gpu-0"]]


def test_a_claim_get_the_server_does_not_answer_in_time_fails_that_claim_and_a_re_sent_prepare_succeeds(
    api: ApiEnv, kubelet: KubeletClient
) -> None:
    slow, quick = stored(api, "slow"), stored(api, "quick")
    api.server.delay_next("GET", r"/resourceclaims/slow$", 2.0)
    with kubelet.register() as plugin:
        first = plugin.prepare([slow, quick])
        assert first[quick.uid].error == ""
        assert "cannot get claim default/slow" in first[slow.uid].error
        assert "timed out (connect timeout 2 s, read timeout 0.5 s)" in first[slow.uid].error
        assert plugin.prepare([slow])[slow.uid].error == ""


def test_an_unreachable_api_server_fails_each_claim_with_the_reason(tmp_path: Path, make_plugin: PluginFactory) -> None:
    with api_env(tmp_path) as env:
        claim = stored(env, "a")
        cluster = env.cluster
    plugin = make_plugin(claim_source=cluster)  # the server has stopped: connections are refused
    plugin.start()
    with KubeletClient(plugin.registry_dir).register() as kubelet:
        error = kubelet.prepare([claim])[claim.uid].error
    assert "cannot get claim default/a" in error and "unreachable" in error
