"""Unknown fields refused as the API server refuses them, judged against Kubernetes' own strict schemas
(kubernetes-validate) as the oracle."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dradriver.validation.fields import knows, schema_version, unknown_fields

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "src/dradriver/validation/data/api_fields.json"

CLAIM: dict[str, Any] = yaml.safe_load("""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: h100, namespace: default, labels: {team: a}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.dradriver.dev
        selectors:
        - cel: {expression: 'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA H100 80GB HBM3"'}
    config:
    - opaque:
        driver: gpu.dradriver.dev
        parameters: {apiVersion: gpu.dradriver.dev/v1alpha1, kind: GpuConfig, anything: [1, 2]}
""")


def _with(obj: dict[str, Any], path: list[str | int], key: str) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    target: Any = changed
    for step in path:
        target = target[step]
    target[key] = "x"
    return changed


def _server_refuses(obj: dict[str, Any]) -> bool:
    try:
        kubernetes_validate.validate(obj, schema_version(), strict=True)
    except kubernetes_validate.ValidationError as err:
        return "Additional properties are not allowed" in str(err)
    return False


def test_the_checked_in_table_is_current() -> None:
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen-api-fields")], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(made) == json.loads(TABLE.read_text()), "run scripts/gen-api-fields and commit its output"


def test_a_misspelt_field_is_named_with_its_path_and_the_nearest_known_one() -> None:
    claim = copy.deepcopy(CLAIM)
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    exactly["selector"] = exactly.pop("selectors")
    [unknown] = unknown_fields(claim)
    assert unknown.path == "spec.devices.requests[0].exactly.selector"
    assert unknown.nearest == "selectors"
    assert unknown.message() == (
        'unknown field "spec.devices.requests[0].exactly.selector" (the API server refuses it); '
        'did you mean "selectors"?'
    )


def test_a_name_like_no_known_field_lists_every_known_one() -> None:
    [unknown] = unknown_fields(_with(CLAIM, ["spec"], "zzz"))
    assert unknown.nearest is None
    assert unknown.message().endswith("known here: devices")


@pytest.mark.parametrize(
    "path",
    [
        [],
        ["metadata"],
        ["spec"],
        ["spec", "devices"],
        ["spec", "devices", "requests", 0],
        ["spec", "devices", "requests", 0, "exactly"],
        ["spec", "devices", "requests", 0, "exactly", "selectors", 0, "cel"],
        ["spec", "devices", "config", 0],
        ["spec", "devices", "config", 0, "opaque"],
    ],
)
def test_every_level_of_a_claim_is_checked_as_the_api_server_checks_it(path: list[str | int]) -> None:
    planted = _with(CLAIM, path, "misspelt")
    assert [u.path for u in unknown_fields(planted)] == [".".join([*map(str, path), "misspelt"]).replace(".0", "[0]")]
    assert _server_refuses(planted)


@pytest.mark.parametrize(
    "path",
    [
        ["metadata", "labels"],  # a map: any key
        ["spec", "devices", "config", 0, "opaque", "parameters"],  # free-form: the driver's to check
    ],
)
def test_maps_and_free_form_values_take_any_key_as_the_api_server_does(path: list[str | int]) -> None:
    planted = _with(CLAIM, path, "misspelt")
    assert unknown_fields(planted) == []
    assert not _server_refuses(planted)


def test_every_example_and_fixture_has_only_known_fields() -> None:
    checked = 0
    for path in [*ROOT.glob("examples/**/*.yaml"), *ROOT.glob("tests/fixtures/**/*.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and knows(doc.get("apiVersion"), doc.get("kind")):
                assert unknown_fields(doc) == [], path
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_older_versions_are_checked_by_their_own_schema(version: str) -> None:
    # v1beta1 has no `exactly`: its request fields sit on the request itself.
    old = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.dradriver.dev"}]}},
    }
    expected = [] if version == "v1beta1" else ["spec.devices.requests[0].deviceClassName"]
    assert [u.path for u in unknown_fields(old)] == expected
    assert _server_refuses(old) == bool(expected)


def test_a_kind_the_table_does_not_hold_is_left_to_other_checks() -> None:
    assert unknown_fields({"apiVersion": "v1", "kind": "Pod", "spec": {"anything": 1}}) == []
