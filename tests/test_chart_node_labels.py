"""The chart's GFD-compatible node labels (nodeLabels), judged by the real helm: off by default with no flag and no
hook, but `patch` on nodes narrowed by the ownNodeLabels admission policy (turned off, the labels an earlier run
wrote must still be removable); on, the plugin gets its flags, `patch` on nodes, the policy and a post-delete
hook Job that takes the labels off at `helm uninstall`, run like the plugin (image, tolerations, network, the
environment that reaches the API server). The policy's rules are tests/test_node_labels_policy.py's; the real
install and uninstall, tests/node/test_helm_install_node_labels.py's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
from support.helm import CHART, PRESETS, RELEASE, preset_file, run_helm, template

from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.main import build_parser

ON = "nodeLabels.enabled=true"
CLEANUP = "dradriver-node-labels-cleanup"  # release dradriver: the chart's name is not repeated
POLICY = "dradriver-nodes-own-labels"
HOOK = "helm.sh/hook"


def objects_with(*values: str) -> tuple[dict[str, Any], ...]:
    return template(*[a for v in values for a in ("--set", v)])


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def plugin_env(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [container] = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def node_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if r["apiGroups"] == [""] and "nodes" in r["resources"]]


def cleanup_pod(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    pod: dict[str, Any] = one(objects, "Job", CLEANUP)["spec"]["template"]["spec"]
    return pod


def test_off_by_default_with_no_flags_and_no_hook() -> None:
    default = objects_with()
    assert objects_with("nodeLabels.enabled=false", "nodeLabels.migStrategy=mixed") == default
    assert not [o for o in default if "node-labels" in o["metadata"]["name"]]
    assert not [o for o in default if HOOK in (o["metadata"].get("annotations") or {})]
    assert not {"DRADRIVER_NODE_LABELS", "DRADRIVER_NODE_LABELS_MIG_STRATEGY"} & plugin_env(default).keys()


def test_turned_off_again_the_plugin_may_still_remove_the_labels_under_the_policy() -> None:
    # `helm upgrade --set nodeLabels.enabled=false`: the restarted pods run --node-labels none, which removes the
    # labels the annotation lists; without patch (or with patch and no policy narrowing it) they would stay.
    for values in ((), ("nodeLabels.enabled=false",)):
        objects = objects_with(*values)
        plugin_role = one(objects, "ClusterRole", "dradriver-kubelet-plugin")
        assert [r["verbs"] for r in node_rules(plugin_role)] == [["get"], ["patch"]]
        assert one(objects, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]["policyName"] == POLICY
        one(objects, "ValidatingAdmissionPolicy", POLICY)
    # With the policy turned off nothing would narrow it: patch only while nodeLabels is on.
    unnarrowed = objects_with("admissionPolicies.ownNodeLabels=false")
    assert [r["verbs"] for r in node_rules(one(unnarrowed, "ClusterRole", "dradriver-kubelet-plugin"))] == [["get"]]
    assert not [o for o in unnarrowed if o["metadata"]["name"] == POLICY]


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_on_the_plugin_gets_its_flags_as_run_reads_them(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    variables = plugin_env(objects_with(ON, f"nodeLabels.migStrategy={strategy}"))
    assert (variables["DRADRIVER_NODE_LABELS"], variables["DRADRIVER_NODE_LABELS_MIG_STRATEGY"]) == ("gfd", strategy)
    shown = subprocess.run([sys.executable, "-m", "dradriver", "run", "--help"], capture_output=True, text=True,
                           check=True, timeout=60)  # fmt: skip
    run_help = " ".join(shown.stdout.split())
    for name in ("DRADRIVER_NODE_LABELS", "DRADRIVER_NODE_LABELS_MIG_STRATEGY"):
        assert f"[env {name}]" in run_help, f"dradriver run reads no {name}"
        monkeypatch.setenv(name, variables[name])
    args = build_parser(["run"]).parse_args(["run"])
    resolve_env_values(args)
    assert (str(args.node_labels), str(args.node_labels_mig_strategy)) == ("gfd", strategy)


def test_on_the_plugin_may_patch_nodes_and_the_policy_narrows_it() -> None:
    objects = objects_with(ON)
    plugin_role = one(objects, "ClusterRole", "dradriver-kubelet-plugin")
    assert [r["verbs"] for r in node_rules(plugin_role)] == [["get"], ["patch"]]
    policy = one(objects, "ValidatingAdmissionPolicy", POLICY)
    assert '":dradriver-kubelet-plugin"' in policy["spec"]["matchConditions"][0]["expression"]
    assert one(objects, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]["policyName"] == POLICY
    # The policy can be left out (a cluster before ServiceAccountTokenPodNodeInfo), the rest stays.
    without = objects_with(ON, "admissionPolicies.ownNodeLabels=false")
    assert not [o for o in without if o["metadata"]["name"] == POLICY]
    assert plugin_env(without)["DRADRIVER_NODE_LABELS"] == "gfd"
    plugin_role = one(without, "ClusterRole", "dradriver-kubelet-plugin")
    assert [r["verbs"] for r in node_rules(plugin_role)] == [["get"], ["patch"]]


def test_the_uninstall_hook_runs_after_its_account_and_rbac_and_all_go_once_it_succeeded() -> None:
    hooks = [o for o in objects_with(ON) if HOOK in (o["metadata"].get("annotations") or {})]
    assert sorted(o["kind"] for o in hooks) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    weights = {}
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert hook["metadata"]["name"] == CLEANUP
        assert annotations[HOOK] == "post-delete"
        assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
        weights[hook["kind"]] = int(annotations["helm.sh/hook-weight"])
    assert weights["ServiceAccount"] < weights["ClusterRoleBinding"] < weights["Job"]
    assert weights["ClusterRole"] < weights["ClusterRoleBinding"]
    role = one(tuple(hooks), "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "get", "patch"]}]
    binding = one(tuple(hooks), "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == CLEANUP
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CLEANUP, "namespace": "dradriver"}]


def test_the_hook_job_removes_the_labels_of_every_node_with_the_plugins_image() -> None:
    objects = objects_with(ON)
    job = one(objects, "Job", CLEANUP)
    assert job["metadata"]["namespace"] == "dradriver"
    assert job["spec"]["activeDeadlineSeconds"] > 0
    pod = cleanup_pod(objects)
    assert pod["serviceAccountName"] == CLEANUP and pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    [plugin] = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (plugin["image"], plugin["imagePullPolicy"])
    assert container["args"] == ["node-labels", "remove", "--all-nodes", "--driver-name", "gpu.dradriver.dev"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["tolerations"] == one(objects, "DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert "hostNetwork" not in pod


def test_the_hook_job_is_a_command_dradriver_takes() -> None:
    [container] = cleanup_pod(objects_with(ON))["containers"]
    args = build_parser(container["args"]).parse_args(container["args"])
    assert args.all_nodes is True and args.driver_name == "gpu.dradriver.dev"


@pytest.mark.parametrize(
    ("values", "driver"),
    [(["driverName=gpu.example.com"], "gpu.example.com"), (["compat=nvidia"], "gpu.nvidia.com")],
)
def test_the_hook_and_the_policy_follow_the_driver_name(values: list[str], driver: str) -> None:
    objects = objects_with(ON, *values)
    [container] = cleanup_pod(objects)["containers"]
    assert container["args"][-2:] == ["--driver-name", driver]
    policy = one(objects, "ValidatingAdmissionPolicy", POLICY)
    [annotation] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "ownAnnotation"]
    assert annotation == f'"{driver}/node-labels"'


def test_the_hook_job_reaches_the_api_server_as_the_plugin_does() -> None:
    objects = objects_with(
        ON, "hostNetwork=true", "nodeSelector.pool=gpu", "imagePullSecrets[0].name=registry",
        "extraEnv[0].name=KUBERNETES_SERVICE_HOST", "extraEnv[0].value=127.0.0.1",
        "extraVolumes[0].name=kubeconfig", "extraVolumes[0].secret.secretName=kubeconfig",
        "extraVolumeMounts[0].name=kubeconfig", "extraVolumeMounts[0].mountPath=/etc/kubeconfig",
        "extraVolumeMounts[1].name=plugins", "extraVolumeMounts[1].mountPath=/plugins",
    )  # fmt: skip
    pod = cleanup_pod(objects)
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert (pod["nodeSelector"], pod["imagePullSecrets"]) == ({"pool": "gpu"}, [{"name": "registry"}])
    [container] = pod["containers"]
    assert container["env"] == [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}]
    # Mounts of its extraVolumes only: "plugins" is a host path of the DaemonSet's, which the Job has not.
    assert container["volumeMounts"] == [{"name": "kubeconfig", "mountPath": "/etc/kubeconfig"}]
    assert pod["volumes"] == [{"name": "kubeconfig", "secret": {"secretName": "kubeconfig"}}]


def test_with_a_namespace_of_its_own_the_hook_runs_in_the_releases() -> None:
    """createNamespace: helm deletes that namespace with the release, before post-delete hooks run."""
    objects = template("--set", ON, "--set", "createNamespace=true", "--set", "namespaceOverride=gpu-system")
    assert one(objects, "DaemonSet")["metadata"]["namespace"] == "gpu-system"
    assert one(objects, "Job", CLEANUP)["metadata"]["namespace"] == "dradriver"
    assert one(objects, "ServiceAccount", CLEANUP)["metadata"]["namespace"] == "dradriver"
    assert one(objects, "ClusterRoleBinding", CLEANUP)["subjects"][0]["namespace"] == "dradriver"


def test_the_notes_show_the_labels_when_on() -> None:
    def notes(*values: str) -> str:
        done = run_helm("install", RELEASE, str(CHART), "--namespace", "dradriver", "--dry-run=client", *values)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("NOTES:", 1)[1]

    assert "kubectl get nodes -L nvidia.com/gpu.product" in notes("--set", ON)
    assert "nvidia.com/gpu.product" not in notes()


@pytest.mark.parametrize("version", ["1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"])
def test_on_every_object_passes_the_official_schemas_strictly(version: str) -> None:
    objects = template(
        "--kube-version", version, "--set", ON, "--set", "hostNetwork=true", "--set", "extraEnv[0].name=A",
        "--set", "extraEnv[0].value=b", "--set", "extraVolumes[0].name=k", "--set", "extraVolumes[0].emptyDir.medium=",
        "--set", "extraVolumeMounts[0].name=k", "--set", "extraVolumeMounts[0].mountPath=/k",
    )  # fmt: skip
    assert {o["kind"] for o in objects} >= {"Job", "ValidatingAdmissionPolicy"}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_on_the_chart_lints_strictly(preset: str | None) -> None:
    args = [*(["-f", preset_file(preset)] if preset else []), "--set", ON, "--set", "nodeLabels.migStrategy=mixed"]
    done = run_helm("lint", "--strict", str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("value", "named"),
    [("nodeLabels.migStrategy=both", "migStrategy"), ("nodeLabels.enabled=yes", "enabled"),
     ("nodeLabels.strategy=mixed", "strategy"), ("admissionPolicies.ownNodeLabels=on", "ownNodeLabels")],
)  # fmt: skip
def test_a_wrong_value_fails_the_install_naming_it(value: str, named: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--set", value)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr
