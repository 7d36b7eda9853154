"""The Helm chart installed for real on the real node: `helm install` of the sim preset makes the DaemonSet's pod
run our image (scripts/build-image, imported into the node's containerd), register with the real kubelet and
publish the node's slices, and a scenario pod gets its device; `helm upgrade` with a changed value replaces the
pod while a pod with a prepared claim keeps running, and the new pod unprepares that claim later; `helm
uninstall` removes every object of the release, and the kubelet then wipes the driver's slices.

ComputeDomains are on (``computeDomains.enabled=true``): the CRDs are Established, the release's DeviceClasses,
RBAC and controller Deployment are there, the controller pod (our image, on this node, in its network) turns a
ComputeDomain written with kubectl into its claim templates and daemon DaemonSet and lets it go when it is
deleted; uninstall leaves the CRDs (helm never deletes CRDs) and the controller's Lease, nothing else.

GFD-compatible node labels are on (``nodeLabels.enabled=true``, MIG strategy mixed): the plugin pod labels the node
as `dradriver node-labels show` says it would (under the own-node labels admission policy), the labels follow the
MIG devices a scenario's claim carves and gives back, and `helm uninstall`'s post-delete hook Job (our image, on
this node, in its network) takes them and their annotation off again, then goes itself.

The node fixture's own driver (a host process) is stopped for this module and started again after it: the pod
takes its place, as a DaemonSet replacing a by-hand install would. The release owns the DeviceClasses while it
is installed (the session's copies, the same objects generated from the chart, are deleted before and applied
again after). The values are those a bare kubelet needs (docs/deployment.md, "On a bare kubelet"). Kustomize
overlays are not installed here: scripts/gen-manifests renders them from this chart and tests/test_manifests.py
fails when they differ, so this install covers what `kubectl apply -k manifests/overlays/sim` would run.

Each test finds the release installed and its plugin pod Ready (the ``release`` fixture installs it when none is,
as after the uninstall test) and makes what else it needs itself (the scenario pod: the ``scenario`` fixture), so
each passes alone and in any order."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster_pods import kubectl
from support.control_plane import free_port
from support.helm import CHART, preset_file, run_helm
from support.image import VERSION
from support.image import archive as image_archive
from support.node_pods import Workloads, cdi_specs_of, claims_of, documents, running, status_devices, unprepared
from support.real_node import TAINT_KEY, RealNode, wait_for

from dradriver.driver.publish.node_labels import OWNED_LABEL_PREFIXES

REPO = Path(__file__).resolve().parents[2]
RELEASE = "nodehelm"
NAMESPACE = "dradriver-node"
DAEMONSET = f"{RELEASE}-dradriver-kubelet-plugin"
CONTROLLER = f"{RELEASE}-dradriver-compute-domain-controller"
CRDS = ("computedomains.resource.dradriver.dev", "computedomaincliques.resource.dradriver.dev")
CD_EXAMPLE = REPO / "examples/computedomains/two-node-job.yaml"  # its ComputeDomain, without the Job
CD_NAME = "two-node-job"
CD_TEMPLATE = "two-node-job-channel"
CD_FINALIZER = "resource.dradriver.dev/computeDomain"
CD_CLASSES = ("compute-domain-default-channel.dradriver.dev", "compute-domain-daemon.dradriver.dev")
DRIVER = "gpu.dradriver.dev"
LABELS_ANNOTATION = f"{DRIVER}/node-labels"
CLEANUP = f"{RELEASE}-dradriver-node-labels-cleanup"
# Labels of the simulated node that no MIG device carved by a scenario changes.
STABLE_LABELS = ("nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory",
                 "nvidia.com/gpu.family", "nvidia.com/cuda.driver-version.full", "nvidia.com/mig.capable",
                 "nvidia.com/mig.strategy")  # fmt: skip
IMAGE = f"localhost/dradriver:{VERSION}"
SCENARIO = REPO / "examples/scenarios/01-one-gpu.yaml"
MIG_SCENARIO = REPO / "examples/scenarios/07-mig-partitions-one-parent.yaml"  # two 1g.5gb carved at prepare
DEVICE_CLASSES = REPO / "manifests/deviceclasses"
# kubelet 1.37 deletes a driver's slices 30 s after its last plugin instance unregistered.
WIPE_TIMEOUT = 90.0
ROLL_TIMEOUT = 180.0


class Chart:
    """The release on the node: helm and kubectl against the node's control plane, the values the node needs."""

    def __init__(self, node: RealNode, values: Path) -> None:
        self.node = node
        self.values = values
        self.workloads = Workloads(node)

    @property
    def kubeconfig(self) -> str:
        return str(self.node.control_plane.kubeconfig)

    def helm(self, *args: str) -> str:
        done = run_helm("--kubeconfig", self.kubeconfig, *args, timeout=300)
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n"
                                 f"{self.describe()}\n{self.node.tails(30)}")  # fmt: skip
        return done.stdout

    def installed(self) -> bool:
        return run_helm("--kubeconfig", self.kubeconfig, "status", RELEASE, "-n", NAMESPACE).returncode == 0

    def install(self) -> None:
        self.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f", preset_file("sim"),
                  "-f", str(self.values), "--wait", "--timeout", "3m")  # fmt: skip

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl(), "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip

    def pods(self) -> list[dict[str, Any]]:
        """The plugin pods (the controller's are :meth:`controller_pods`)."""
        return self.node.kube.list("pods", NAMESPACE, labelSelector=f"app.kubernetes.io/instance={RELEASE},"
                                   "app.kubernetes.io/component=kubelet-plugin")  # fmt: skip

    def controller_pods(self) -> list[dict[str, Any]]:
        return self.node.kube.list("pods", NAMESPACE, labelSelector=f"app.kubernetes.io/instance={RELEASE},"
                                   "app.kubernetes.io/component=compute-domain-controller")  # fmt: skip

    def describe_controller(self) -> str:
        parts = []
        for pod in self.controller_pods():
            logs = self.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"], "--tail=30")
            parts.append(f"controller pod {pod['metadata']['name']}: {pod.get('status')}\nevents: "
                         f"{self.workloads.events(pod)}\nits log:\n{logs.stdout}{logs.stderr}")  # fmt: skip
        return "\n".join(parts)

    def live_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]

    def ready_pod(self) -> dict[str, Any] | None:
        """The one plugin pod, once it is the only one and Ready (its probes passed)."""
        pods = self.pods()
        if len(pods) == 1 and not pods[0]["metadata"].get("deletionTimestamp") and running(pods[0]):
            return pods[0]
        return None

    def log(self, pod: dict[str, Any]) -> str:
        done = self.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def save_logs(self) -> None:
        """Each plugin pod's log beside the node's logs (kept when a test failed)."""
        for pod in self.pods():
            done = self.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"])
            name = pod["metadata"]["name"]
            (self.node.logs / f"helm-{name}.log").write_text(done.stdout + done.stderr)

    def describe(self) -> str:
        parts = []
        for pod in self.pods():
            events = self.workloads.events(pod)
            parts.append(f"plugin pod {pod['metadata']['name']}: status {pod.get('status')}\nevents: {events}")
            logs = self.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"], "--tail=30")
            parts.append(f"its log:\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)

    def wait_ready(self, what: str, condition: Any = None) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            pod = self.ready_pod()
            return pod if pod is not None and (condition is None or condition(pod)) else None

        try:
            pod: dict[str, Any] = wait_for(what, probe, ROLL_TIMEOUT)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}\n{self.node.tails(30)}") from None
        return pod

    def node_labels(self) -> dict[str, str]:
        """The labels the node's annotation says the driver wrote, with their values on the Node (none: {})."""
        metadata = self.node.kube.get("nodes", self.node.name)["metadata"]
        listed = (metadata.get("annotations") or {}).get(LABELS_ANNOTATION)
        labels = metadata.get("labels") or {}
        return {key: labels.get(key, "<missing>") for key in listed.split(",")} if listed is not None else {}

    def slices(self) -> list[dict[str, Any]]:
        return [
            s
            for s in self.node.kube.list("resourceslices", fieldSelector=f"spec.nodeName={self.node.name}")
            if s["spec"]["driver"] == DRIVER
        ]


def values_for(node: RealNode) -> dict[str, Any]:
    """What a kubelet with no CNI plugin, no kube-proxy and a root directory of its own needs from the chart."""
    return {
        "image": {"repository": "localhost/dradriver", "tag": VERSION, "pullPolicy": "Never"},
        "hostNetwork": True,
        "metrics": {"port": free_port()},
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(node.control_plane.port)},
        ],
        "kubeletDir": str(node.kubelet.root_dir),
        "cdiDir": str(node.cdi_dir),
        "nodeSelector": {"kubernetes.io/hostname": node.name},
        "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        # GPU Feature Discovery's labels on the node (the uninstall hook's Job takes the values above too), MIG
        # devices labelled per profile; a short rescan interval so that they follow a carved device within seconds.
        "nodeLabels": {"enabled": True, "migStrategy": "mixed"},
        "rescanIntervalSeconds": 5,
        # ComputeDomains on: the controller pod (and the daemon pods it would create) on this node, in its network.
        "computeDomains": {
            "enabled": True,
            "controllerReplicas": 1,
            "controllerNodeSelector": {"kubernetes.io/hostname": node.name},
            "controllerTolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "hostNetwork": True,
            "extraEnv": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(node.control_plane.port)},
            ],
        },
    }


@pytest.fixture(scope="module")
def chart(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chart]:
    """The node with its host-process driver stopped and our image imported; the release uninstalled and the host
    driver started again afterwards."""
    archive = image_archive()
    node.containerd.import_archive(archive, "localhost/dradriver")
    assert IMAGE in node.containerd.ctr("images", "ls", "-q").stdout.split()
    wait_for("the node's driver to hold no prepared claim", lambda: not node.prepared_claims(), 120)
    for driver in node.drivers:
        if driver.proc.poll() is None:
            node.stop_driver(driver)
    values = tmp_path_factory.mktemp("helm") / "node-values.yaml"
    values.write_text(yaml.safe_dump(values_for(node)))
    release = Chart(node, values)
    # The release creates the DeviceClasses itself: the session's copies go while it is installed.
    gone = release.kubectl("delete", "--ignore-not-found", "-f", str(DEVICE_CLASSES))
    assert gone.returncode == 0, gone.stderr
    # And the ComputeDomain classes, should a module of this process have applied them.
    gone = release.kubectl("delete", "--ignore-not-found", "deviceclass", *CD_CLASSES)
    assert gone.returncode == 0, gone.stderr
    try:
        yield release
    finally:
        release.save_logs()
        run_helm("--kubeconfig", release.kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found",
                 "--wait", timeout=300)  # fmt: skip
        release.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
        release.kubectl("apply", "--server-side", "-f", str(DEVICE_CLASSES))
        node.start_driver()


@pytest.fixture
def release(chart: Chart) -> Chart:
    """The release installed and its one plugin pod Ready: installed here unless a test before left it so."""
    if not chart.installed():
        chart.install()
    chart.wait_ready("the plugin pod to be Ready")
    return chart


@pytest.fixture
def scenario(release: Chart) -> Iterator[dict[str, Any]]:
    """The one-GPU scenario's pod, running with the claim the plugin pod prepared; deleted afterwards."""
    docs = documents(SCENARIO)
    try:
        [_template, scenario_pod] = release.workloads.apply(docs)
        [app] = release.workloads.wait_running(scenario_pod)
        yield app
    finally:
        release.workloads.delete(docs)


def test_install_runs_our_image_as_the_plugin_pod_and_a_scenario_gets_its_gpu(
    release: Chart, scenario: dict[str, Any]
) -> None:
    chart, app = release, scenario
    pod = chart.wait_ready("the plugin pod to be Ready")
    assert pod["spec"]["nodeName"] == chart.node.name
    [status] = pod["status"]["containerStatuses"]
    assert status["image"] == IMAGE, status
    assert status["restartCount"] == 0, chart.describe()
    # Ready means /readyz passed: registered by the kubelet and the node's slices published.
    log = chart.log(pod)
    assert "kubelet registered the plugin" in log, log
    # What the probes ask, on the host port the pod listens on (hostNetwork).
    port = yaml.safe_load(chart.values.read_text())["metrics"]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as response:
        assert response.status == 200
    registered = list(chart.node.kubelet.registry_dir.glob(f"{DRIVER}-*-reg.sock"))
    assert len(registered) == 1, registered  # the pod's per-pod socket, in the kubelet's own root
    assert chart.slices(), "no ResourceSlices of the node after install"

    output = chart.workloads.kubectl("-n", "default", "logs", app["metadata"]["name"])
    assert any(line.startswith("DRADRIVER_DEVICE_") and "=GPU-" in line for line in output.splitlines()), output
    [claim] = claims_of(chart.node.kube, app)
    assert cdi_specs_of(chart.node, claim["metadata"]["uid"]), "no CDI spec for the scenario's claim"
    # Written by the plugin pod's service account after the prepare, in the background.
    devices = wait_for("the claim's status.devices", lambda: status_devices(chart.node.kube, claim), 60)
    assert [d["driver"] for d in devices] == [DRIVER], devices


def labels_show(node_name: str) -> dict[str, str]:
    """What `dradriver node-labels show` says the sim preset's plugin writes on ``node_name`` (no cluster asked)."""
    shown = subprocess.run([sys.executable, "-m", "dradriver", "node-labels", "show", "--gpu-backend", "sim",
                            "--sim-profile", "mixed", "--mig-mode", "dynamic", "--node-name", node_name,
                            "--node-labels-mig-strategy", "mixed", "-o", "json"],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    labels: dict[str, str] = json.loads(shown.stdout)
    return labels


def test_install_labels_the_node_as_gpu_feature_discovery_does(release: Chart) -> None:
    chart = release
    written = wait_for("the plugin pod to label the node", chart.node_labels, 60)
    # Only labels of its own, each on the Node (the policy would have refused any other), and GFD's values.
    assert all(key.startswith(OWNED_LABEL_PREFIXES) for key in written), written
    assert "<missing>" not in written.values(), written
    expected = labels_show(chart.node.name)
    assert {k: written.get(k) for k in STABLE_LABELS} == {k: expected[k] for k in STABLE_LABELS}
    assert written["nvidia.com/gpu.present"] == "true"
    # Written by this pod or, after an upgrade, by the one before it (a restart finds them there): never refused.
    log = chart.log(chart.wait_ready("the plugin pod to be Ready"))
    assert "cannot write GPU Feature Discovery's labels" not in log, log


def test_the_labels_follow_a_mig_device_carved_and_destroyed(release: Chart) -> None:
    """Dynamic MIG carves the scenario's two 1g.5gb devices at prepare and destroys them at unprepare: within a
    rescan the node carries GFD's mixed-strategy labels of that profile, and then no longer."""
    chart, docs = release, documents(MIG_SCENARIO)
    profile = "nvidia.com/mig-1g.5gb"

    def carved() -> dict[str, str] | None:
        written = chart.node_labels()
        return written if f"{profile}.count" in written else None

    try:
        [_template, scenario_pod] = chart.workloads.apply(docs)
        chart.workloads.wait_running(scenario_pod)
        written = wait_for(f"{profile}.count on the node", carved, 60)
        assert written[f"{profile}.count"] == "2", written
        assert written[f"{profile}.product"].endswith("-MIG-1g.5gb"), written
    finally:
        chart.workloads.delete(docs)
    wait_for(f"{profile}.* to leave the node",
             lambda: not [k for k in chart.node_labels() if k.startswith(f"{profile}.")], 90)  # fmt: skip


def test_compute_domains_the_controller_pod_runs_and_turns_a_domain_into_its_objects(
    release: Chart, tmp_path: Path
) -> None:
    chart, kube = release, release.node.kube
    for crd in CRDS:
        established = chart.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")
        assert established.returncode == 0, established.stdout + established.stderr
    # The release's classes, RBAC and controller, as the API server holds them.
    for device_class in CD_CLASSES:
        selectors = kube.get("deviceclasses", device_class)["spec"]["selectors"]
        assert "compute-domain.dradriver.dev" in selectors[0]["cel"]["expression"], selectors
    for kind in ("clusterrole", "clusterrolebinding"):
        for part in ("controller", "plugin"):
            found = chart.kubectl("get", kind, f"{RELEASE}-dradriver-compute-domain-{part}")
            assert found.returncode == 0, found.stderr
    for kind in ("role", "rolebinding", "serviceaccount"):
        for part in ("controller", "daemon"):
            found = chart.kubectl("-n", NAMESPACE, "get", kind, f"{RELEASE}-dradriver-compute-domain-{part}")
            assert found.returncode == 0, found.stderr
    # The plugin's account may do what the node side does (its ClusterRole bound to it).
    plugin_account = f"system:serviceaccount:{NAMESPACE}:{DAEMONSET}"
    for verb, resource in (("list", "computedomains.resource.dradriver.dev"), ("patch", "nodes")):
        allowed = chart.kubectl("auth", "can-i", verb, resource, "--as", plugin_account)
        assert allowed.stdout.strip() == "yes", f"{plugin_account} cannot {verb} {resource}: {allowed.stderr}"
    available = chart.kubectl("-n", NAMESPACE, "wait", "--for=condition=Available", f"deployment/{CONTROLLER}",
                              "--timeout=120s")  # fmt: skip
    assert available.returncode == 0, available.stdout + available.stderr + chart.describe_controller()
    [pod] = [p for p in chart.controller_pods() if running(p)]
    assert pod["spec"]["nodeName"] == chart.node.name and pod["spec"]["hostNetwork"] is True
    [status] = pod["status"]["containerStatuses"]
    assert (status["image"], status["restartCount"]) == (IMAGE, 0), status

    # A ComputeDomain written with kubectl: accepted, and the controller pod gives it its objects.
    [domain_doc] = [d for d in documents(CD_EXAMPLE) if d["kind"] == "ComputeDomain"]
    domain_file = tmp_path / "domain.yaml"
    domain_file.write_text(yaml.safe_dump(domain_doc))
    try:
        _domain_gets_its_objects_and_goes(chart, domain_file, pod)
    finally:
        chart.kubectl("delete", "--ignore-not-found", "--timeout=90s", "-f", str(domain_file))


def _domain_gets_its_objects_and_goes(chart: Chart, domain_file: Path, controller: dict[str, Any]) -> None:
    """The domain in ``domain_file`` applied: the ``controller`` pod makes its objects, and takes them apart once
    it is deleted."""
    kube = chart.node.kube
    created = chart.kubectl("apply", "-f", str(domain_file))
    assert created.returncode == 0, created.stdout + created.stderr
    domain = kube.get("computedomains", CD_NAME, "default")
    uid = domain["metadata"]["uid"]
    wait_for("the controller to create the domain's objects", lambda: (
        kube.find("resourceclaimtemplates", CD_TEMPLATE, "default")
        and kube.find("daemonsets", f"computedomain-daemon-{uid}", NAMESPACE)
        and kube.find("resourceclaimtemplates", f"computedomain-daemon-{uid}", NAMESPACE)), 90)  # fmt: skip
    domain = kube.get("computedomains", CD_NAME, "default")
    assert domain["metadata"]["finalizers"] == [CD_FINALIZER]
    assert domain["status"]["status"] == "NotReady", domain.get("status")  # no worker yet: no node, no daemon
    daemonset = kube.get("daemonsets", f"computedomain-daemon-{uid}", NAMESPACE)
    daemon_pod = daemonset["spec"]["template"]["spec"]
    assert daemon_pod["serviceAccountName"] == f"{RELEASE}-dradriver-compute-domain-daemon"
    assert daemon_pod["hostNetwork"] is True and daemon_pod["containers"][0]["image"] == IMAGE
    assert {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"} in daemon_pod["containers"][0]["env"]
    assert f"created kind=DaemonSet name=computedomain-daemon-{uid}" in chart.log(controller)

    # Deleted: the controller takes it apart and lets it go.
    gone = chart.kubectl("delete", "-f", str(domain_file), "--timeout=90s")
    assert gone.returncode == 0, gone.stdout + gone.stderr + chart.describe_controller()
    labelled = f"resource.dradriver.dev/computeDomain={uid}"
    assert not kube.list("daemonsets", NAMESPACE, labelSelector=labelled)
    wait_for("the domain's claim templates to be gone",
             lambda: not kube.list("resourceclaimtemplates", labelSelector=labelled), 30)  # fmt: skip


def test_upgrade_replaces_the_pod_and_keeps_a_prepared_claim(release: Chart, scenario: dict[str, Any]) -> None:
    chart, app = release, scenario
    [old] = chart.live_pods()
    kube = chart.node.kube
    [claim] = claims_of(kube, app)
    uid = claim["metadata"]["uid"]

    chart.save_logs()
    chart.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set", "logging.level=debug",
               "--wait", "--timeout", "3m")  # fmt: skip
    new = chart.wait_ready("a new plugin pod to be Ready and the old one gone",
                           lambda pod: pod["metadata"]["uid"] != old["metadata"]["uid"])  # fmt: skip
    # A host port cannot be held by two pods: the chart replaces the pod instead of surging.
    daemonset = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{DAEMONSET}")
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    [container] = new["spec"]["containers"]
    assert {"name": "DRADRIVER_LOG_LEVEL", "value": "debug"} in container["env"]
    assert "kubelet registered the plugin" in chart.log(new)
    assert kube.find("pods", old["metadata"]["name"], NAMESPACE) is None

    # The workload never noticed: same pod, running, never restarted, its claim still prepared.
    still = kube.get("pods", "one-gpu", "default")
    assert still["metadata"]["uid"] == app["metadata"]["uid"] and running(still)
    assert all(s["restartCount"] == 0 for s in still["status"]["containerStatuses"])
    assert cdi_specs_of(chart.node, uid) and uid in chart.node.prepared_claims()
    assert status_devices(kube, claim), "the claim lost its status.devices across the upgrade"
    failures = [e for e in chart.workloads.events(still) if e.startswith("Failed")]
    assert not failures, failures

    # The new pod unprepares what the old one prepared.
    chart.workloads.delete(documents(SCENARIO))
    wait_for("the new plugin pod to unprepare the claim", lambda: unprepared(chart.node, uid), 90)


def test_uninstall_removes_every_object_and_the_kubelet_wipes_the_slices(release: Chart, tmp_path: Path) -> None:
    chart = release
    manifest = tmp_path / "release.yaml"
    manifest.write_text(chart.helm("get", "manifest", RELEASE, "-n", NAMESPACE))
    objects = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert {o["kind"] for o in objects} >= {"DaemonSet", "DeviceClass", "ClusterRole", "ValidatingAdmissionPolicy",
                                            "Deployment", "Role"}  # fmt: skip

    assert wait_for("the plugin pod to label the node", chart.node_labels, 60)

    chart.save_logs()
    chart.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m")
    left = chart.kubectl("get", "-f", str(manifest), "--ignore-not-found", "-o", "name")
    assert left.returncode == 0 and left.stdout.split() == [], left.stdout + left.stderr
    # The post-delete hook ran (helm waits for its Job): the labels and their annotation are gone, and so are the
    # hook's Job, account and node-patching role (deleted once it succeeded).
    assert chart.node_labels() == {}, chart.node_labels()
    labels = chart.node.kube.get("nodes", chart.node.name)["metadata"].get("labels") or {}
    assert not [k for k in labels if k.startswith(OWNED_LABEL_PREFIXES)], labels
    for kind, namespace in (("job", NAMESPACE), ("serviceaccount", NAMESPACE), ("clusterrole", ""),
                            ("clusterrolebinding", "")):  # fmt: skip
        found = chart.kubectl(*(["-n", namespace] if namespace else []), "get", kind, CLEANUP, "--ignore-not-found",
                              "-o", "name")  # fmt: skip
        assert found.returncode == 0 and found.stdout.strip() == "", f"{kind} {CLEANUP} left: {found.stdout}"
    wait_for("the plugin pod to be gone", lambda: not chart.pods(), ROLL_TIMEOUT)
    wait_for("the controller pod to be gone", lambda: not chart.controller_pods(), ROLL_TIMEOUT)
    # What stays, as documented: the CRDs (helm never deletes CRDs: that would delete every ComputeDomain) and
    # the controller's Lease (runtime state, not a release object: it goes with the namespace).
    crds = chart.kubectl("get", "crd", *CRDS, "-o", "name")
    assert crds.returncode == 0 and len(crds.stdout.split()) == 2, crds.stdout + crds.stderr
    leases = [lease["metadata"]["name"] for lease in chart.node.kube.list("leases", NAMESPACE)]
    assert leases in ([], ["dradriver-compute-domain-controller"]), leases
    assert not chart.node.kube.list("computedomaincliques", NAMESPACE)
    wait_for("the plugin's registration socket to be gone",
             lambda: not list(chart.node.kubelet.registry_dir.glob(f"{DRIVER}-*-reg.sock")), 60)  # fmt: skip
    wait_for("the kubelet to delete the driver's slices", lambda: not chart.slices(), WIPE_TIMEOUT)
    # Nor helm's own record of the release.
    status = run_helm("--kubeconfig", chart.kubeconfig, "status", RELEASE, "-n", NAMESPACE)
    assert status.returncode != 0 and "not found" in status.stderr, status.stdout + status.stderr
