"""The idle-GPU alert as the chart ships it (metrics.prometheusRule) and as docs/recipes/idle-gpu-alert.md shows it:
rendered only when asked, its values reaching the rule, wrong values refused, every rule accepted by the real
promtool (scripts/build-promtool), the page's rule the one the chart renders and the page's promtool commands
printing what the page shows. tests/integration/test_idle_gpu_alert_process.py unit-tests the rule over the series
a running driver serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helm import CHART, RELEASE, run_helm, template
from support.promtool import rendered_rule, run_promtool
from support.recipe_pages import page_files, transcript

PAGE = "idle-gpu-alert.md"


def idle_alert(rule: dict[str, Any]) -> dict[str, Any]:
    [group] = rule["spec"]["groups"]
    [alert] = group["rules"]
    return alert


def test_the_rule_is_rendered_only_when_asked_with_the_labels_the_prometheus_selects() -> None:
    assert "PrometheusRule" not in {o["kind"] for o in template()}
    rule = rendered_rule("metrics.prometheusRule.labels.release=prometheus")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert (rule["metadata"]["namespace"], rule["metadata"]["labels"]["release"]) == ("dradriver", "prometheus")
    alert = idle_alert(rule)
    assert alert["alert"] == "DradriverAllocatedGPUIdle"
    assert (alert["for"], alert["labels"]) == ("30m", {"severity": "warning"})
    assert alert["expr"].endswith("(100 * avg_over_time(dradriver_device_utilization_ratio[5m]))\n< 10")


def test_the_chart_with_the_rule_lints_strictly() -> None:
    done = run_helm("lint", "--strict", str(CHART), "--set", "metrics.prometheusRule.enabled=true")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_idle_gpu_values_reach_the_rule() -> None:
    alert = idle_alert(
        rendered_rule(
            "metrics.prometheusRule.idleGpu.threshold=2.5",
            "metrics.prometheusRule.idleGpu.for=1h",
            "metrics.prometheusRule.idleGpu.window=10m",
            "metrics.prometheusRule.idleGpu.severity=critical",
        )
    )
    assert alert["expr"].endswith("(100 * avg_over_time(dradriver_device_utilization_ratio[10m]))\n< 2.5")
    assert (alert["for"], alert["labels"]) == ("1h", {"severity": "critical"})
    assert "under 2.5% busy for 1h" in alert["annotations"]["summary"]
    assert "over 10m for at least 1h" in alert["annotations"]["description"]


WRONG = [
    ("metrics.prometheusRule.idleGpu.threshold=0", "threshold"),
    ("metrics.prometheusRule.idleGpu.threshold=150", "threshold"),
    ("metrics.prometheusRule.idleGpu.threshold=0.0", "threshold"),  # --set leaves a decimal a string
    ("metrics.prometheusRule.idleGpu.for=30", "for"),
    ("metrics.prometheusRule.idleGpu.window=five minutes", "window"),
    ("metrics.prometheusRule.idleGpu.severity=", "severity"),
    ("metrics.prometheusRule.idleGpu.threshhold=5", "threshhold"),
]


@pytest.mark.parametrize(("value", "named"), WRONG, ids=[v for v, _ in WRONG])
def test_a_wrong_idle_gpu_value_fails_naming_it(value: str, named: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), "--set", "metrics.prometheusRule.enabled=true", "--set", value)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


def test_the_service_monitor_keeps_the_workloads_namespace_and_pod_and_adds_the_node() -> None:
    [monitor] = [o for o in template("--set", "metrics.serviceMonitor.enabled=true") if o["kind"] == "ServiceMonitor"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]


@pytest.mark.parametrize(
    "values",
    [(), ("metrics.prometheusRule.idleGpu.threshold=0.5", "metrics.prometheusRule.idleGpu.for=2h30m")],
    ids=["defaults", "other values"],
)
def test_promtool_accepts_the_rendered_rule(values: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rule(*values)["spec"]))
    done = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rules found" in done.stdout


def test_the_page_shows_the_rule_the_chart_renders() -> None:
    shown = yaml.safe_load(page_files(PAGE)["idle-gpu-rules.yaml"])
    assert shown == rendered_rule()["spec"], "docs/recipes/idle-gpu-alert.md: paste the chart's rule:\n" + yaml.dump(
        rendered_rule()["spec"], sort_keys=False
    )


@pytest.mark.parametrize("section", ["## Checking the rule and its test", "## With DCGM exporter"])
def test_the_pages_promtool_commands_print_what_the_page_shows(section: str, tmp_path: Path) -> None:
    for name, text in page_files(PAGE).items():
        (tmp_path / name).write_text(text)
    steps = transcript(PAGE, section)
    assert steps, f"docs/recipes/{PAGE}: no commands under {section!r}"
    for step in steps:
        program, *args = step.command.split()
        assert program == "promtool", step.command
        done = run_promtool(*args, cwd=tmp_path)
        assert done.returncode == 0, step.command + "\n" + done.stdout + done.stderr
        printed = re.sub(r"\n+$", "", done.stdout + done.stderr)
        assert printed == step.output, f"$ {step.command}\nthe page shows:\n{step.output}\nit printed:\n{printed}"


def test_the_dcgm_test_joins_the_allocation_series_the_driver_served() -> None:
    """The DCGM variant's test holds the allocation series of the page's main test, which a running driver served
    (tests/integration/test_idle_gpu_alert_process.py); only DCGM exporter's are written by hand."""
    files = page_files(PAGE)

    def allocations(name: str) -> list[str]:
        test = yaml.safe_load(files[name])["tests"][0]  # the main test's first: the series as scraped
        return [s["series"] for s in test["input_series"] if s["series"].startswith("dradriver_device_allocation")]

    assert allocations("idle-gpu-dcgm-test.yaml") == allocations("idle-gpu-test.yaml") != []
