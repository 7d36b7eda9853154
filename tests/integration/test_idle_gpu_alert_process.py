"""The chart's idle-GPU alert unit-tested by the real promtool over the series a running `dradriver run` serves: a
simulated node where one pod's GPU is barely used, another's is busy, a third pod holds a MIG device and a GPU is
free. Their /metrics series, label sets and values as scraped, become the input of a `promtool test rules` file as
Prometheus would store them (scraped through the chart's ServiceMonitor); only the idle allocated GPU alerts, and
only once the rule's `for` has passed. The page docs/recipes/idle-gpu-alert.md shows that file as written here."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
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
IDLE_GPU, BUSY_GPU, FREE_GPU = "gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-87-00-0"
MIG_DEVICE = "gpu-0000-47-00-0-mig-1g5gb-0"
#: (claim, device, pod, pod UID, utilisation in percent of the pod's CUDA process; None: no process)
HOLDERS = (
    ("trainer", IDLE_GPU, "trainer-0", "6f1d2c3b-4a59-4e8f-9b7a-0c1d2e3f4a5b", 3),
    ("inference", BUSY_GPU, "server-0", "9f8e7d6c-5b4a-4321-8fed-cba987654321", 80),
    ("notebook", MIG_DEVICE, "notebook-0", "1f8e7d6c-5b4a-4321-8fed-cba987654322", None),
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
SERIES = ("dradriver_device_allocation_info", "dradriver_device_utilization_ratio")
MINUTES = 60  # of series in the test: twice the rule's default `for`


def scraped(port: int) -> list[tuple[str, dict[str, str], float]]:
    """The allocation and utilisation samples of one scrape: (name, labels, value)."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(_get(port, "/metrics")[1])
        for sample in family.samples
        if sample.name in SERIES
    ]


def published(api: FakeApiServer) -> set[str]:
    return {d["name"] for s in our_slices(api) for d in s["spec"].get("devices", [])}


def run_the_node(root: Path, api: FakeApiServer) -> list[tuple[str, dict[str, str], float]]:
    """Prepare HOLDERS' claims on a simulated node, start their CUDA processes, and scrape once the usage sample
    shows them."""
    driver = DriverProcess(root, api.write_kubeconfig(root / "kubeconfig"), "--mig-mode", "dynamic",
                           "--rescan-interval", "0", "--usage-interval", "1", profile=PROFILE)  # fmt: skip
    try:
        driver.wait_ready()
        wanted = {device for _, device, *_ in HOLDERS}
        assert eventually(lambda: wanted <= published(api)), driver.log
        claims = [allocated_claim(api, claim, [device], pods={pod: uid}) for claim, device, pod, uid, _ in HOLDERS]
        with KubeletClient(root / "registry").register() as plugin:
            assert all(result.error == "" for result in plugin.prepare(claims).values()), driver.log
        port = _status_port(driver)
        uuids = {labels["device"]: labels["uuid"] for _, labels, _ in scraped(port)}
        hardware = SimulatedNode(load_node_profile(PROFILE), node_name=NODE, state_path=root / "sim.json")
        for pid, (_, device, _, uid, busy) in enumerate(HOLDERS, start=4242):
            if busy is not None:
                hardware.start_process(uuids[device], pid, 1 << 30, busy, pod_uid=uid)

        def utilisation() -> dict[str, float]:
            return {labels["device"]: value for name, labels, value in scraped(port) if name == SERIES[1]}

        expected = {IDLE_GPU: 0.03, BUSY_GPU: 0.8, FREE_GPU: 0.0}
        assert eventually(lambda: expected.items() <= utilisation().items()), (utilisation(), driver.log)
        return scraped(port)
    finally:
        driver.stop(signal.SIGKILL)


def series_text(name: str, labels: Mapping[str, str]) -> str:
    """A series in promtool's notation with the target's labels added the way a scrape adds them, empty labels
    dropped as Prometheus drops them when it stores a sample."""
    stored = {**TARGET, **{k: v for k, v in labels.items() if v}}
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


def promtool_test(samples: list[tuple[str, dict[str, str], float]], rule: dict[str, Any]) -> str:
    """The promtool unit test: the scraped series held at their values for MINUTES minutes (the free GPU's
    utilisation among them, the MIG device's allocation too); no alert a minute before the rule's `for`, then only
    the idle allocated GPU's."""
    kept = [(n, ls, v) for n, ls, v in samples if n == SERIES[0] or ls["device"] in (IDLE_GPU, BUSY_GPU, FREE_GPU)]
    alert = rule["spec"]["groups"][0]["rules"][0]
    minutes = int(matched(r"(\d+)m", alert["for"]))
    [(_, idle, _)] = [(n, ls, v) for n, ls, v in kept if n == SERIES[0] and ls["device"] == IDLE_GPU]
    grouped = matched(r"max by \(([^)]*)\) \(.*", alert["expr"]).split(", ")
    labels = {k: v for k, v in sorted({**TARGET, **idle}.items()) if k in grouped and v}
    [idle_value] = [v for n, ls, v in kept if n == SERIES[1] and ls["device"] == IDLE_GPU]
    shown_value = f"{idle_value * 100:.4g}"  # Prometheus's humanize of a value under 1000
    document = {
        "rule_files": ["idle-gpu-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series_text(n, ls), "values": f"{v:g}+0x{MINUTES}"}
                    for n, ls, v in sorted(kept, key=lambda s: (s[0], s[1]["device"]))
                ],
                "alert_rule_test": [
                    {"eval_time": f"{minutes - 1}m", "alertname": alert["alert"], "exp_alerts": []},
                    {
                        "eval_time": f"{minutes}m",
                        "alertname": alert["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, **alert["labels"]},
                                "exp_annotations": {
                                    k: fill(v, labels, shown_value) for k, v in alert["annotations"].items()
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    return "# file: idle-gpu-test.yaml\n" + yaml.safe_dump(document, sort_keys=False, width=1000)


def test_only_the_idle_allocated_gpu_alerts_over_the_series_a_running_driver_serves(
    root: Path, api: FakeApiServer, tmp_path: Path
) -> None:
    samples = run_the_node(root, api)
    devices = sorted(ls["device"] for n, ls, _ in samples if n == SERIES[0])
    assert devices == sorted([IDLE_GPU, BUSY_GPU, MIG_DEVICE])
    # A MIG device (and its GPU, now in MIG mode) has no utilisation: the rule cannot cover it.
    assert not any(n == SERIES[1] and ls["device"].startswith(MIG_DEVICE[:16]) for n, ls, _ in samples)

    rule = rendered_rule()
    written = promtool_test(samples, rule)
    (tmp_path / "idle-gpu-rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "idle-gpu-test.yaml").write_text(written)
    done = run_promtool("test", "rules", "idle-gpu-test.yaml", cwd=tmp_path)
    assert done.returncode == 0, written + done.stdout + done.stderr

    assert page_files(PAGE)["idle-gpu-test.yaml"] == written, f"docs/recipes/{PAGE}: paste the test:\n{written}"
