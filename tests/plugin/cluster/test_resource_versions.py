"""ResourceSlices for servers without resource.k8s.io/v1 (Kubernetes 1.32: v1beta1; 1.33: v1beta2): discovery picks
the version, and the driver's slices converted to it pass that release's official schemas strictly, and convert
back to what the driver published."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from support.nodes import inventory_of

from dradriver.driver.publish.slices import (
    SliceSettings,
    as_resource_slices,
    build_slice_specs,
    release_problem,
    shape_for,
)
from dradriver.gpu.inventory import MigMode
from dradriver.plugin.cluster.resource_versions import newest_served, slice_from, slice_to
from dradriver.sim.profiles import builtin_profile_names


def group(*versions: str) -> dict[str, Any]:
    return {"kind": "APIGroup", "versions": [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]}


def test_discovery_picks_the_newest_version_served() -> None:
    assert newest_served(group("v1", "v1beta2", "v1beta1")) == "v1"
    assert newest_served(group("v1beta2", "v1beta1")) == "v1beta2"  # 1.33
    assert newest_served(group("v1beta1", "v1alpha3")) == "v1beta1"  # 1.32
    assert newest_served(group("v1alpha3")) is None
    assert newest_served({}) is None


# (release, version it serves newest, the MIG modes it can take)
RELEASES = [("1.32.0", "v1beta1", (MigMode.NONE, MigMode.STATIC)), ("1.33.0", "v1beta2", tuple(MigMode))]


@pytest.mark.parametrize("profile", builtin_profile_names())
@pytest.mark.parametrize(("release", "version", "modes"), RELEASES)
def test_slices_in_the_older_versions_pass_their_releases_schemas(
    profile: str, release: str, version: str, modes: tuple[MigMode, ...]
) -> None:
    for mode in modes:
        settings = SliceSettings(mig_mode=mode, shape=shape_for(release))
        assert release_problem(release, settings) is None
        published = as_resource_slices(build_slice_specs(inventory_of(profile), settings), node_name="node-a")
        for obj in published:
            converted = slice_to(version, obj)
            kubernetes_validate.validate(converted, release, strict=True)
            assert slice_from(version, converted) == obj


def test_what_an_older_release_cannot_take_is_refused_with_the_fix() -> None:
    dynamic = SliceSettings(mig_mode=MigMode.DYNAMIC)
    assert "use --mig-mode static" in str(release_problem("1.32", dynamic))
    assert release_problem("1.33", dynamic) is None
    shares = SliceSettings(mig_mode=MigMode.STATIC, consumable_shares="4")
    assert "DRAConsumableCapacity" in str(release_problem("1.33", shares))
    assert release_problem("1.34", shares) is None


def test_a_v1beta1_claim_nests_its_request_fields_under_exactly_as_v1_does() -> None:
    from dradriver.plugin.cluster.resource_versions import object_from

    request = {"name": "gpu", "deviceClassName": "gpu.dradriver.dev", "count": 2, "allocationMode": "ExactCount"}
    sub = {"name": "a", "deviceClassName": "gpu.dradriver.dev"}
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [request, {"name": "any", "firstAvailable": [sub]}]}},
    }
    converted = object_from("v1beta1", claim)
    assert converted["apiVersion"] == "resource.k8s.io/v1"
    assert converted["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": 2, "allocationMode": "ExactCount"},
        },
        {"name": "any", "firstAvailable": [sub]},  # subrequests have v1's shape already
    ]
    assert claim["spec"]["devices"]["requests"][0] is request and "exactly" not in request  # a copy


def test_a_v1beta2_object_differs_from_v1_only_in_its_version() -> None:
    from dradriver.plugin.cluster.resource_versions import object_from

    cls = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceClass", "metadata": {"name": "x"}, "spec": {}}
    assert object_from("v1beta2", cls) == {**cls, "apiVersion": "resource.k8s.io/v1"}


@pytest.mark.parametrize(
    ("request_fields", "exactly"),
    [
        # Any main field set beside firstAvailable: the server moves them all under exactly, and validation then
        # refuses the request for having both (dropping them would let a claim the server refuses "fit").
        ({"deviceClassName": "gpu.dradriver.dev", "count": 2}, {"deviceClassName": "gpu.dradriver.dev", "count": 2}),
        ({"selectors": []}, {"selectors": []}),  # an empty list is set, as a non-nil slice is in Go
        ({"deviceClassName": "", "count": 0, "adminAccess": None}, None),  # zero values are not set
    ],
)
def test_v1beta1_request_fields_move_under_exactly_by_go_s_rule_whatever_first_available_holds(
    request_fields: dict[str, Any], exactly: dict[str, Any] | None
) -> None:
    from dradriver.plugin.cluster.resource_versions import object_from

    sub = {"name": "one", "deviceClassName": "gpu.dradriver.dev"}
    claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [sub], **request_fields}]}},
    }
    [request] = object_from("v1beta1", claim)["spec"]["devices"]["requests"]
    assert request == {"name": "gpu", "firstAvailable": [sub], **({"exactly": exactly} if exactly else {})}
