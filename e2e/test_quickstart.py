"""README's "Try it on kind", the rest of it: after the commands that made the suite's cluster (the kind_run
fixture), the ones that run a scenario, as written; the pod prints the simulated GPU it was given."""

from __future__ import annotations

import re

import kind_backend
import pytest

pytestmark = pytest.mark.e2e


def test_the_readme_quickstart_runs_a_scenario_on_kind(kind_run: kind_backend.KindRun) -> None:
    rest = kind_backend.quickstart()[len(kind_backend.setup_commands()) :]
    assert rest, "README's kind quickstart runs no scenario after installing the chart"
    printed = [kind_run.sh(line, timeout=300) for line in rest]
    # The command that waits for the pod prints its logs: the device the driver's CDI spec gave the container.
    assert any(re.search(r"^DRADRIVER_DEVICE_\S+=GPU-", out, re.M) for out in printed), printed
