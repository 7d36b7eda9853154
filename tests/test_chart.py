"""The Helm chart (deployments/helm/dradriver) judged by the real helm: it lints strictly with every preset,
installs only on the Kubernetes releases it supports, refuses wrong values at install naming the value (its
values.schema.json), and every value reaches the objects it promises. The objects themselves are checked with
the kustomize overlays in tests/test_manifests.py."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml
from support.helm import CHART, NAMESPACE, PRESETS, RELEASE, preset_file, run_helm, template

from dradriver.cli.flags.env import resolve_env_values
from dradriver.cli.main import build_parser

VERSION = tomllib.loads((CHART.parents[2] / "pyproject.toml").read_text())["project"]["version"]


def objects_with(*values: str) -> tuple[dict[str, Any], ...]:
    return template(*[a for v in values for a in ("--set", v)])


def daemonset(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == "DaemonSet"]
    return found


def container_env(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    [container] = daemonset(objects)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_the_chart_lints_strictly(preset: str | None) -> None:
    done = run_helm("lint", "--strict", str(CHART), *(["-f", preset_file(preset)] if preset else []))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_the_chart_with_compute_domains_lints_strictly_and_renders(preset: str | None) -> None:
    args = [*(["-f", preset_file(preset)] if preset else []), "--set", "computeDomains.enabled=true"]
    done = run_helm("lint", "--strict", str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {(o["kind"], o["metadata"]["name"]) for o in template(*args)}
    assert {
        ("Deployment", "dradriver-compute-domain-controller"),
        ("DeviceClass", "compute-domain-default-channel.dradriver.dev"),
        ("DeviceClass", "compute-domain-daemon.dradriver.dev"),
        ("ClusterRole", "dradriver-compute-domain-controller"),
        ("ClusterRole", "dradriver-compute-domain-plugin"),
        ("Role", "dradriver-compute-domain-daemon"),
    } <= kinds
    assert container_env(template(*args))["DRADRIVER_COMPUTE_DOMAINS"] == "true"


def test_compute_domain_controller_settings_reach_its_pod_and_through_it_the_daemons() -> None:
    def controller(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
        [found] = [o for o in objects if o["kind"] == "Deployment"]
        pod: dict[str, Any] = found["spec"]["template"]["spec"]
        return pod

    plain = controller(objects_with("computeDomains.enabled=true"))
    assert not {"hostNetwork", "nodeSelector", "tolerations"} & set(plain)
    [container] = plain["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["DRADRIVER_CD_DAEMON_HOST_NETWORK"], env["DRADRIVER_CD_DAEMON_ENV"]) == ("false", "[]")
    pod = controller(
        objects_with(
            "computeDomains.enabled=true", "computeDomains.hostNetwork=true",
            "computeDomains.controllerNodeSelector.pool=system",
            "computeDomains.controllerTolerations[0].operator=Exists",
            "computeDomains.extraEnv[0].name=KUBERNETES_SERVICE_HOST", "computeDomains.extraEnv[0].value=127.0.0.1",
        )
    )  # fmt: skip
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert (pod["nodeSelector"], pod["tolerations"]) == ({"pool": "system"}, [{"operator": "Exists"}])
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["DRADRIVER_CD_DAEMON_HOST_NETWORK"] == "true"
    assert json.loads(env["DRADRIVER_CD_DAEMON_ENV"]) == [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}]
    # Every DRADRIVER_ variable is one `dradriver cd-controller` reads.
    shown = subprocess.run([sys.executable, "-m", "dradriver", "cd-controller", "--help"], capture_output=True,
                           text=True, check=True, timeout=60)  # fmt: skip
    controller_help = " ".join(shown.stdout.split())
    for name in env:
        if name.startswith("DRADRIVER_"):
            assert f"[env {name}]" in controller_help, f"dradriver cd-controller reads no {name}"


def test_the_chart_versions_are_the_drivers() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    [container] = daemonset(template())["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"dradriver:{VERSION}"


@pytest.mark.parametrize("version", ["1.32.0", "1.33.5", "1.34.0", "1.35.2", "1.36.0", "1.37.2", "1.34.1-gke.1200"])
def test_the_supported_kubernetes_releases_install(version: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", version)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("version", ["1.30.4", "1.31.0"])
def test_releases_without_a_resource_k8s_io_version_the_driver_speaks_are_refused(version: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", version)
    assert done.returncode != 0
    assert ">=1.32.0-0" in done.stderr, done.stderr


# The newest resource.k8s.io version each release has (helm template lists every version it knows as served, so
# the release decides; a real install asks the API server, tests/cluster/test_older_api_server.py).
DEVICE_CLASS_VERSIONS = {"1.32.3": "v1beta1", "1.33.5": "v1beta2", "1.34.0": "v1", "1.37.2": "v1"}


@pytest.mark.parametrize(("version", "api"), sorted(DEVICE_CLASS_VERSIONS.items()))
@pytest.mark.parametrize("compat", ["none", "nvidia"])
def test_device_classes_use_the_newest_resource_api_the_release_has(version: str, api: str, compat: str) -> None:
    # ComputeDomains (their two classes too) need v1: on where the release has it.
    domains = "true" if api == "v1" else "false"
    objects = template(
        "--kube-version", version, "--set", f"compat={compat}", "--set", f"computeDomains.enabled={domains}"
    )
    classes = [o for o in objects if o["kind"] == "DeviceClass"]
    assert len(classes) >= 2
    assert {c["apiVersion"] for c in classes} == {f"resource.k8s.io/{api}"}
    # extendedResourceName (the device-plugin bridge) exists in v1 only: older versions would refuse the field.
    bridged = {c["metadata"]["name"] for c in classes if "extendedResourceName" in c["spec"]}
    gpu_class = "gpu.nvidia.com" if compat == "nvidia" else "gpu.dradriver.dev"
    assert (gpu_class in bridged) == (api == "v1")
    if api != "v1":
        assert not bridged


TOO_OLD = [
    ("1.32.9", "gpu.migMode=dynamic", "set gpu.migMode=static"),
    ("1.33.5", "gpu.consumableShares=4", "leave gpu.consumableShares empty"),
    ("1.33.5", "gpu.consumableShares=memory", "leave gpu.consumableShares empty"),
    ("1.32.0", "gpu.sharing=consumable", "set gpu.sharing=exclusive"),
    ("1.35.0", "listAttributes=true", "set listAttributes=false"),
    ("1.33.5", "computeDomains.enabled=true", "set computeDomains.enabled=false"),
]


@pytest.mark.parametrize(("version", "value", "fix"), TOO_OLD, ids=[f"{v}-{s}" for v, s, _ in TOO_OLD])
def test_a_value_the_release_cannot_take_fails_naming_it_and_the_fix(version: str, value: str, fix: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", version, "--set", value)
    assert done.returncode != 0, f"--set {value} was accepted on {version}"
    assert value in done.stderr and f"Kubernetes v{version}" in done.stderr and fix in done.stderr, done.stderr


FIRST_RELEASE = [
    ("1.33.0", "gpu.migMode=dynamic"),
    ("1.34.0", "gpu.consumableShares=4"),
    ("1.36.0", "listAttributes=true"),
]


@pytest.mark.parametrize(("version", "value"), FIRST_RELEASE)
def test_the_same_values_install_from_the_release_that_has_them(version: str, value: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", version, "--set", value)
    assert done.returncode == 0, done.stderr


HOSTILE = [
    ("gpu.migMode=turbo", "migMode"),
    ("gpu.backend=cuda", "backend"),
    ("gpu.sharing=shared", "sharing"),
    ("driverRoot=run/nvidia/driver", "driverRoot"),
    ("driverRoot=", "driverRoot"),
    ("containerDriverRoot=/", "containerDriverRoot"),
    ("cdiHookPath=usr/bin/nvidia-cdi-hook", "cdiHookPath"),
    ("cdiHookSource=nvidia-cdi-hook", "cdiHookSource"),
    ("waitForDriverSeconds=-30", "waitForDriverSeconds"),
    ("kubeletDir=var/lib/kubelet", "kubeletDir"),
    ("cdiDir=cdi", "cdiDir"),
    ("health.recoveryPeriodSeconds=-1", "recoveryPeriodSeconds"),
    ("health.taintEffect=Evict", "taintEffect"),
    ("health.ignoreXids={-13}", "ignoreXids"),
    ("rescanIntervalSeconds=-5", "rescanIntervalSeconds"),
    ("rescanIntervalSeconds=0.5", "rescanIntervalSeconds"),
    ("logging.level=trace", "level"),
    ("logging.format=xml", "format"),
    ("metrics.port=70000", "port"),
    ("metrics.port=0", "port"),
    ("image.repository=", "repository"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("driverName=GPU_Driver", "driverName"),
    ("deviceClasses.gpu.name=Not A Name", "name"),
    ("deviceClasses.migProfiles.profiles[0].profile=huge", "profile"),
    ("kubernetesVersion=v1.35", "kubernetesVersion"),
    ("namespaceOverride=Bad_NS", "namespaceOverride"),
    ("gpu.migmode=static", "migmode"),  # a typo is an unknown value, not a silent default
    ("claimDeviceStatus=yes", "claimDeviceStatus"),
    ("devicePluginCoexistence=share", "devicePluginCoexistence"),
]


@pytest.mark.parametrize(("value", "named"), HOSTILE, ids=[v for v, _ in HOSTILE])
def test_a_wrong_value_fails_the_install_naming_it(value: str, named: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--set", value)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


def test_the_schema_covers_every_value() -> None:
    """Every key of values.yaml has a schema entry (so additionalProperties: false refuses only typos)."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in values.items():
            assert key in node.get("properties", {}), f"{path}{key} has no schema"
            child = node["properties"][key]
            if isinstance(value, dict) and child.get("additionalProperties") is False:
                walk(value, child, f"{path}{key}.")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema, "")


@pytest.mark.parametrize("preset", PRESETS)
def test_the_daemonsets_environment_is_a_valid_dradriver_run_configuration(
    preset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each variable the chart sets is one `dradriver run` reads, with a value it accepts (a misspelt name would be
    ignored silently)."""
    variables = container_env(template("-f", preset_file(preset)))
    shown = subprocess.run([sys.executable, "-m", "dradriver", "run", "--help"], capture_output=True, text=True,
                           check=True, timeout=60)  # fmt: skip
    run_help = " ".join(shown.stdout.split())
    for name, value in variables.items():
        if name.startswith("DRADRIVER_"):
            assert f"[env {name}]" in run_help, f"dradriver run reads no {name}"
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.setenv("POD_UID", "0b7e3a53-6b0e-4c1e-9d47-1f9f6f5d2c11")
    args = build_parser(["run"]).parse_args(["run"])  # defaults come from the environment when the parser is built
    resolve_env_values(args)
    assert args.gpu_backend == ("sim" if preset == "sim" else "nvml")
    assert args.registry_dir == "/var/lib/kubelet/plugins_registry"


def test_every_run_setting_reaches_the_plugin() -> None:
    variables = container_env(
        objects_with(
            "gpu.migMode=dynamic", "gpu.sharing=consumable", "logging.format=json", "logging.level=debug",
            "health.ignoreXids={13,31}", "health.fatalXids={none}", "health.taintEffect=NoExecute",
            "health.recoveryPeriodSeconds=0", "health.taintFallback=keep", "rescanIntervalSeconds=0",
            "claimDeviceStatus=false", "deviceMetadata=true", "kubernetesVersion=1.35", "metrics.port=9400",
            "cdiHookPath=/usr/local/nvidia/toolkit/nvidia-cdi-hook", "driverName=gpu.example.com",
            "cdiHookSource=none", "waitForDriverSeconds=0",
        )
    )  # fmt: skip
    assert {k: v for k, v in variables.items() if isinstance(v, str) and k.startswith("DRADRIVER_")}.items() >= {
        "DRADRIVER_MIG_MODE": "dynamic",
        "DRADRIVER_GPU_SHARING": "consumable",
        "DRADRIVER_LOG_FORMAT": "json",
        "DRADRIVER_LOG_LEVEL": "debug",
        "DRADRIVER_HEALTH_IGNORE_XIDS": "13,31",
        "DRADRIVER_HEALTH_FATAL_XIDS": "none",
        "DRADRIVER_HEALTH_TAINT_EFFECT": "NoExecute",
        "DRADRIVER_HEALTH_RECOVERY_PERIOD": "0",
        "DRADRIVER_HEALTH_TAINT_FALLBACK": "keep",
        "DRADRIVER_RESCAN_INTERVAL": "0",
        "DRADRIVER_CLAIM_DEVICE_STATUS": "false",
        "DRADRIVER_DEVICE_METADATA": "true",
        "DRADRIVER_KUBERNETES_VERSION": "1.35",
        "DRADRIVER_METRICS_ADDRESS": ":9400",
        "DRADRIVER_NVIDIA_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        "DRADRIVER_CDI_HOOK_SOURCE": "none",
        "DRADRIVER_WAIT_FOR_DRIVER": "0",
        "DRADRIVER_DRIVER_NAME": "gpu.example.com",
        "DRADRIVER_PLUGIN_DIR": "/var/lib/kubelet/plugins/gpu.example.com",
    }.items()


def test_a_renamed_driver_renames_it_everywhere() -> None:
    objects = objects_with("driverName=gpu.example.com")
    text = yaml.safe_dump_all(objects)
    assert 'gpu.dradriver.dev"' not in text.replace("gpu.dradriver.dev/v1alpha1", "")
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    assert ["gpu.example.com"] in [r.get("resourceNames") for r in role["rules"]]
    classes = [o for o in objects if o["kind"] == "DeviceClass"]
    assert len(classes) >= 2
    assert all('device.driver == "gpu.example.com"' in c["spec"]["selectors"][0]["cel"]["expression"] for c in classes)


def test_a_custom_kubelet_directory_moves_every_kubelet_path() -> None:
    objects = objects_with("kubeletDir=/var/snap/microk8s/common/var/lib/kubelet")
    pod = daemonset(objects)["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    root = "/var/snap/microk8s/common/var/lib/kubelet"
    assert paths["plugins-registry"] == f"{root}/plugins_registry" and paths["plugins"] == f"{root}/plugins"
    assert container_env(objects)["DRADRIVER_REGISTRY_DIR"] == f"{root}/plugins_registry"
    assert paths["device-plugins"] == f"{root}/device-plugins"
    assert container_env(objects)["DRADRIVER_DEVICE_PLUGINS_DIR"] == f"{root}/device-plugins"


def test_nvidias_device_plugin_is_refused_by_default_and_withheld_while_a_node_pool_migrates() -> None:
    assert container_env(objects_with())["DRADRIVER_DEVICE_PLUGIN_COEXISTENCE"] == "refuse"
    objects = objects_with("devicePluginCoexistence=withhold")
    assert container_env(objects)["DRADRIVER_DEVICE_PLUGIN_COEXISTENCE"] == "withhold"
    [mount] = [m for m in daemonset(objects)["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
               if m["name"] == "device-plugins"]  # fmt: skip
    assert mount == {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins", "readOnly": True}


def test_device_classes_and_policies_can_be_left_out_or_renamed() -> None:
    kinds = {o["kind"] for o in objects_with("deviceClasses.gpu.enabled=false", "deviceClasses.mig.enabled=false",
             "deviceClasses.migProfiles.enabled=false", "admissionPolicies.ownNodeSlices=false",
             "admissionPolicies.opaqueConfig=false", "admissionPolicies.ownNodeLabels=false")}  # fmt: skip
    assert not kinds & {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    names = {
        o["metadata"]["name"]
        for o in objects_with("deviceClasses.gpu.name=gpu.example.com", "deviceClasses.migProfiles.nameSuffix=x.io")
        if o["kind"] == "DeviceClass"
    }
    assert {"gpu.example.com", "mig.dradriver.dev", "mig-1g.10gb.x.io"} <= names
    [gpu] = [
        o
        for o in objects_with("deviceClasses.gpu.extendedResourceName=")
        if o["metadata"]["name"] == "gpu.dradriver.dev"
    ]
    assert "extendedResourceName" not in gpu["spec"]


def test_names_follow_the_release_and_the_policy_follows_the_account() -> None:
    done = run_helm("template", "gpu", str(CHART), "--namespace", "gpus")
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    [account] = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert account["metadata"] == {**account["metadata"], "name": "gpu-dradriver-kubelet-plugin", "namespace": "gpus"}
    [policy] = [o for o in objects if o["metadata"]["name"] == "gpu-dradriver-resourceslices-own-node"
                and o["kind"] == "ValidatingAdmissionPolicy"]  # fmt: skip
    assert '":gpu-dradriver-kubelet-plugin"' in policy["spec"]["matchConditions"][0]["expression"]
    overridden = objects_with("fullnameOverride=gpud", "namespaceOverride=kube-system")
    assert daemonset(overridden)["metadata"]["name"] == "gpud-kubelet-plugin"
    assert daemonset(overridden)["metadata"]["namespace"] == "kube-system"
    assert "Namespace" not in {o["kind"] for o in template()}, "helm owns the release namespace (--create-namespace)"


def test_scheduling_and_pod_settings_reach_the_pod() -> None:
    objects = objects_with(
        "nodeSelector.pool=gpu", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
        "priorityClassName=gpu-critical", "imagePullSecrets[0].name=registry", "resources.limits.memory=1Gi",
        "image.repository=registry.example.com/dradriver", "image.tag=1.2.3", "image.pullPolicy=Always",
        "podAnnotations.team=gpu", "extraEnv[0].name=DRADRIVER_STATE_DIR", "extraEnv[0].value=/var/lib/dradriver",
        "extraVolumes[0].name=state", "extraVolumes[0].hostPath.path=/var/lib/dradriver",
        "extraVolumeMounts[0].name=state", "extraVolumeMounts[0].mountPath=/var/lib/dradriver",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=gpu",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )  # fmt: skip
    template_ = daemonset(objects)["spec"]["template"]
    pod = template_["spec"]
    [container] = pod["containers"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["priorityClassName"] == "gpu-critical"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    ]
    assert container["resources"]["limits"] == {"memory": "1Gi"}
    assert (container["image"], container["imagePullPolicy"]) == ("registry.example.com/dradriver:1.2.3", "Always")
    assert template_["metadata"]["annotations"] == {"team": "gpu"}
    assert container_env(objects)["DRADRIVER_STATE_DIR"] == "/var/lib/dradriver"
    assert pod["volumes"][-1] == {"name": "state", "hostPath": {"path": "/var/lib/dradriver"}}
    assert container["volumeMounts"][-1] == {"name": "state", "mountPath": "/var/lib/dradriver"}


def test_host_network_is_for_nodes_without_cni() -> None:
    assert "hostNetwork" not in daemonset(template())["spec"]["template"]["spec"]
    on_host = daemonset(objects_with("hostNetwork=true"))
    pod = on_host["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    # A surge pod would wait forever for the status port, a host port the old pod holds ("didn't have free ports
    # for the requested pod ports", seen with a real scheduler and kubelet): replace instead.
    assert on_host["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_a_service_monitor_scrapes_the_status_port_when_asked() -> None:
    assert not {o["kind"] for o in template()} & {"Service", "ServiceMonitor"}
    objects = objects_with("metrics.serviceMonitor.enabled=true", "metrics.port=9400",
                           "metrics.serviceMonitor.labels.release=prometheus")  # fmt: skip
    [service] = [o for o in objects if o["kind"] == "Service"]
    [monitor] = [o for o in objects if o["kind"] == "ServiceMonitor"]
    pod_labels = daemonset(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "status", "port": 9400, "targetPort": "status", "protocol": "TCP"}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "status"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_the_compute_domain_controller_serves_its_probes_and_metrics_on_its_own_port() -> None:
    objects = objects_with("computeDomains.enabled=true", "computeDomains.metricsPort=9500",
                           "metrics.serviceMonitor.enabled=true")  # fmt: skip
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DRADRIVER_METRICS_ADDRESS"] == ":9500"
    assert container["ports"] == [{"name": "status", "containerPort": 9500, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "status"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "status"}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = [o for o in objects if o["kind"] == "Service" and o["spec"]["selector"].items() <= pod_labels.items()]
    [monitor] = [o for o in objects if o["kind"] == "ServiceMonitor" and o["metadata"]["name"].endswith("controller")]
    assert [s["spec"]["ports"][0]["port"] for s in services] == [9500]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= services[0]["metadata"]["labels"].items()
    assert "strategy" not in deployment["spec"]  # surging is fine in the pod network
    # In the node's network the port is a host port: replace, never surge; and a long release name still fits.
    on_host = objects_with("computeDomains.enabled=true", "computeDomains.hostNetwork=true",
                           "metrics.serviceMonitor.enabled=true", "fullnameOverride=" + "x" * 40)  # fmt: skip
    [deployment] = [o for o in on_host if o["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    named = [o["metadata"]["name"] for o in on_host if o["kind"] in ("Service", "ServiceMonitor")]
    assert named and all(len(name) <= 63 for name in named), named


def test_the_grafana_dashboard_ships_as_a_configmap_for_the_sidecar_when_asked() -> None:
    assert "ConfigMap" not in {o["kind"] for o in template()}
    [dashboard] = [
        o
        for o in objects_with("metrics.grafanaDashboard.enabled=true", "metrics.grafanaDashboard.namespace=monitoring")
        if o["kind"] == "ConfigMap"
    ]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "dradriver.json").read_text())
    assert json.loads(dashboard["data"]["dradriver.json"]) == shipped


def test_the_pod_shares_the_hosts_pids_to_map_gpu_processes_to_pods() -> None:
    assert daemonset(template())["spec"]["template"]["spec"]["hostPID"] is True  # MPS daemons need it already
    alone = daemonset(objects_with("hostPID=true", "mps.outliveThePlugin=false"))["spec"]["template"]["spec"]
    assert alone["hostPID"] is True
    without = daemonset(objects_with("mps.outliveThePlugin=false"))["spec"]["template"]["spec"]
    assert "hostPID" not in without


def test_the_notes_say_what_to_check_next() -> None:
    done = run_helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} rollout status daemonset/dradriver-kubelet-plugin" in notes
    assert "dradriver doctor" in notes
    assert "kubectl get resourceslices" in notes
    sim = run_helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", preset_file("sim"))
    sim_notes = sim.stdout.split("NOTES:", 1)[1]
    # doctor checks a real driver: on simulated GPUs it would only report what a simulated node lacks.
    assert "SIMULATED" in sim_notes and "doctor" not in sim_notes and "2. See the devices" in sim_notes


def test_compat_nvidia_runs_under_nvidias_names_everywhere() -> None:
    from dradriver.driver.prepare.presets import NVIDIA

    objects = objects_with("compat=nvidia")
    variables = container_env(objects)
    assert variables["DRADRIVER_COMPAT"] == "nvidia"
    assert variables["DRADRIVER_DRIVER_NAME"] == "gpu.nvidia.com"
    assert variables["DRADRIVER_PLUGIN_DIR"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    classes = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "DeviceClass"}
    assert sorted(classes) == sorted(c["metadata"]["name"] for c in NVIDIA.device_classes())  # no per-profile ones
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        expression = " ".join(classes[name]["selectors"][0]["cel"]["expression"].split())
        assert (
            expression == f'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "{kind}"'
        )
    [policy] = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and "opaque" in o["metadata"]["name"]]
    assert policy["spec"]["variables"][0] == {"name": "driver", "expression": '"gpu.nvidia.com"'}
    # The slice policy and the claim-status RBAC name the driver too: nothing may still name ours.
    text = yaml.safe_dump_all(objects)
    assert "gpu.dradriver.dev" not in text.replace("gpu.dradriver.dev/v1alpha1", "").replace(
        "gpu.dradriver.dev.yaml", ""
    )


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "sim"])
def test_mps_daemons_are_started_outside_the_plugins_container(preset: str) -> None:
    # A daemon started from the container would die with it (its cgroup is killed on every restart or update):
    # the wrapper enters the host's namespaces and has systemd put the daemon into a scope of its own.
    objects = template("-f", preset_file(preset))
    wrapper = container_env(objects)["DRADRIVER_MPS_DAEMON_WRAPPER"].split()
    assert daemonset(objects)["spec"]["template"]["spec"]["hostPID"] is True
    assert wrapper[:4] == ["nsenter", "--target", "1", "--mount"]
    assert wrapper[wrapper.index("systemd-run") :][:2] == ["systemd-run", "--scope"]
    off = objects_with("mps.outliveThePlugin=false")
    assert "DRADRIVER_MPS_DAEMON_WRAPPER" not in container_env(off)
    assert "hostPID" not in daemonset(off)["spec"]["template"]["spec"]


def test_the_sim_preset_runs_its_mps_stand_in_in_the_container() -> None:
    objects = template("-f", preset_file("sim"))
    assert "DRADRIVER_MPS_DAEMON_WRAPPER" not in container_env(objects)
    assert "hostPID" not in daemonset(objects)["spec"]["template"]["spec"]


def test_consumable_shares_and_list_attributes_reach_the_plugin() -> None:
    variables = container_env(objects_with("gpu.consumableShares=4", "listAttributes=true"))
    assert variables["DRADRIVER_CONSUMABLE_SHARES"] == "4"
    assert variables["DRADRIVER_LIST_ATTRIBUTES"] == "true"
    done = run_helm("template", RELEASE, str(CHART), "--set", "gpu.consumableShares=lots")
    assert done.returncode != 0 and "consumableShares" in done.stderr
