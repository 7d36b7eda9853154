"""The Grafana dashboard shipped with the Helm chart (its dashboards/) and the PromQL in docs/observability.md
query only series the driver exports (a renamed metric would leave a panel silently empty)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deployments" / "helm" / "dradriver" / "dashboards" / "dradriver.json"
METRIC = re.compile(r"\bdradriver_[a-z_]+\b")


def exported() -> set[str]:
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "dradriver").rglob("*.py"))
    return set(re.findall(r'"(dradriver_[a-z_]+)"', source))


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]] + [
        v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)
    ]


def test_the_dashboard_is_grafana_json_with_a_unique_uid_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "dradriver-gpus-by-pod"
    assert dashboard["templating"]["list"][0]["name"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_series_the_dashboard_and_the_docs_query_is_exported() -> None:
    known = exported()
    docs = (ROOT / "docs" / "observability.md").read_text()
    used = {m for e in expressions() for m in METRIC.findall(e)} | set(METRIC.findall(docs))
    assert "dradriver_device_allocation_info" in used
    assert used - known == set()
