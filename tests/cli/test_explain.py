"""``dradriver explain`` end to end through the CLI entry point."""

import json
from pathlib import Path

import pytest

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SLICES = str(ROOT / "tests/fixtures/slices/dgx-a100-80gb.yaml")
MIG_SLICES = str(ROOT / "tests/fixtures/slices/dgx-a100-80gb-mig.yaml")
CLASSES = str(ROOT / "manifests/deviceclasses")

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: %(name)s, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: %(cls)s
        count: %(count)d
        selectors:
        - cel: {expression: '%(expr)s'}
"""


def write_claim(tmp_path, *, name="c", cls="gpu.dradriver.dev", count=1, expr="true", extra=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(CLAIM % {"name": name, "cls": cls, "count": count, "expr": expr} + extra)
    return str(path)


def test_fitting_claim_exits_zero_and_shows_the_allocation(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path, count=2), "--slices", SLICES, "--classes", CLASSES])
    out = capsys.readouterr().out
    assert code == 0
    assert "fits on node node-a" in out
    assert "device: gpu-0000-0f-00-0" in out


def test_claim_that_does_not_fit_exits_one_with_the_reason(tmp_path, capsys):
    expr = 'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA H100 80GB HBM3"'
    code = main(["explain", write_claim(tmp_path, expr=expr), "--slices", SLICES])
    out = capsys.readouterr().out
    assert code == 1
    assert "does NOT fit" in out
    assert 'gpu.dradriver.dev/productName is "NVIDIA A100-SXM4-80GB" (8)' in out


def test_json_output_carries_the_report(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path), "--slices", SLICES, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["claims"][0]["fits"] is True
    assert data["claims"][0]["report"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0000-07-00-0"


def test_runtime_error_names_the_missing_attribute(tmp_path, capsys):
    expr = 'device.attributes["gpu.dradriver.dev"].model == "x"'
    code = main(["explain", write_claim(tmp_path, expr=expr), "--slices", SLICES])
    out = capsys.readouterr().out
    assert code == 1
    assert "gpu.dradriver.dev/model" in out
    assert "ERROR" in out or "cannot be allocated" in out


def test_unknown_device_class_is_bad_input_naming_file_document_and_field(tmp_path, capsys):
    good = write_claim(tmp_path, name="good")
    bad = write_claim(tmp_path, name="bad", cls="nvidia.com")
    code = main(["explain", good, bad, "--slices", SLICES])
    captured = capsys.readouterr()
    assert code == 2
    assert "bad.yaml #1" in captured.err
    assert "spec.devices.requests[0].exactly.deviceClassName" in captured.err
    assert "DeviceClass nvidia.com does not exist" in captured.err
    assert "ResourceClaim default/good" in captured.out  # the other document is still explained


def test_invalid_cel_is_bad_input_with_line_and_column(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path, expr='device.driver = "x"'), "--slices", SLICES])
    err = capsys.readouterr().err
    assert code == 2
    assert "selectors[0].cel.expression" in err
    assert "line 1, column" in err


def test_objects_that_are_not_dra_objects_are_skipped_with_a_note(tmp_path, capsys):
    extra = (
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
        "---\napiVersion: resource.k8s.io/v1alpha3\nkind: DeviceTaintRule\nmetadata: {name: r}\n"
    )
    code = main(["explain", write_claim(tmp_path, extra=extra), "--slices", SLICES])
    captured = capsys.readouterr()
    assert code == 0  # the verdict alone: the claim fits
    assert "fits on node node-a" in captured.out
    assert "error" not in captured.err
    assert "c.yaml #2: skipped Pod p: not an object explain reads" in captured.err
    assert "c.yaml #3: skipped Deployment d" in captured.err
    assert "c.yaml #4: skipped DeviceTaintRule r" in captured.err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # A kind explain reads under the core group is a mistake to name, not an object to skip.
        ("apiVersion: v1\nkind: ResourceClaim\nmetadata: {name: x}\nspec: {}\n", "apiVersion 'v1'"),
        # Malformed metadata on an object of another group: still an answer (the fuzz test found a crash).
        ("apiVersion: v1\nkind: Pod\nmetadata: '0'\n", None),
        ("apiVersion: '0'\nkind: ResourceClaim\nmetadata: '0'\nspec: null\n", "apiVersion '0'"),
    ],
)
def test_a_dra_kind_under_another_api_version_is_an_error_and_bad_metadata_never_crashes(
    tmp_path, capsys, text, message
):
    code = main(["explain", write_claim(tmp_path, extra="---\n" + text), "--slices", SLICES])
    err = capsys.readouterr().err
    assert "internal error" not in err
    if message is None:
        assert code == 0
    else:
        assert code == 2
        assert message in err


def test_typed_lists_as_the_api_server_returns_them_are_read_and_skipped_by_their_items_kind(tmp_path, capsys):
    # `kubectl get --raw .../resourceclaims` answers a ResourceClaimList whose items carry neither kind nor
    # apiVersion (the list's apiVersion is theirs); a PodList is another group's object, skipped like a Pod.
    claim = {
        "metadata": {"name": "listed", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}},
    }
    lists = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList", "metadata": {}, "items": [claim]},
        {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{"metadata": {"name": "p"}}]},
    ]
    path = tmp_path / "lists.json"
    path.write_text(json.dumps(lists[0]) + "\n")
    (tmp_path / "pods.json").write_text(json.dumps(lists[1]) + "\n")
    code = main(["explain", str(path), str(tmp_path / "pods.json"), "--slices", SLICES, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["errors"] == []
    assert [c["fits"] for c in data["claims"]] == [True]
    assert data["skipped"] == [f"{tmp_path}/pods.json #1 items[0]: skipped Pod p: not an object explain reads"]
    assert code == 0


def test_skipped_objects_are_listed_in_json_output(tmp_path, capsys):
    extra = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
    code = main(["explain", write_claim(tmp_path, extra=extra), "--slices", SLICES, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["errors"] == []
    assert data["skipped"] == [f"{tmp_path}/c.yaml #2: skipped Pod p: not an object explain reads"]


def test_a_claim_that_does_not_fit_beside_a_pod_exits_one(tmp_path, capsys):
    extra = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
    assert main(["explain", write_claim(tmp_path, count=9, extra=extra), "--slices", SLICES]) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: resource.k8s.io/v1\nkind: ResourceClam\nmetadata: {name: x}\n", "kind 'ResourceClam'"),
        ("kind: Pod\nmetadata: {name: x}\n", "#2: kind 'Pod' is not one of"),  # no apiVersion
        ("apiVersion: v1\nmetadata: {name: x}\n", "kind None is not one of"),
        ("- just\n- a list\n", "not a Kubernetes object"),
    ],
)
def test_malformed_objects_are_still_bad_input(tmp_path, capsys, text, message):
    code = main(["explain", write_claim(tmp_path, extra="---\n" + text), "--slices", SLICES])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err


def test_broken_yaml_is_reported(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("kind: [unclosed\n")
    assert main(["explain", str(path), "--slices", SLICES]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_missing_slices_is_a_usage_error(tmp_path, capsys):
    assert main(["explain", write_claim(tmp_path)]) == 2
    assert "--slices" in capsys.readouterr().err


def test_sim_profile_without_the_slice_builder_fails_clearly(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path), "--sim-profile", "dgx-a100-80gb"])
    err = capsys.readouterr().err
    if code == 2:
        assert "--slices" in err
    else:
        assert code in (0, 1)


def test_claim_is_explained_on_every_node(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path, count=3), "--slices", SLICES, "--slices", MIG_SLICES])
    out = capsys.readouterr().out
    assert code == 0
    assert "fits on node node-a" in out


def test_already_allocated_claims_consume_devices(tmp_path, capsys):
    allocated = tmp_path / "allocated.yaml"
    results = "\n".join(
        f"        - {{request: r, driver: gpu.dradriver.dev, pool: node-a, device: {d}}}"
        for d in [
            "gpu-0000-07-00-0",
            "gpu-0000-0f-00-0",
            "gpu-0000-47-00-0",
            "gpu-0000-4e-00-0",
            "gpu-0000-87-00-0",
            "gpu-0000-90-00-0",
            "gpu-0000-b7-00-0",
        ]
    )
    allocated.write_text(f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: other, namespace: default}}
spec: {{devices: {{requests: [{{name: r, exactly: {{deviceClassName: gpu.dradriver.dev, count: 7}}}}]}}}}
status:
  allocation:
    devices:
      results:
{results}
""")
    code = main(["explain", write_claim(tmp_path, count=2), "--slices", SLICES, "--allocated", str(allocated)])
    out = capsys.readouterr().out
    assert code == 1
    assert "7 matching devices are allocated to other claims" in out


def test_selector_mode_groups_devices_by_outcome(capsys):
    code = main(
        [
            "explain",
            "--selector",
            'device.attributes["gpu.dradriver.dev"].profile == "7g.80gb"',
            "--slices",
            MIG_SLICES,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    match_line = next(line for line in out.splitlines() if "  match: " in line)
    assert "gpu-0000-07-00-0-mig-7g80gb-0" in match_line
    error_line = next(line for line in out.splitlines() if "error: no such key: profile" in line)
    assert "gpu-0000-07-00-0" in error_line
    assert "2 of 52 devices match; 2 failed with an error" in out


def test_selector_mode_json_lists_every_device(capsys):
    code = main(
        [
            "explain",
            "--selector",
            'device.attributes["gpu.dradriver.dev"].profile == "7g.80gb"',
            "--slices",
            MIG_SLICES,
            "-o",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(report["devices"]) == 52
    assert {
        "node": report["devices"][0]["node"],
        "device": "gpu-0000-07-00-0",
        "result": report["devices"][0]["result"],
    } in report["devices"]


def test_selector_mode_rejects_invalid_cel(capsys):
    assert main(["explain", "--selector", "device.nope", "--slices", SLICES]) == 2
    assert "undefined field 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["text", "json"])
def test_selector_mode_exit_one_when_nothing_matches(capsys, output):
    assert main(["explain", "--selector", "false", "--slices", SLICES, "-o", output]) == 1


def test_a_count_below_one_is_bad_input_naming_the_field(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path, name="zero", count=0), "--slices", SLICES])
    captured = capsys.readouterr()
    assert code == 2
    assert "spec.devices.requests[0].exactly.count" in captured.err


HEAD = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\nspec:\n  devices:\n"
REQUEST = "    requests:\n    - {name: a, exactly: {deviceClassName: gpu.dradriver.dev%s}}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEAD + "    requests: 3\n", "#1: spec.devices.requests: expected a list, got a number"),
        (HEAD + "    requests: [gpu]\n", "#1: spec.devices.requests[0]: expected a mapping, got a string"),
        (HEAD + REQUEST % ", selectors: 'device.x'", "spec.devices.requests[0].exactly.selectors: expected a list"),
        (HEAD + REQUEST % ", selectors: [{cel: x}]", "selectors[0].cel: expected a mapping, got a string"),
        (HEAD + REQUEST % ", count: two", "exactly.count: expected a whole number, got a string"),
        (HEAD + REQUEST % ", count: 1.5", "exactly.count: expected a whole number, got a number"),
        (HEAD + REQUEST % ", tolerations: [{operator: Maybe}]", "operator: 'Maybe' is not one of Equal, Exists"),
        (HEAD + REQUEST % ", capacity: {requests: {memory: [1]}}", "expected a quantity like 10Gi, got a list"),
        (HEAD + REQUEST % "" + REQUEST.replace("    requests:\n", "") % "", "request name 'a' is used twice"),
        (HEAD + "    requests:\n    - {name: a, firstAvailable: xyz}\n", "firstAvailable: expected a list"),
        (HEAD + REQUEST % "" + "    constraints: oops\n", "spec.devices.constraints: expected a list, got a string"),
        (
            HEAD + REQUEST % "" + "    config: [{opaque: {driver: d, parameters: 5}}]\n",
            "parameters: expected a mapping",
        ),
        (HEAD.replace("{name: bad}", "[bad]") + "    requests: []\n", "#1: metadata: expected a mapping, got a list"),
        (HEAD.replace("{name: bad}", "{name: 5}") + "    requests: []\n", "metadata.name: expected a string"),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: t}\nspec: {spec: x}\n",
            "spec.spec",
        ),
        ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaimList\nitems: x\n", "#1: items: expected a list"),
        ("kind: [1]\n", "#1: kind [1] is not one of"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 100 levels"),
        ("&a [*a]\n", "expands to more than"),
        ("a:\n\tb: 1\n", "not valid YAML: line 2, column 1"),
    ],
)
def test_careless_claims_are_one_error_line_naming_the_field(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["explain", str(path), "--slices", SLICES]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: {path}")
    assert message in err


def test_a_file_that_is_not_utf8_is_one_error(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"metadata: {name: caf\xe9}\n")
    assert main(["explain", str(path), "--slices", SLICES]) == 2
    assert "not UTF-8 text (byte 0xe9" in capsys.readouterr().err


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null"])
def test_special_files_are_refused_not_read(capsys, special):
    assert main(["explain", special, "--slices", SLICES]) == 2
    assert f"error: {special}: not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--slices", "--classes", "--allocated"])
def test_every_input_flag_goes_through_the_same_loader(tmp_path, capsys, flag):
    claim = write_claim(tmp_path)
    args = ["explain", claim, flag, "/dev/zero"] + (["--slices", SLICES] if flag != "--slices" else [])
    assert main(args) == 2
    assert "error: /dev/zero: not a regular file" in capsys.readouterr().err


def test_an_invalid_document_is_reported_and_the_others_still_explained(tmp_path, capsys):
    good = CLAIM % {"name": "good", "cls": "gpu.dradriver.dev", "count": 1, "expr": "true"}
    path = tmp_path / "mixed.yaml"
    path.write_text(HEAD + "    requests: 3\n---\n" + good)
    assert main(["explain", str(path), "--slices", SLICES]) == 2
    captured = capsys.readouterr()
    assert "#1: spec.devices.requests: expected a list" in captured.err
    assert "ResourceClaim default/good" in captured.out and "fits" in captured.out


def test_a_claim_without_namespace_is_in_default_as_with_kubectl(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(HEAD.replace("{name: bad}", "{name: nons}") + REQUEST % "")
    assert main(["explain", str(path), "--slices", SLICES]) == 0
    assert "ResourceClaim default/nons" in capsys.readouterr().out


def test_kubeconfig_for_pod_goes_through_the_loader(capsys):
    assert main(["explain", "--pod", "default/p", "--kubeconfig", "/dev/zero"]) == 2
    assert "explain: error: --kubeconfig /dev/zero: not a regular file" in capsys.readouterr().err


SLICE = (
    "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n  driver: gpu.dradriver.dev\n"
    "  nodeName: n\n  pool: {name: n, generation: 1, resourceSliceCount: 1}\n"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SLICE + "  devices: x\n", "spec.devices: expected a list, got a string"),
        (SLICE + "  devices: [1]\n", "spec.devices[0]: expected a mapping, got a number"),
        (SLICE + "  devices: [{name: d, attributes: [1]}]\n", "spec.devices[0].attributes: expected a mapping"),
        (SLICE + "  devices: [{name: d, attributes: {a: 5}}]\n", "spec.devices[0].attributes.a: expected a mapping"),
        (SLICE + "  devices: [{name: d, capacity: {m: {value: [1]}}}]\n", "capacity.m.value: expected a quantity"),
        (SLICE + "  devices: [{name: d, consumesCounters: x}]\n", "consumesCounters: expected a list"),
        (SLICE.replace("pool: {name: n, generation: 1, resourceSliceCount: 1}", "pool: n"), "spec.pool: expected a"),
        (SLICE.replace("nodeName: n", "nodeName: 5"), "spec.nodeName: expected a string, got a number"),
        (SLICE + "  sharedCounters: x\n", "spec.sharedCounters: expected a list, got a string"),
        (SLICE + "  devices: [{name: d}, {name: d}]\n", "device d is listed twice"),
    ],
)
def test_careless_slices_are_one_error_naming_the_field(tmp_path, capsys, text, message):
    slices = tmp_path / "slices.yaml"
    slices.write_text(text)
    assert main(["explain", write_claim(tmp_path), "--slices", str(slices)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"error: {slices} #1: " in err and message in err


@pytest.mark.parametrize(
    ("path", "message"),
    [("a" * 5000, "cannot look it up: File name too long"), ("bad\0name", "a path cannot contain a NUL character")],
)
def test_paths_the_system_cannot_look_up_are_one_error(capsys, path, message):
    assert main(["explain", path, "--slices", SLICES]) == 2
    assert message in capsys.readouterr().err


def test_a_selector_longer_than_the_api_server_accepts_is_refused(capsys):
    assert main(["explain", "--selector", "true && " * 2000 + "true", "--slices", SLICES]) == 2
    assert "--selector: 16004 characters; the API server accepts at most 10240" in capsys.readouterr().err


def test_classes_that_hold_no_device_class_are_invalid_input(tmp_path, capsys):
    # --classes was given, so falling back to dradriver's classes (and saying none were given) would be wrong.
    empty = tmp_path / "classes"
    empty.mkdir()
    code = main(["explain", write_claim(tmp_path), "--slices", SLICES, "--classes", str(empty)])
    captured = capsys.readouterr()
    assert code == 2
    assert "no DeviceClass found in" in captured.err
    assert "no --classes given" not in captured.out


def test_a_node_without_devices_says_which_nodes_have_some(tmp_path, capsys):
    code = main(["explain", write_claim(tmp_path), "--slices", SLICES, "--node", "node-x"])
    out = capsys.readouterr().out
    assert code == 1
    assert "no ResourceSlice offers devices on node node-x" in out
    assert "node-a" in out


NODE_SELECTED_SLICES = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: sa}
spec:
  driver: gpu.dradriver.dev
  pool: {name: pa, generation: 1, resourceSliceCount: 1}
  nodeSelector:
    nodeSelectorTerms:
    - matchFields: [{key: metadata.name, operator: In, values: [node-a]}]
  devices:
  - name: g0
    attributes: {type: {string: gpu}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: sb}
spec:
  driver: gpu.dradriver.dev
  pool: {name: pb, generation: 1, resourceSliceCount: 1}
  perDeviceNodeSelection: true
  devices:
  - name: g1
    nodeName: node-b
    attributes: {type: {string: gpu}}
"""


def test_devices_of_two_nodes_never_go_to_one_claim(tmp_path, capsys):
    # The scheduler allocates a claim for one node; nodes named by node selectors and per-device nodeName
    # count as nodes, not only slices' spec.nodeName.
    slices = tmp_path / "slices.yaml"
    slices.write_text(NODE_SELECTED_SLICES)
    code = main(["explain", write_claim(tmp_path, count=2), "--slices", str(slices)])
    out = capsys.readouterr().out
    assert code == 1
    assert "does NOT fit on node node-a" in out
    assert "node-b: does not fit" in out
    assert main(["explain", write_claim(tmp_path, count=1), "--slices", str(slices)]) == 0
    assert "fits on node node-a" in capsys.readouterr().out


CONFIG = """    config:
    - requests: ["gpu"]
      opaque:
        driver: %(driver)s
        parameters: {apiVersion: gpu.dradriver.dev/v1alpha1, kind: GpuConfig, computeMode: %(mode)s}
"""


def test_a_malformed_opaque_config_is_reported_with_its_field_path(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        CLAIM % {"name": "c", "cls": "gpu.dradriver.dev", "count": 1, "expr": "true"}
        + CONFIG % {"driver": "gpu.dradriver.dev", "mode": "Shared"}
    )
    code = main(["explain", str(path), "--slices", SLICES])
    err = capsys.readouterr().err
    assert code == 2
    assert "field spec.devices.config[0].opaque.parameters: GpuConfig: computeMode: 'Shared' is not allowed" in err


def test_good_and_foreign_opaque_configs_are_explained(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        CLAIM % {"name": "c", "cls": "gpu.dradriver.dev", "count": 1, "expr": "true"}
        + CONFIG % {"driver": "gpu.dradriver.dev", "mode": "ExclusiveProcess"}
        + (CONFIG % {"driver": "other.example.com", "mode": "Shared"}).split("\n", 1)[1]
    )
    assert main(["explain", str(path), "--slices", SLICES]) == 0


def test_a_misspelt_field_is_refused_as_the_api_server_refuses_it_not_answered(tmp_path, capsys):
    # `selector:` for `selectors:` would select every device: the cluster refuses the claim, so explain must too.
    expr = 'device.attributes["gpu.dradriver.dev"].productName == "NVIDIA H100 80GB HBM3"'
    path = write_claim(tmp_path, expr=expr)
    Path(path).write_text(Path(path).read_text().replace("selectors:", "selector:"))
    code = main(["explain", path, "--slices", SLICES])
    captured = capsys.readouterr()
    assert code == 2
    assert "fits" not in captured.out
    assert captured.err.strip() == (
        f'error: {path} #1: unknown field "spec.devices.requests[0].exactly.selector" (the API server refuses it); '
        'did you mean "selectors"?'
    )


def test_two_claims_pasted_without_a_separator_are_refused_not_merged(tmp_path, capsys):
    path = tmp_path / "two.yaml"
    path.write_text((CLAIM % {"name": "one", "cls": "gpu.dradriver.dev", "count": 1, "expr": "true"}).lstrip() * 2)
    code = main(["explain", str(path), "--slices", SLICES])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith(f'error: {path}: line 13: duplicate field "apiVersion" (first at line 1)')


def test_without_classes_explain_assumes_exactly_the_classes_the_chart_installs(tmp_path, capsys):
    import yaml

    from dradriver.cli.explain_input import chart_classes
    from dradriver.computedomain import api as compute_domain

    installed = [
        doc["metadata"]["name"]
        for path in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    domains = [c["metadata"]["name"] for c in compute_domain.device_classes()]
    assert len(installed) == 10
    assert sorted(c["metadata"]["name"] for c in chart_classes()) == sorted(installed + domains)
    # A per-profile MIG class (scenarios 07 and 08) exists without --classes, as on a default install.
    path = write_claim(tmp_path, cls="mig-1g.10gb.dradriver.dev")
    code = main(["explain", path, "--sim-profile", "dgx-a100-80gb", "--mig-mode", "dynamic"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "mig-{1g.5gb,3g.20gb,1g.10gb,2g.20gb,3g.40gb,1g.12gb,1g.18gb,3g.71gb}.dradriver.dev" in out


V1BETA1_SPEC = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "deviceClassName": "gpu.dradriver.dev",
                "count": 2,
                "selectors": [
                    {
                        "cel": {
                            "expression": 'device.attributes["gpu.dradriver.dev"].productName'
                            ' == "NVIDIA A100-SXM4-80GB"'
                        }
                    }
                ],
            }
        ]
    }
}


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_v1beta1_claim_is_read_as_the_api_server_converts_it(tmp_path, capsys, kind):
    # Users of Kubernetes 1.32 write v1beta1: fields v1 nests under `exactly` sit on the request itself.
    import yaml

    spec = {"spec": V1BETA1_SPEC} if kind == "ResourceClaimTemplate" else V1BETA1_SPEC
    path = tmp_path / "old.yaml"
    obj = {"apiVersion": "resource.k8s.io/v1beta1", "kind": kind, "metadata": {"name": "old"}, "spec": spec}
    path.write_text(yaml.safe_dump(obj))
    code = main(["explain", str(path), "--slices", SLICES, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    [claim] = data["claims"]
    assert claim["source"] == f"{path} #1 (read as resource.k8s.io/v1)"
    assert [r["device"] for r in claim["report"]["allocation"]["devices"]["results"]] == [
        "gpu-0000-07-00-0",
        "gpu-0000-0f-00-0",
    ]


def test_a_v1beta2_claim_is_read_and_checked_by_its_own_schema(tmp_path, capsys):
    path = write_claim(tmp_path)
    Path(path).write_text(Path(path).read_text().replace("resource.k8s.io/v1", "resource.k8s.io/v1beta2"))
    assert main(["explain", path, "--slices", SLICES]) == 0
    Path(path).write_text(Path(path).read_text().replace("count:", "cuont:"))
    assert main(["explain", path, "--slices", SLICES]) == 2
    assert 'unknown field "spec.devices.requests[0].exactly.cuont"' in capsys.readouterr().err


def test_an_api_version_the_server_does_not_serve_names_those_it_does(tmp_path, capsys):
    path = write_claim(tmp_path)
    Path(path).write_text(Path(path).read_text().replace("resource.k8s.io/v1", "resource.k8s.io/v1alpha3"))
    assert main(["explain", path, "--slices", SLICES]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "ResourceClaim uses resource.k8s.io/v1alpha3; the API server serves resource.k8s.io/v1, "
            "resource.k8s.io/v1beta2, resource.k8s.io/v1beta1 (field apiVersion)"
        )
    )


def test_a_claim_that_fits_only_under_another_node_setting_says_which_flag_and_chart_value(tmp_path, capsys):
    # MIG devices of a profile no GPU is carved into today: they exist only with dynamic MIG, not the chart's static.
    path = write_claim(tmp_path, cls="mig-2g.20gb.dradriver.dev")
    code = main(["explain", path, "--sim-profile", "dgx-a100-80gb", "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["claims"][0]["wouldFitWith"] == ["--mig-mode dynamic (chart value gpu.migMode: dynamic)"]
    assert data["assumptions"][1] == (
        "simulated node dgx-a100-80gb as the chart's defaults unless set: --mig-mode static (gpu.migMode), "
        "--gpu-sharing exclusive (gpu.sharing), --kubernetes-version 1.35 (the chart's kubernetesVersion, read from "
        "the API server when unset)"
    )
    assert main(["explain", path, "--sim-profile", "dgx-a100-80gb", "--mig-mode", "dynamic"]) == 0
    assert "would fit with" not in capsys.readouterr().out


def test_a_claim_no_setting_makes_fit_gets_no_would_fit_line(tmp_path, capsys):
    path = write_claim(tmp_path, count=9)  # eight GPUs on the node, whatever its settings
    assert main(["explain", path, "--sim-profile", "dgx-a100-80gb"]) == 1
    assert "would fit with" not in capsys.readouterr().out


def test_slices_made_for_an_older_release_are_read_under_its_rules(tmp_path, capsys):
    assert main(["inventory", "--gpu-backend", "sim", "--sim-profile", "mixed", "--mig-mode", "dynamic",
                 "--kubernetes-version", "1.34", "-o", "slices"]) == 0  # fmt: skip
    path = tmp_path / "slices-1.34.yaml"
    path.write_text(capsys.readouterr().out)
    claim = write_claim(tmp_path, cls="mig.dradriver.dev")
    assert main(["explain", claim, "--slices", str(path)]) == 2
    assert "add --kubernetes-version 1.34" in capsys.readouterr().err
    assert main(["explain", claim, "--slices", str(path), "--kubernetes-version", "1.34"]) == 0


def test_a_node_setting_the_release_cannot_take_is_refused_as_run_refuses_it(tmp_path, capsys):
    args = ["--sim-profile", "mixed", "--mig-mode", "dynamic", "--kubernetes-version", "1.32"]
    assert main(["explain", write_claim(tmp_path), *args]) == 2
    assert "--mig-mode dynamic needs shared counters" in capsys.readouterr().err


def test_a_v1beta1_request_with_both_shapes_is_refused_as_the_api_server_refuses_it(tmp_path, capsys):
    import yaml

    request = {"name": "gpu", "deviceClassName": "gpu.dradriver.dev", "count": 2}
    request["firstAvailable"] = [{"name": "one", "deviceClassName": "gpu.dradriver.dev"}]
    obj = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "both"}}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump({**obj, "spec": {"devices": {"requests": [request]}}}))
    assert main(["explain", str(path), "--slices", SLICES]) == 2
    assert "exactly one of exactly or firstAvailable" in capsys.readouterr().err


def test_a_dash_reads_the_claims_from_standard_input(tmp_path, monkeypatch, capsys):
    import io

    text = (CLAIM % {"name": "piped", "cls": "gpu.dradriver.dev", "count": 1, "expr": "true"}).encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text)))
    assert main(["explain", "-", "--slices", SLICES]) == 0
    assert "ResourceClaim default/piped (standard input #1): fits on node node-a" in capsys.readouterr().out


def test_sharing_settings_run_refuses_are_refused_here_too(tmp_path, capsys):
    args = ["--sim-profile", "dgx-a100-80gb", "--gpu-sharing", "consumable", "--consumable-shares", "4"]
    assert main(["explain", write_claim(tmp_path), *args]) == 2
    assert "two ways to share GPUs; choose one" in capsys.readouterr().err


def test_a_misspelt_attribute_in_a_selector_gets_the_nearest_the_devices_have(tmp_path, capsys):
    expr = 'device.attributes["gpu.dradriver.dev"].prodctName == "NVIDIA A100-SXM4-80GB"'
    assert main(["explain", write_claim(tmp_path, expr=expr), "--slices", SLICES]) == 1
    out = capsys.readouterr().out
    assert "(the device has no attribute gpu.dradriver.dev/prodctName); did you mean " + '"productName"?' in out
