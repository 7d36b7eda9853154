"""Every test passes alone and in any order (issue #31): a seeded random sample of the cheap tiers' tests, each run
by itself in a pytest process of its own, and one random module's tests run in reverse order. A test that leans on
what a sibling left (a release an earlier test installed, a library an earlier test loaded) fails here.

Each run draws another sample; a failure names its seed, and ``DRADRIVER_ALONE_SEED=<seed>`` draws the same one
again (``DRADRIVER_ALONE_COUNT`` sets how many tests run alone). The tiers of real components (cluster, node,
integration, e2e, the image) are left out: one process each would start their control plane, node or container
again, minutes instead of seconds; their modules install what they need in fixtures (docs/development.md)."""

from __future__ import annotations

import functools
import os
import random
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Left out of the sample: the real components' tiers, the image, mypy over src (a minute alone), this module.
LEFT_OUT = ("tests/cluster", "tests/node", "tests/integration", "tests/gpu", "tests/test_image.py",
            "tests/test_code_quality.py", "tests/test_isolation.py")  # fmt: skip
ALONE = 6
# The reversed module is one whose tests take seconds, not the CEL conformance tables'.
REVERSED_AT_MOST = 60
TIMEOUT = 300


def pytest_args(*args: str) -> list[str]:
    """One pytest process, no xdist (as `pytest -n 0 <id>` reproduces it), sharing no cache with the suite."""
    return [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *args]


@functools.cache
def modules() -> dict[str, list[str]]:
    """The cheap tiers' test ids by module, in collection order."""
    ignores = [f"--ignore={path}" for path in LEFT_OUT]
    done = subprocess.run(pytest_args("--collect-only", "tests", *ignores), capture_output=True, text=True,
                          cwd=REPO, timeout=TIMEOUT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found: dict[str, list[str]] = defaultdict(list)
    # An id with characters pytest escapes in its listing (\u…) would not name the test again.
    for test_id in (line for line in done.stdout.splitlines() if "::" in line and "\\" not in line):
        found[test_id.split("::", 1)[0]].append(test_id)
    assert found, done.stdout[-3000:]
    return dict(found)


def seed() -> int:
    return int(os.environ.get("DRADRIVER_ALONE_SEED") or random.SystemRandom().randrange(2**32))


def run(ids: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pytest_args(*ids), capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT, check=False)


def failed(ids: list[str], done: subprocess.CompletedProcess[str], drawn: int) -> str:
    """What failed, how to draw it again and how to run it; the end of its output."""
    command = shlex.join(["pytest", "-n", "0", *ids])
    return (f"{' '.join(ids)}: exit status {done.returncode} (seed {drawn}: DRADRIVER_ALONE_SEED={drawn} draws it "
            f"again; `{command}` runs it)\n{done.stdout[-2500:]}{done.stderr[-1000:]}")  # fmt: skip


def test_a_random_sample_of_tests_each_pass_alone() -> None:
    drawn = seed()
    chooser = random.Random(drawn)
    count = int(os.environ.get("DRADRIVER_ALONE_COUNT") or ALONE)
    # One test of each of several modules: the CEL tables hold a third of the ids, not a third of the risk.
    picked = [chooser.choice(modules()[name]) for name in chooser.sample(sorted(modules()), count)]
    print(f"seed {drawn}: {picked}")
    failures = [failed([test_id], done, drawn) for test_id in picked if (done := run([test_id])).returncode != 0]
    assert not failures, "\n\n".join(failures)


def test_a_random_modules_tests_pass_in_reverse_order() -> None:
    drawn = seed()
    small = sorted(name for name, ids in modules().items() if 1 < len(ids) <= REVERSED_AT_MOST)
    reverse = list(reversed(modules()[random.Random(drawn).choice(small)]))
    print(f"seed {drawn}: {reverse}")
    done = run(reverse)
    assert done.returncode == 0, failed(reverse, done, drawn)
