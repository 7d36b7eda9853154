"""The chart's idle-GPU alert unit-tested by the real promtool over the series a running `dradriver run` serves: a
simulated node where one pod's GPU is barely used, another's is busy, a third pod holds a MIG device and a GPU is
free. Their /metrics series, label sets and values as scraped, become the input of a `promtool test rules` file as
Prometheus would store them (scraped through the chart's ServiceMonitor); only the idle allocated GPU alerts, and
only once the rule's `for` has passed. The page docs/recipes/idle-gpu-alert.md shows that file as written here."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.apiserver import FakeApiServer, allocated_claim
from support.promtool import rendered_rule, run_promtool
from support.recipe_pages import page_files

from dradriver.plugin.kubeletplugin.kubelet_client import KubeletClient
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile

from .test_run_process import NODE, DriverProcess, _get, _status_port, eventually, our_slices

PAGE = "idle-gpu-alert.md"
PROFILE = "dgx-a100-40gb"
IDLE_GPU, BUSY_GPU, SHARED_GPU = "gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-90-00-0"
FREE_GPU = "gpu-0000-87-00-0"
MIG_DEVICE = "gpu-0000-47-00-0-mig-1g5gb-0"
TIME_SLICING = {"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
SHARERS = (
    ("notebook-a", "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d"),
    ("notebook-b", "3b4c5d6e-7f8a-4b9c-8d1e-2f3a4b5c6d7e"),
)


@dataclass(frozen=True)
class Holder:
    """A claim the test prepares: its device, the pods it is reserved for (name, UID), the utilisation in percent
    of a CUDA process in its first pod (None: no process), its opaque config, and whether its pods must alert."""

    claim: str
    device: str
    pods: tuple[tuple[str, str], ...]
    busy: int | None
    alerts: bool
    config: dict[str, Any] | None = None


HOLDERS = (
    Holder("trainer", IDLE_GPU, (("trainer-0", "6f1d2c3b-4a59-4e8f-9b7a-0c1d2e3f4a5b"),), busy=3, alerts=True),
    Holder("inference", BUSY_GPU, (("server-0", "9f8e7d6c-5b4a-4321-8fed-cba987654321"),), busy=80, alerts=False),
    # A time-sliced GPU two pods share, both idle: the GPU is, so each of them alerts.
    Holder("notebooks", SHARED_GPU, SHARERS, busy=None, alerts=True, config=TIME_SLICING),
    # A MIG device has no utilisation in NVML: nothing to join, no alert however idle.
    Holder("eval", MIG_DEVICE, (("eval-0", "1f8e7d6c-5b4a-4321-8fed-cba987654322"),), busy=None, alerts=False),
)
#: What Prometheus adds to each series it scrapes through the chart's ServiceMonitor (honorLabels: a series' own
#: namespace and pod win; node from the relabeling): the Service's name as job, the driver pod's address.
TARGET = {
    "job": "dradriver-kubelet-plugin-metrics",
    "service": "dradriver-kubelet-plugin-metrics",
    "endpoint": "status",
    "instance": "10.244.1.7:8080",
    "container": "plugin",
    "namespace": "dradriver",
    "pod": "dradriver-kubelet-plugin-7xk2p",
    "node": NODE,
}
#: The same driver after its pod was replaced (an upgrade): another pod name and address.
REPLACED = {**TARGET, "instance": "10.244.1.12:8080", "pod": "dradriver-kubelet-plugin-m4q9z"}
SERIES = ("dradriver_device_allocation_info", "dradriver_device_utilization_ratio")
#: The labels an alert must carry: those that name the holder and its GPU (written out, not read from the rule, so
#: a rule that drops one of them fails here).
ALERT_LABELS = frozenset({"namespace", "pod", "pod_uid", "claim", "request", "device", "uuid", "sharing", "node"})
MINUTES = 60  # of series in the test: twice the rule's default `for`
RESTART = 10  # the minute of the last scrape of the old driver pod; the new one's first is two minutes later

Sample = tuple[str, dict[str, str], float]


def scraped(port: int) -> list[Sample]:
    """The allocation and utilisation samples of one scrape: (name, labels, value)."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(_get(port, "/metrics")[1])
        for sample in family.samples
        if sample.name in SERIES
    ]


def published(api: FakeApiServer) -> set[str]:
    return {d["name"] for s in our_slices(api) for d in s["spec"].get("devices", [])}


def run_the_node(root: Path, api: FakeApiServer) -> list[Sample]:
    """Prepare HOLDERS' claims on a simulated node, start their CUDA processes, and scrape once the usage sample
    shows them."""
    driver = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"), "--mig-mode", "dynamic",
                           "--rescan-interval", "0", "--usage-interval", "1", profile=PROFILE)  # fmt: skip
    try:
        driver.wait_ready()
        assert eventually(lambda: {h.device for h in HOLDERS} <= published(api)), driver.log
        claims = [allocated_claim(api, h.claim, [h.device], pods=dict(h.pods), config=h.config) for h in HOLDERS]
        with KubeletClient(root / "registry").register() as plugin:
            assert all(result.error == "" for result in plugin.prepare(claims).values()), driver.log
        port = _status_port(driver)
        uuids = {labels["device"]: labels["uuid"] for _, labels, _ in scraped(port)}
        hardware = SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json")
        for pid, holder in enumerate(HOLDERS, start=4242):
            if holder.busy is not None:
                hardware.start_process(uuids[holder.device], pid, 1 << 30, holder.busy, pod_uid=holder.pods[0][1])

        def utilisation() -> dict[str, float]:
            return {labels["device"]: value for name, labels, value in scraped(port) if name == SERIES[1]}

        expected = {IDLE_GPU: 0.03, BUSY_GPU: 0.8, SHARED_GPU: 0.0, FREE_GPU: 0.0}
        assert eventually(lambda: expected.items() <= utilisation().items()), (utilisation(), driver.log)
        return scraped(port)
    finally:
        driver.stop(signal.SIGKILL)


def series_text(name: str, labels: Mapping[str, str], target: Mapping[str, str]) -> str:
    """A series in promtool's notation with the target's labels added the way a scrape adds them, empty labels
    dropped as Prometheus drops them when it stores a sample."""
    stored = {**target, **{k: v for k, v in labels.items() if v}}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(stored.items())) + "}"


def fill(text: str, labels: Mapping[str, str], value: str) -> str:
    """An annotation template of the rule with the alert's labels and value in, as Prometheus fills it."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    return text.replace("{{ $value | humanize }}", value)


def matched(pattern: str, text: str) -> str:
    """The first group of ``pattern`` matching at ``text``'s start (what the test reads of the rendered rule)."""
    found = re.match(pattern, text, re.DOTALL)
    assert found, f"{pattern!r} does not match {text!r}"
    return found.group(1)


def expected_alerts(kept: list[Sample], alert: dict[str, Any]) -> list[dict[str, Any]]:
    """The alert of each pod of a holder that must alert: the labels the rule keeps, its own, and its annotations
    with the GPU's utilisation in percent as Prometheus's humanize shows a value under 1000."""
    alerting = {pod for h in HOLDERS if h.alerts for pod, _ in h.pods}
    utilisation = {ls["device"]: v for n, ls, v in kept if n == SERIES[1]}
    out = []
    for name, labels, _ in kept:
        if name == SERIES[0] and labels["pod"] in alerting:
            kept_labels = {k: v for k, v in sorted({**TARGET, **labels}.items()) if k in ALERT_LABELS and v}
            value = f"{utilisation[labels['device']] * 100:.4g}"
            annotations = {k: fill(v, kept_labels, value) for k, v in alert["annotations"].items()}
            out.append({"exp_labels": {**kept_labels, **alert["labels"]}, "exp_annotations": annotations})
    return out


def input_series(kept: list[Sample], *, restart: bool) -> list[dict[str, str]]:
    """The series held at their scraped values for MINUTES minutes; with ``restart``, the driver's pod replaced:
    its series end at minute RESTART (Prometheus marks them stale at the next scrape), a minute passes without
    any, and the new pod's series go on."""
    ordered = sorted(kept, key=lambda s: (s[0], s[1]["device"], s[1].get("pod", "")))
    if not restart:
        return [{"series": series_text(n, ls, TARGET), "values": f"{v:g}+0x{MINUTES}"} for n, ls, v in ordered]
    old = [{"series": series_text(n, ls, TARGET), "values": f"{v:g}+0x{RESTART} stale"} for n, ls, v in ordered]
    after = f"_x{RESTART + 2} {{:g}}+0x{MINUTES - RESTART - 2}"
    return [*old, *({"series": series_text(n, ls, REPLACED), "values": after.format(v)} for n, ls, v in ordered)]


def promtool_test(samples: list[Sample], rule: dict[str, Any]) -> str:
    """The promtool unit test: the scraped allocation series, and the utilisation of the held GPUs and a free one;
    no alert a minute before the rule's `for`, then those of HOLDERS that must alert; the same across a restart of
    the driver's pod."""
    held = {h.device for h in HOLDERS} | {FREE_GPU}
    kept = [(n, ls, v) for n, ls, v in samples if n == SERIES[0] or ls["device"] in held]
    alert = rule["spec"]["groups"][0]["rules"][0]
    minutes = int(matched(r"(\d+)m", alert["for"]))

    def checks() -> list[dict[str, Any]]:  # a list of its own per test: YAML would show a shared one as an alias
        return [
            {"eval_time": f"{minutes - 1}m", "alertname": alert["alert"], "exp_alerts": []},
            {"eval_time": f"{minutes}m", "alertname": alert["alert"], "exp_alerts": expected_alerts(kept, alert)},
        ]

    document = {
        "rule_files": ["idle-gpu-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"name": name, "interval": "1m", "input_series": input_series(kept, restart=restart),
             "alert_rule_test": checks()}
            for name, restart in (("as scraped", False), ("the driver's pod replaced", True))
        ],
    }  # fmt: skip
    return "# file: idle-gpu-test.yaml\n" + yaml.safe_dump(document, sort_keys=False, width=1000)


def test_idle_allocated_gpus_alert_over_the_series_a_running_driver_serves(
    root: Path, api: FakeApiServer, tmp_path: Path
) -> None:
    samples = run_the_node(root, api)
    pods = sorted(ls["pod"] for n, ls, _ in samples if n == SERIES[0])
    assert pods == sorted(pod for h in HOLDERS for pod, _ in h.pods)  # one series per pod, two on the shared GPU
    # A MIG device (and its GPU, now in MIG mode) has no utilisation: the rule cannot cover it.
    assert not any(n == SERIES[1] and ls["device"].startswith(MIG_DEVICE[:16]) for n, ls, _ in samples)

    rule = rendered_rule()
    written = promtool_test(samples, rule)
    (tmp_path / "idle-gpu-rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "idle-gpu-test.yaml").write_text(written)
    done = run_promtool("test", "rules", "idle-gpu-test.yaml", cwd=tmp_path)
    assert done.returncode == 0, written + done.stdout + done.stderr

    assert page_files(PAGE)["idle-gpu-test.yaml"] == written, f"docs/recipes/{PAGE}: paste the test:\n{written}"
