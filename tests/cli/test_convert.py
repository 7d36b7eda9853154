"""dradriver convert: the device plugin's documented configs and device-plugin style workloads become DRA objects
that explain fits on a simulated node and that are valid Kubernetes 1.37 objects; bad input is one line, exit 2."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dradriver.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/device-plugin"


def convert(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["convert", *[str(FIXTURES / a) if a.endswith(".yaml") else a for a in args]])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def objects(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def assert_valid_and_fits(text: str, tmp_path: Path, capsys, profile: str = "mixed") -> list[dict]:
    """Every object valid for Kubernetes 1.37 (strict), and every claim fits the simulated node by explain."""
    docs = objects(text)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    out = tmp_path / "converted.yaml"
    out.write_text(text)
    if any(d["kind"] in ("ResourceClaim", "ResourceClaimTemplate") for d in docs):
        code = main(["explain", str(out), "--sim-profile", profile, "--mig-mode", "dynamic"])
        explained = capsys.readouterr().out
        assert code == 0, explained
        assert " fits on node " in explained
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_limits_only_and_runtime_class_pods(capsys, tmp_path):
    code, out, err = convert(capsys, "limits-only-pod.yaml", "runtime-class-pod.yaml")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    templates = {t["metadata"]["name"]: t for t in by_kind(docs, "ResourceClaimTemplate")}
    request = templates["trainer-app-gpu"]["spec"]["spec"]["devices"]["requests"][0]
    assert request == {"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": 2}}
    pods = {p["metadata"]["name"]: p for p in by_kind(docs, "Pod")}
    trainer = pods["trainer"]["spec"]
    assert trainer["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "app-gpu"}]}
    assert trainer["resourceClaims"] == [{"name": "app-gpu", "resourceClaimTemplateName": "trainer-app-gpu"}]
    assert "runtimeClassName" not in pods["cuda-vectoradd"]["spec"]
    assert "runtimeClassName: nvidia removed" in out and "CDI, which needs no runtime class" in out
    assert not by_kind(docs, "DeviceClass")  # the chart's gpu.dradriver.dev serves them


def test_time_sliced_deployment_shares_one_claim(capsys, tmp_path):
    code, out, err = convert(capsys, "time-slicing-config.yaml", "time-sliced-deployment.yaml")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    (claim,) = by_kind(docs, "ResourceClaim")
    parameters = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert parameters == {
        "apiVersion": "gpu.dradriver.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "app-gpu", "resourceClaimName": claim["metadata"]["name"]}]
    assert "limits" not in pod["containers"][0]["resources"]
    assert "advertised 4 replicas of each device" in out and "--consumable-shares 4" in out


def test_mps_config_limits_threads_per_replica(capsys, tmp_path):
    code, out, err = convert(capsys, "mps-config.yaml", "time-sliced-deployment.yaml")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    (claim,) = by_kind(docs, "ResourceClaim")
    sharing = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]
    assert sharing == {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}
    assert "defaultPinnedDeviceMemoryLimit" in out  # what differs: no memory limit per replica


def test_mig_mixed_strategy_pod(capsys, tmp_path):
    code, out, err = convert(capsys, "mig-mixed-time-slicing-config.yaml", "mig-mixed-pod.yaml")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys, profile="dgx-a100-80gb")
    (template,) = by_kind(docs, "ResourceClaimTemplate")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly == {"deviceClassName": "mig-1g.10gb.dradriver.dev"}
    assert "config" not in template["spec"]["spec"]["devices"]  # time-slicing a MIG device sets nothing
    assert not by_kind(docs, "DeviceClass")  # the chart has mig-1g.10gb.dradriver.dev


def test_mig_profile_the_chart_lacks_gets_a_class(capsys, tmp_path):
    pod = yaml.safe_load((FIXTURES / "mig-mixed-pod.yaml").read_text())
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-2g.10gb": 1}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    assert main(["convert", str(tmp_path / "pod.yaml")]) == 0
    out = capsys.readouterr().out
    docs = assert_valid_and_fits(out, tmp_path, capsys, profile="dgx-a100-40gb")
    (device_class,) = by_kind(docs, "DeviceClass")
    assert device_class["metadata"]["name"] == "mig-2g.10gb.dradriver.dev"
    assert device_class["spec"]["extendedResourceName"] == "nvidia.com/mig-2g.10gb"


def test_mig_single_strategy_asks_for_any_mig_device(capsys, tmp_path):
    code, out, err = convert(capsys, "mig-single-config.yaml", "runtime-class-pod.yaml")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys, profile="dgx-a100-80gb")
    (template,) = by_kind(docs, "ResourceClaimTemplate")
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "mig.dradriver.dev"
    assert "migStrategy single" in out


def test_configmap_renamed_shared_resource(capsys, tmp_path):
    code, out, err = convert(capsys, "time-slicing-renamed-configmap.yaml", "shared-job.yaml", "--config", "shared")
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    (template,) = by_kind(docs, "ResourceClaimTemplate")  # a Job's pods each get a claim
    assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == (
        "TimeSlicing"
    )
    (job,) = by_kind(docs, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {"claims": [{"name": "work-gpu-shared"}]}
    assert "nvidia.com/gpu.shared: the plugin's name for shared nvidia.com/gpu" in out


def test_keep_limits_prints_only_the_classes_the_cluster_lacks(capsys, tmp_path):
    code, out, err = convert(
        capsys, "time-slicing-renamed-configmap.yaml", "shared-job.yaml", "--config", "shared", "--keep-limits"
    )
    assert code == 0, err
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    (device_class,) = docs  # the Job stays as written: not printed
    assert device_class["kind"] == "DeviceClass"
    assert device_class["spec"]["extendedResourceName"] == "nvidia.com/gpu.shared"
    assert device_class["spec"]["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "TimeSlicing"}
    # explain accepts the class: a claim of it fits
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.shared.dradriver.dev"}}]}
        },
    }
    (tmp_path / "claim.yaml").write_text(yaml.safe_dump(claim))
    code = main(["explain", str(tmp_path / "claim.yaml"), str(tmp_path / "converted.yaml"), "--sim-profile", "mixed"])
    assert code == 0, capsys.readouterr().out


def test_keep_limits_served_by_the_chart_prints_no_object(capsys, tmp_path):
    code, out, err = convert(capsys, "limits-only-pod.yaml", "mig-mixed-pod.yaml", "--keep-limits")
    assert code == 0, err
    assert objects(out) == []
    assert "nvidia.com/gpu: served by the chart's DeviceClass gpu.dradriver.dev" in out


def test_standard_input(capsys, tmp_path, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO((FIXTURES / "limits-only-pod.yaml").read_bytes())))
    assert main(["convert", "-"]) == 0
    assert by_kind(objects(capsys.readouterr().out), "ResourceClaimTemplate")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: v2\n", "field version: 'v2'"),
        (
            "version: v1\nflags: {migStrategy: half}\n",
            "field flags.migStrategy: 'half'; want one of none, single, mixed",
        ),
        (
            "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}\n",
            "field sharing.timeSlicing.resources[0].replicas: 0; want a whole number of at least 1",
        ),
        (
            "version: v1\nsharing: {timeSlicing: {renameByDefualt: true, resources: []}}\n",
            "field sharing.timeSlicing.renameByDefualt: unknown",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
            "  - name: a\n    resources: {limits: {nvidia.com/gpu: half}}\n",
            "field spec.containers[0].resources.limits[nvidia.com/gpu]: 'half'; want a whole number of devices",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
            "  - name: a\n    resources: {requests: {nvidia.com/gpu: '1.5'}}\n",
            "field spec.containers[0].resources.requests[nvidia.com/gpu]: '1.5'; want a whole number of devices",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, text, expected):
    path = tmp_path / "input.yaml"
    path.write_text(text)
    assert main(["convert", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and expected in err, err


def test_several_configs_need_config_flag(capsys):
    code, _out, err = convert(capsys, "time-slicing-renamed-configmap.yaml")
    assert code == 2
    assert "several device plugin configs (plain, shared); pick one with --config NAME" in err
    code, _out, err = convert(capsys, "time-slicing-renamed-configmap.yaml", "--config", "nope")
    assert code == 2 and "known: plain, shared" in err


def test_missing_file(capsys, tmp_path):
    assert main(["convert", str(tmp_path / "absent.yaml")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_commands_page_shows_real_output(capsys, monkeypatch):
    """docs/commands.md's convert example is what the command prints."""
    root = FIXTURES.parents[2]
    text = (root / "docs/commands.md").read_text()
    block = text.split("## `dradriver convert`", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    command, shown = block.split("\n", 1)
    monkeypatch.chdir(root)
    assert main(command.removeprefix("$ dradriver ").split()) == 0
    assert capsys.readouterr().out == shown


def test_migration_page_commands_run(capsys, tmp_path, monkeypatch):
    """The commands of docs/migrating-from-device-plugin.md run (on our fixtures in the names it uses)."""
    text = (FIXTURES.parents[2] / "docs/migrating-from-device-plugin.md").read_text()
    block = text.split("## `dradriver convert`", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    (tmp_path / "workloads").mkdir()
    (tmp_path / "device-plugin-config.yaml").write_text((FIXTURES / "time-slicing-config.yaml").read_text())
    for name in ("limits-only-pod.yaml", "time-sliced-deployment.yaml", "mig-mixed-pod.yaml"):
        (tmp_path / "workloads" / name).write_text((FIXTURES / name).read_text())
    monkeypatch.chdir(tmp_path)
    for line in block.splitlines():
        words = line.split("#")[0].split(">")[0].split()
        assert words[:2] == ["$", "dradriver"], line
        assert main(words[2:]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert objects(out) or "served by the chart's DeviceClass" in out, out  # --keep-limits: the chart's do


def _write_workloads(tmp_path: Path, *workloads: dict) -> str:
    path = tmp_path / "workloads.yaml"
    path.write_text(yaml.safe_dump_all(workloads))
    return str(path)


def _job(name: str, *containers: tuple[str, int], kind: str = "Job") -> dict:
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {"name": c, "image": "i", "resources": {"limits": {"nvidia.com/gpu": n}}} for c, n in containers
        ],
    }
    spec: dict = {"template": {"spec": pod}}
    if kind == "Deployment":
        pod["restartPolicy"] = "Always"
        spec = {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod}}
    return {
        "apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_long_names_keep_one_template_per_container(capsys, tmp_path):
    """(#35) A long workload name is not cut to 63 characters: two containers keep two templates and their counts."""
    name = "a-very-long-training-job-name-for-the-research-team-llm-70b"
    assert main(["convert", _write_workloads(tmp_path, _job(name, ("trainer", 4), ("tracker", 1)))]) == 0
    docs = assert_valid_and_fits(capsys.readouterr().out, tmp_path, capsys)
    templates = {t["metadata"]["name"]: t for t in by_kind(docs, "ResourceClaimTemplate")}
    assert set(templates) == {f"{name}-trainer-gpu", f"{name}-tracker-gpu"}
    assert templates[f"{name}-trainer-gpu"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4
    (job,) = by_kind(docs, "Job")
    claims = job["spec"]["template"]["spec"]["resourceClaims"]
    assert [c["resourceClaimTemplateName"] for c in claims] == [f"{name}-trainer-gpu", f"{name}-tracker-gpu"]


def test_names_past_the_limit_end_in_a_hash_and_stay_apart(capsys, tmp_path):
    name = "w" * 240
    assert main(["convert", _write_workloads(tmp_path, _job(name, ("trainer", 4), ("tracker", 1)))]) == 0
    docs = objects(capsys.readouterr().out)
    names = [t["metadata"]["name"] for t in by_kind(docs, "ResourceClaimTemplate")]
    assert len(set(names)) == 2 and all(len(n) <= 253 and n.startswith("w" * 200) for n in names), names
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_two_objects_of_one_name_are_refused(capsys, tmp_path):
    """Workload `a-b` container `c` and workload `a` container `b-c` would both make template `a-b-c-gpu`."""
    path = _write_workloads(tmp_path, _job("a-b", ("c", 1)), _job("a", ("b-c", 1)))
    assert main(["convert", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two objects would be ResourceClaimTemplate a-b-c-gpu" in err, err


def test_workloads_of_two_kinds_with_one_name_get_claims_of_their_own(capsys, tmp_path):
    """(#35) A Deployment `train` and a Job `train` each with container `main`: two templates, the kind in each name."""
    path = _write_workloads(tmp_path, _job("train", ("main", 1), kind="Deployment"), _job("train", ("main", 2)))
    assert main(["convert", path]) == 0
    docs = assert_valid_and_fits(capsys.readouterr().out, tmp_path, capsys)
    templates = {t["metadata"]["name"]: t for t in by_kind(docs, "ResourceClaimTemplate")}
    assert set(templates) == {"train-deployment-main-gpu", "train-job-main-gpu"}
    assert templates["train-job-main-gpu"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    (job,) = by_kind(docs, "Job")
    (claim,) = job["spec"]["template"]["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "train-job-main-gpu"


def _pod_with_init(init_gpus: int, main_gpus: int) -> dict:
    def container(name: str, gpus: int) -> dict:
        return {"name": name, "image": "i", "resources": {"limits": {"nvidia.com/gpu": gpus}}}

    spec = {"initContainers": [container("fetch", init_gpus)], "containers": [container("main", main_gpus)]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def test_an_init_container_shares_the_claim_of_an_app_container(capsys, tmp_path):
    """(#35) The kubelet handed an init container's GPU on to the app containers: init 1 + main 1 was one GPU."""
    assert main(["convert", _write_workloads(tmp_path, _pod_with_init(1, 1))]) == 0
    out = capsys.readouterr().out
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    (template,) = by_kind(docs, "ResourceClaimTemplate")
    assert template["metadata"]["name"] == "p-main-gpu"
    (pod,) = by_kind(docs, "Pod")
    assert pod["spec"]["resourceClaims"] == [{"name": "main-gpu", "resourceClaimTemplateName": "p-main-gpu"}]
    assert pod["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "main-gpu"}]}
    assert "init container fetch: nvidia.com/gpu: 1 uses claim main-gpu" in out


def test_an_init_container_asking_for_more_gets_its_own_claim_and_says_so(capsys, tmp_path):
    assert main(["convert", _write_workloads(tmp_path, _pod_with_init(2, 1))]) == 0
    out = capsys.readouterr().out
    docs = assert_valid_and_fits(out, tmp_path, capsys)
    assert {t["metadata"]["name"] for t in by_kind(docs, "ResourceClaimTemplate")} == {"p-main-gpu", "p-fetch-gpu"}
    (pod,) = by_kind(docs, "Pod")
    assert pod["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "fetch-gpu"}]}
    assert "the pod now needs more GPUs than under the device plugin" in " ".join(out.replace("#", " ").split())


@pytest.mark.parametrize("quantity", ["2", "2.0", 2.0, "2000m", "2e0"])
def test_a_whole_quantity_in_any_spelling_is_a_count(capsys, tmp_path, quantity):
    """(#35) The API server takes "2.0" or "2000m" for an extended resource (a whole value): so does convert."""
    pod = _pod_with_init(1, 1)
    del pod["spec"]["initContainers"]
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    assert main(["convert", _write_workloads(tmp_path, pod)]) == 0, capsys.readouterr().err
    docs = assert_valid_and_fits(capsys.readouterr().out, tmp_path, capsys)
    (template,) = by_kind(docs, "ResourceClaimTemplate")
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
