"""`dradriver run` as a real process on a simulated node, against the API server and kubelet stand-ins."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from support.apiserver import FakeApiServer, allocated_claim
from support.in_pod import in_a_pod

from dradriver.cli.main import main
from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient, discover
from dradriver.sim.node import SimulatedNode, full_compute_instance_profile
from dradriver.sim.profiles import load_node_profile

DRIVER = "gpu.dradriver.dev"
NODE = "node-a"
TIMEOUT = 30.0
FIRST_GPU = "gpu-0000-07-00-0"
SECOND_GPU = "gpu-0000-0f-00-0"


class DriverProcess:
    """A running `dradriver run`; ``ready`` is set when it logs that it serves, ``lines`` holds its log."""

    def __init__(
        self,
        root: Path,
        kubeconfig: Path | None,
        *extra: str,
        profile: str = "dgx-a100-40gb",
        entry: Sequence[str] = ("-m", "dradriver"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``kubeconfig`` None: the in-cluster configuration ``env`` and ``entry`` give (support/in_pod.py)."""
        self.root = root
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *entry,
                "run",
                "--node-name",
                NODE,
                *(["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else []),
                "--gpu-backend",
                "sim",
                "--sim-profile",
                profile,
                "--sim-state",
                str(root / "sim.json"),
                "--registry-dir",
                str(root / "registry"),
                "--plugin-dir",
                str(root / "plugin"),
                "--cdi-dir",
                str(root / "cdi"),
                "--log-format",
                "json",
                "--metrics-address",
                "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env} if env is not None else None,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if '"msg": "serving node=' in line:  # "ready" waits for a kubelet's registration too
                self.ready.set()
        self.ready.set()  # the process ended: stop waiting either way

    def wait_ready(self) -> None:
        assert self.ready.wait(TIMEOUT) and self.proc.poll() is None, "".join(self.lines)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        code = self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def driver(root: Path, api: FakeApiServer) -> Iterator[DriverProcess]:
    process = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"))
    process.wait_ready()
    yield process
    if process.proc.poll() is None:
        process.stop(signal.SIGKILL)


def eventually(condition: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    """Whether ``condition`` holds within ``timeout``, checking every 50 ms (for files only a poll can see)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.05)
    return True


def our_slices(api: FakeApiServer) -> list[dict]:
    return [s for s in api.list("resourceslices") if s["spec"]["driver"] == DRIVER]


def test_run_publishes_slices_owned_by_the_node(driver: DriverProcess, api: FakeApiServer) -> None:
    assert api.wait_until(lambda: len(our_slices(api)) == 1, TIMEOUT), driver.log
    [published] = our_slices(api)
    assert published["spec"]["nodeName"] == NODE
    assert len(published["spec"]["devices"]) == 8
    node_uid = api.get("nodes", NODE)["metadata"]["uid"]  # type: ignore[index]
    assert published["metadata"]["ownerReferences"][0]["uid"] == node_uid


# Never imported by `dradriver run` in a pod: the code of the other commands (CEL and the allocator are for
# `explain` and `demo`), the parts of the kubernetes client we do not use (its typed ApiClient among them, which
# defines a pydantic model at import; the kubeconfig loader, with oauthlib and requests, is only for a
# kubeconfig), pydantic itself (the opaque config models load at the first claim with a config, the ComputeDomain
# driver's with --compute-domains). Importing them took a third of the start-up and about 13 MB of memory
# (docs/reliability.md); this guards that without timing or measuring anything.
NOT_FOR_RUN = (
    "dradriver.cel",
    "dradriver.allocator",
    "dradriver.cli.demo",
    "dradriver.cli.explain",
    "dradriver.cli.explain_cluster",
    "dradriver.cli.explain_input",
    "dradriver.cli.inventory",
    "dradriver.computedomain",
    "dradriver.driver.prepare.config",
    "celpy",
    "lark",
    "pydantic",
    "pydantic_core",
    # In a pod the service account is read without the client (the transport is urllib3 with our settings; urllib3
    # brings importlib.metadata, docs/reliability.md). Only the lazy stubs of `kubernetes`, its `config` and
    # `utils` packages are in sys.modules: none of their code ran.
    "kubernetes.client",
    "kubernetes.config.kube_config",
    "kubernetes.config.incluster_config",
    "kubernetes.dynamic",
    "kubernetes.informer",
    "kubernetes.leaderelection",
    "kubernetes.stream",
    "kubernetes.watch",
    "kubernetes_validate",
    "jsonschema",
    "dateutil",
    "oauthlib",
    "requests",
)


def test_run_never_imports_what_only_other_commands_or_unused_client_parts_need(root: Path) -> None:
    modules = root / "modules.json"
    # `dradriver run` as in a pod (in-cluster service account, HTTPS), writing the names of every module loaded
    # on its way out.
    dump = (
        "import atexit, json, sys; "
        f"atexit.register(lambda: open({str(modules)!r}, 'w').write(json.dumps(sorted(sys.modules))))"
    )
    with in_a_pod(root / "pod") as pod:
        pod.api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        process = DriverProcess(
            root, None, "--mig-mode", "dynamic", profile="hgx-h100-80gb", entry=pod.entry(dump), env=pod.env
        )
        try:
            process.wait_ready()

            def all_published() -> bool:
                slices = our_slices(pod.api)
                return bool(slices) and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]

            assert pod.api.wait_until(all_published, TIMEOUT), process.log
        finally:
            assert process.stop() == 0, process.log
    imported = set(json.loads(modules.read_text()))
    assert {
        "dradriver.cli.run",
        "dradriver.plugin.resourceslice.publisher",
        "dradriver.plugin.cluster.transport",
        "grpc",
    } <= imported
    unwanted = sorted(m for m in imported if any(m == p or m.startswith(p + ".") for p in NOT_FOR_RUN))
    assert not unwanted


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_and_unprepare_round_trip_over_each_dra_version(
    driver: DriverProcess, api: FakeApiServer, root: Path, version: str
) -> None:
    claim = allocated_claim(api, "two-gpus", [FIRST_GPU, "gpu-0000-0f-00-0"])
    kubelet = KubeletClient(root / "registry", supported_versions=[version])
    with kubelet.register() as plugin:
        assert plugin.version == version
        result = plugin.prepare([claim])[claim.uid]
        assert result.error == ""
        assert [d["device_name"] for d in result.devices] == [FIRST_GPU, "gpu-0000-0f-00-0"]
        assert result.devices[0] == {
            "request_names": ["gpus"],
            "pool_name": NODE,
            "device_name": FIRST_GPU,
            "cdi_device_ids": [f"k8s.gpu.dradriver.dev/claim={claim.uid}-{FIRST_GPU}"],
        }
        spec = json.loads((root / "cdi" / f"k8s.gpu.dradriver.dev-claim_{claim.uid}.json").read_text())
        assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
        [own_env] = spec["devices"][0]["containerEdits"]["env"]
        assert own_env.startswith("DRADRIVER_DEVICE_GPU_") and "=GPU-" in own_env
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/nvidia0", "hostPath": "/dev/null"}
        ]
        # The simulated node's stub driver root is mounted like a real one.
        libcuda = [m for m in spec["containerEdits"]["mounts"] if "/libcuda.so." in m["containerPath"]]
        assert libcuda and Path(libcuda[0]["hostPath"]).is_file()

        def status_devices() -> list[dict]:
            return (api.get("resourceclaims", claim.name, "default") or {}).get("status", {}).get("devices", [])

        assert api.wait_until(lambda: len(status_devices()) == 2, TIMEOUT), driver.log
        assert status_devices()[0]["data"]["uuid"].startswith("GPU-")
        assert plugin.unprepare([claim]) == {claim.uid: ""}
        assert not list((root / "cdi").iterdir())
        assert api.wait_until(lambda: status_devices() == [], TIMEOUT), driver.log


def test_bad_claims_fail_alone_in_a_batch(driver: DriverProcess, api: FakeApiServer, root: Path) -> None:
    good = allocated_claim(api, "good", [FIRST_GPU])
    elsewhere = api.create(
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "elsewhere", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpus", "driver": DRIVER, "pool": "node-b", "device": FIRST_GPU}]
                    }
                }
            },
        },
        namespace="default",
    )
    missing_device = allocated_claim(api, "ghost", ["gpu-0000-ff-00-0"])
    with KubeletClient(root / "registry").register() as plugin:
        result = plugin.prepare(
            [
                good,
                Claim("default", "elsewhere", elsewhere["metadata"]["uid"]),
                missing_device,
                Claim("default", "absent", "uid-absent"),
                Claim("default", "good", ""),
            ]
        )
    assert result[good.uid].error == ""
    assert "pool node-b" in result[elsewhere["metadata"]["uid"]].error
    assert "not offered by this node" in result[missing_device.uid].error
    assert result["uid-absent"].error
    assert "empty uid" in result[""].error


def test_prepare_is_idempotent_across_sigterm_and_sigkill_restarts(
    driver: DriverProcess, api: FakeApiServer, root: Path
) -> None:
    claim = allocated_claim(api, "survivor", [FIRST_GPU])
    with KubeletClient(root / "registry").register() as plugin:
        before = plugin.prepare([claim])[claim.uid]
    assert driver.stop(signal.SIGTERM) == 0
    assert discover(root / "registry") == []  # deregistered on the way out

    again = DriverProcess(root, root / "kubeconfig")
    again.wait_ready()
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid] == before
    again.stop(signal.SIGKILL)  # leaves its sockets and lock file behind

    third = DriverProcess(root, root / "kubeconfig")
    try:
        third.wait_ready()
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.prepare([claim])[claim.uid] == before
    finally:
        third.stop()


def test_a_second_instance_is_refused_and_the_first_keeps_serving(driver: DriverProcess, root: Path) -> None:
    twin = DriverProcess(root, root / "kubeconfig")
    code = twin.proc.wait(TIMEOUT)
    twin._reader.join(TIMEOUT)
    assert code == 2
    assert f"PID {driver.proc.pid}" in twin.log
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.unprepare([Claim("default", "x", "uid-x")]) == {"uid-x": ""}


def test_registration_socket_comes_back_after_the_registry_dir_is_wiped(driver: DriverProcess, root: Path) -> None:
    registry = root / "registry"
    shutil.rmtree(registry)
    registry.mkdir()
    assert eventually(lambda: bool(discover(registry))), driver.log
    with KubeletClient(registry).register() as plugin:
        assert plugin.unprepare([Claim("default", "x", "uid-x")]) == {"uid-x": ""}


def test_mig_devices_created_out_of_band_are_published_at_the_next_rescan(root: Path, api: FakeApiServer) -> None:
    driver = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--mig-mode",
        "static",
        "--rescan-interval",
        "1",
        profile="mixed",
    )
    try:
        driver.wait_ready()

        def published() -> set[str]:
            return {d["name"] for s in our_slices(api) for d in s["spec"].get("devices", [])}

        assert eventually(lambda: "gpu-0000-0f-00-0" in published()), driver.log
        # An admin splits the second A100 with nvidia-smi: here, a second simulator on the same hardware state.
        admin = SimulatedNode(load_node_profile("mixed"), node_name=NODE, state_path=root / "sim.json")
        admin.set_mig_mode(1, True)
        admin.reset_gpu(1)
        instance = admin.create_gpu_instance(1, 19, 0)
        admin.create_compute_instance(1, instance.id, full_compute_instance_profile(1))

        assert eventually(lambda: "gpu-0000-0f-00-0-mig-1g5gb-0" in published()), driver.log
        assert "gpu-0000-0f-00-0" not in published()  # in MIG mode it is no longer offered whole
    finally:
        driver.stop()


def test_an_xid_raised_with_dradriver_sim_reaches_the_kubelets_health_stream(driver: DriverProcess, root: Path) -> None:
    with KubeletClient(root / "registry").register() as plugin:
        stream = plugin.watch_health(timeout=TIMEOUT)
        first = next(stream)
        assert {d.health for d in first.devices} == {1}  # HEALTHY
        assert (
            main(
                [
                    "sim",
                    "--sim-profile",
                    "dgx-a100-40gb",
                    "--node-name",
                    NODE,
                    "--sim-state",
                    str(root / "sim.json"),
                    "xid",
                    "0000:0f:00.0",
                    "79",
                ]
            )
            == 0
        )
        for update in stream:
            unhealthy = [d.device.device_name for d in update.devices if d.health == 2]
            if unhealthy:
                break
        stream.cancel()
    assert unhealthy == ["gpu-0000-0f-00-0"]
    assert "XID 79" in next(d.message for d in update.devices if d.health == 2)


def test_a_refused_second_instance_touches_no_slices(driver: DriverProcess, api: FakeApiServer, root: Path) -> None:
    # Published, its request logged, and the first instance is idle, watching.
    assert api.wait_until(
        lambda: len(our_slices(api)) == 1 and len(api.writes_since(0)) == 1 and api.active_watches == 1, TIMEOUT
    ), driver.log
    mark = api.mark()
    # Other settings, other slices: had the twin published anything, it would have rewritten them.
    twin = DriverProcess(root, root / "kubeconfig", "--mig-mode", "dynamic")
    assert twin.proc.wait(TIMEOUT) == 2
    twin._reader.join(TIMEOUT)
    assert "already running" in twin.log
    assert api.writes_since(mark) == [], twin.log


def _status_port(driver: DriverProcess) -> int:
    import re

    [port] = {int(m) for m in re.findall(r"serving metrics and readiness port=(\d+)", driver.log)}
    return port


def _get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_probes_metrics_and_an_api_outage_that_fails_readyz_and_healthz_but_never_livez(
    driver: DriverProcess, api: FakeApiServer, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _status_port(driver)
    assert _get(port, "/readyz")[0] == 503  # not registered yet
    KubeletClient(root / "registry").register().close()
    assert eventually(lambda: _get(port, "/readyz")[0] == 200), driver.log
    assert _get(port, "/livez") == (200, "ok\n")
    assert _get(port, "/healthz") == (200, "ok\n")
    claim = allocated_claim(api, "scraped", [FIRST_GPU])
    mps = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    shared = allocated_claim(api, "scraped-mps", [SECOND_GPU], config=mps)
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid].error == ""
        assert plugin.prepare([shared])[shared.uid].error == ""
        _, scrape = _get(port, "/metrics")
        assert 'dradriver_prepared_devices{sharing="exclusive",type="gpu"} 1.0' in scrape
        assert 'dradriver_prepared_devices{sharing="mps",type="gpu"} 1.0' in scrape
        assert "dradriver_mps_daemons 1.0" in scrape
        assert 'dradriver_kubelet_requests_total{outcome="success",rpc="NodePrepareResources"} 2.0' in scrape
        assert "dradriver_resourceslices_published 1.0" in scrape
        assert plugin.unprepare([claim, shared]) == {claim.uid: "", shared.uid: ""}
        assert "dradriver_mps_daemons 0.0" in _get(port, "/metrics")[1]

    api.fail_next("GET", "/resourceslices", 503, count=10**6, message="etcdserver: leader changed")
    api.drop_watches()  # the publisher lists again, and fails
    assert eventually(lambda: _get(port, "/healthz")[0] == 503), driver.log
    code, body = _get(port, "/healthz")
    assert code == 503
    detail = json.loads(body)
    assert detail["slicesPublished"] is False and "leader changed" in detail["publishError"]
    assert detail["draSocket"] is True and detail["registrationSocket"] is True
    assert _get(port, "/readyz")[0] == 503
    assert _get(port, "/livez") == (200, "ok\n")  # the liveness probe never restarts the pod for an outage
    # /allocations and top say so: no device is free to a pod while the slices are not published.
    document = json.loads(_get(port, "/allocations")[1])
    assert (document["ready"], document["slicesPublished"]) == (False, False)
    assert "leader changed" in document["publishError"] and document["gpus"]
    capsys.readouterr()
    assert main(["top", "--address", f"127.0.0.1:{port}", "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "└ not published" in lines[2] and not any(" free" in line for line in lines)
    assert any(line.startswith("not published: ") and "leader changed" in line for line in lines)
    api.clear_faults()
    assert eventually(lambda: _get(port, "/healthz")[0] == 200 and _get(port, "/readyz")[0] == 200), driver.log
    document = json.loads(_get(port, "/allocations")[1])
    assert (document["ready"], document["slicesPublished"], document["publishError"]) == (True, True, None)


def test_ready_is_logged_only_once_readyz_answers_200(driver: DriverProcess, api: FakeApiServer, root: Path) -> None:
    port = _status_port(driver)
    # Serving, its slices published, but no kubelet has registered the plugin: not ready, and not said to be.
    assert api.wait_until(lambda: len(our_slices(api)) == 1, TIMEOUT), driver.log
    assert _get(port, "/readyz")[0] == 503
    assert '"msg": "ready ' not in driver.log
    KubeletClient(root / "registry").register().close()
    assert eventually(lambda: '"msg": "ready node=node-a ' in driver.log), driver.log
    assert _get(port, "/readyz")[0] == 200


#: `dradriver run` whose readiness check raises the first three times the main thread asks it.
FLAKY_READINESS = """
import runpy, threading
from dradriver.cli.node_status import NodeStatus
real, raised = NodeStatus.readiness, []
def flaky(self):
    if threading.current_thread() is threading.main_thread() and len(raised) < 3:
        raised.append(1)
        raise RuntimeError("a bug in a readiness check")
    return real(self)
NodeStatus.readiness = flaky
runpy.run_module("dradriver", run_name="__main__", alter_sys=True)
"""


def test_a_readiness_check_that_raises_is_not_ready_and_never_ends_the_driver(root: Path, api: FakeApiServer) -> None:
    driver = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"), entry=("-c", FLAKY_READINESS))
    try:
        driver.wait_ready()
        KubeletClient(root / "registry").register().close()
        assert eventually(lambda: '"msg": "ready node=node-a ' in driver.log), driver.log
        assert driver.log.count("the readiness check raised; not ready until it answers") == 1, driver.log
        assert "a bug in a readiness check" in driver.log
    finally:
        assert driver.stop() == 0, driver.log


def test_a_plugin_directory_deleted_under_the_driver_comes_back_with_sockets_checkpoint_and_registration(
    driver: DriverProcess, api: FakeApiServer, root: Path
) -> None:
    plugin_dir = root / "plugin"
    claim = allocated_claim(api, "kept", [FIRST_GPU])
    with KubeletClient(root / "registry").register() as plugin:
        before = plugin.prepare([claim])[claim.uid]
    assert before.error == ""
    shutil.rmtree(plugin_dir)
    # The DRA socket, the instance lock and the checkpoint (the default state directory is the plugin directory)
    # come back without a restart; the claim prepared before is still known.
    assert eventually(
        lambda: (
            (plugin_dir / "dra.sock").exists()
            and (plugin_dir / "plugin.lock").exists()
            and claim.uid in (plugin_dir / "checkpoint.json").read_text()
            if (plugin_dir / "checkpoint.json").exists()
            else False
        )
    ), driver.log
    assert driver.proc.poll() is None
    assert eventually(lambda: "serving DRA services again" in driver.log), driver.log
    assert eventually(lambda: _get(_status_port(driver), "/livez")[0] == 200), driver.log
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.prepare([claim])[claim.uid] == before  # answered from the written-back checkpoint
        assert plugin.unprepare([claim]) == {claim.uid: ""}
    assert list((root / "cdi").glob("*.json")) == []
    twin = DriverProcess(root, root / "kubeconfig")
    assert twin.proc.wait(TIMEOUT) == 2, "the re-taken instance lock still refuses a second instance"
    twin._reader.join(TIMEOUT)


def test_a_refused_per_pod_instance_leaves_the_running_instances_files_alone(driver: DriverProcess, root: Path) -> None:
    # A CDI spec the running instance wrote after its start-up reconciliation (a prepare in progress writes the
    # spec before its checkpoint record). A per-pod instance beside a fixed-name one is refused; it must be
    # refused before it reconciles the node, or it deletes this spec and rolls back the running one's work.
    spec = root / "cdi" / "k8s.gpu.dradriver.dev-claim_00000000-0000-0000-0000-00000000abcd.json"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "k8s.gpu.dradriver.dev/claim", "devices": []}))
    twin = DriverProcess(root, root / "kubeconfig", "--pod-uid", "0b1c2d3e-0000-4000-8000-000000000001")
    assert twin.proc.wait(TIMEOUT) == 2
    twin._reader.join(TIMEOUT)
    assert "without a pod UID is running" in twin.log
    assert spec.exists(), twin.log


def _taint_of(api: FakeApiServer, device: str) -> bool | None:
    """Whether ``device`` is published with a taint; None while it is not published."""
    for published in our_slices(api):
        for entry in published["spec"].get("devices", ()):
            if entry["name"] == device:
                return bool(entry.get("taints"))
    return None


def test_a_restart_in_dynamic_mode_never_publishes_an_unhealthy_gpu_without_its_taint(
    root: Path, api: FakeApiServer
) -> None:
    kubeconfig = api.write_kubeconfig(root / "kubeconfig")
    options = ("--mig-mode", "dynamic", "--rescan-interval", "0")
    first = DriverProcess(root, kubeconfig, *options)
    try:
        first.wait_ready()
        sim = ["sim", "--sim-profile", "dgx-a100-40gb", "--node-name", NODE, "--sim-state", str(root / "sim.json")]
        # XID 62: fatal, and the GPU keeps answering (79 would take it off the bus, and out of the slices).
        assert main([*sim, "xid", "0000:0f:00.0", "62"]) == 0
        assert api.wait_until(lambda: _taint_of(api, "gpu-0000-0f-00-0") is True, TIMEOUT), first.log
    finally:
        assert first.stop() == 0
    # The health condition is kept across the restart; every state of the slices the new instance leaves
    # (checked on each change) must still carry it.
    untainted: list[bool] = []

    def settled() -> bool:
        if _taint_of(api, "gpu-0000-0f-00-0") is False:
            untainted.append(True)
        return second.ready.is_set() and api.active_watches == 1

    second = DriverProcess(root, kubeconfig, *options)
    try:
        assert api.wait_until(settled, TIMEOUT), second.log
        assert untainted == [], second.log
    finally:
        second.stop()


def test_start_up_removes_device_metadata_no_claim_owns_and_keeps_a_prepared_claims_until_unprepare(
    driver: DriverProcess, api: FakeApiServer, root: Path
) -> None:
    """Turning --device-metadata off: metadata of a claim still prepared stays (its containers may restart with
    the CDI ids the kubelet cached) until that claim is unprepared; metadata no claim owns goes at start-up."""
    assert driver.stop(signal.SIGTERM) == 0
    on = DriverProcess(root, root / "kubeconfig", "--device-metadata", "true")
    on.wait_ready()
    kept = allocated_claim(api, "kept", [FIRST_GPU])
    gone = allocated_claim(api, "gone", ["gpu-0000-0f-00-0"])
    with KubeletClient(root / "registry").register() as plugin:
        prepared = plugin.prepare([kept, gone])
    assert f"{DRIVER}/metadata={kept.uid}_gpus" in prepared[kept.uid].devices[0]["cdi_device_ids"]
    on.stop(signal.SIGKILL)
    metadata_spec = root / "cdi" / f"{DRIVER}-metadata_{{}}.json"
    # What a crash between forgetting a claim and removing its metadata leaves: files no claim owns.
    orphan_spec = Path(str(metadata_spec).format("orphan-uid"))
    orphan_spec.write_text(Path(str(metadata_spec).format(kept.uid)).read_text())
    orphan_file = root / "plugin" / "dra-device-metadata" / "orphan-uid" / "gpus" / "metadata.json"
    orphan_file.parent.mkdir(parents=True)
    orphan_file.write_text("{}")

    off = DriverProcess(root, root / "kubeconfig", "--device-metadata", "false")
    try:
        off.wait_ready()
        assert not orphan_spec.exists() and not orphan_file.parent.parent.exists()
        assert Path(str(metadata_spec).format(kept.uid)).is_file()
        with KubeletClient(root / "registry").register() as plugin:
            assert plugin.unprepare([gone]) == {gone.uid: ""}
            assert not Path(str(metadata_spec).format(gone.uid)).exists()  # removed although writing is off
            assert not (root / "plugin" / "dra-device-metadata" / gone.uid).exists()
            assert Path(str(metadata_spec).format(kept.uid)).is_file()
            again = allocated_claim(api, "new", ["gpu-0000-47-00-0"])
            ids = plugin.prepare([again])[again.uid].devices[0]["cdi_device_ids"]
            assert not any("/metadata=" in i for i in ids)
            assert not Path(str(metadata_spec).format(again.uid)).exists()
    finally:
        off.stop(signal.SIGKILL)


def test_withhold_publishes_no_gpu_beside_nvidias_device_plugin_and_every_gpu_once_it_is_gone(
    root: Path, api: FakeApiServer
) -> None:
    plugins = root / "device-plugins"
    plugins.mkdir()
    (plugins / "nvidia-gpu.sock").touch()
    flags = ("--rescan-interval", "1", "--device-plugins-dir", str(plugins))
    kubeconfig = api.write_kubeconfig(root / "kubeconfig")
    refused = DriverProcess(root, kubeconfig, *flags)
    assert refused.proc.wait(TIMEOUT) == 2 and "nvidia-gpu.sock" in refused.log and not our_slices(api)
    driver = DriverProcess(root, kubeconfig, *flags, "--device-plugin-coexistence", "withhold")
    try:
        driver.wait_ready()

        def published() -> set[str]:
            return {d["name"] for s in our_slices(api) for d in s["spec"].get("devices", [])}

        assert eventually(lambda: bool(our_slices(api))), driver.log
        assert published() == set() and "withholding every GPU" in driver.log
        (plugins / "nvidia-gpu.sock").unlink()  # the plugin is gone from the node
        assert eventually(lambda: {FIRST_GPU, SECOND_GPU} <= published()), driver.log
    finally:
        driver.stop()


def test_sigquit_writes_every_threads_stack_to_the_log_and_the_driver_goes_on_serving(
    driver: DriverProcess, root: Path
) -> None:
    driver.proc.send_signal(signal.SIGQUIT)
    assert eventually(lambda: "Current thread" in driver.log or "Thread 0x" in driver.log), driver.log
    assert eventually(lambda: "run_until_stopped" in driver.log), driver.log  # the main thread, where it waits
    with KubeletClient(root / "registry").register() as plugin:
        assert plugin.unprepare([Claim("default", "x", "uid-x")]) == {"uid-x": ""}
    assert driver.stop(signal.SIGTERM) == 0
