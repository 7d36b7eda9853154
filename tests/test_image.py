"""The image itself, built by scripts/build-image from our Dockerfile (base from Debian's packages, no registry):
it runs dradriver and NVIDIA's nvidia-cdi-hook, discovers a simulated node, carries no build tools, and stays
under its size budget. Needs podman and the image (CI builds it before the suite; elsewhere run
scripts/build-image); without them the tests skip, and fail with DRADRIVER_REQUIRE_CLUSTER set."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from support.image import IMAGE, REPO, archive, podman_run

ROOT = REPO
# What a pull of the image costs each GPU node (uncompressed, as podman reports it).
SIZE_BUDGET_MB = 200


def test_the_archive_is_an_oci_image_containerd_can_import() -> None:
    listing = subprocess.run(["tar", "-tf", str(archive())], capture_output=True, text=True, check=True).stdout.split()
    assert {"oci-layout", "index.json"} <= set(listing)


def test_dradriver_runs_in_the_image(tmp_path: Path) -> None:
    done = podman_run(tmp_path, IMAGE, "--help")
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout and "inventory" in done.stdout


def test_the_image_discovers_a_simulated_node(tmp_path: Path) -> None:
    done = podman_run(tmp_path, IMAGE, "inventory", "--gpu-backend", "sim", "--sim-profile", "dgx-a100-80gb", "-o",
                      "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "A100" in done.stdout


def test_what_the_trimmed_kubernetes_client_still_serves_works(tmp_path: Path) -> None:
    """The build stage removes the kubernetes client's asyncio copy, typed API classes and aiohttp: what the
    driver still takes from it (a kubeconfig's settings for its own transport) and the client's own untyped
    request path (ApiClient's param_serialize + call_api, for anyone scripting in the image) must still work."""
    probe = (
        "import urllib3, kubernetes.client as k, kubernetes.config.incluster_config, kubernetes.config.kube_config\n"
        "import dradriver.plugin.cluster.transport as t, dradriver.cli.run\n"
        "try:\n"
        "    t.Transport(t.from_client_configuration(k.Configuration(host='http://127.0.0.1:9'))).request('GET', '/')\n"
        "except OSError:\n"
        "    print('request sent')\n"
        "api = k.ApiClient(k.Configuration(host='http://127.0.0.1:9'))\n"
        "try:\n"
        "    api.call_api(*api.param_serialize(method='GET', resource_path='/version'))\n"
        "except urllib3.exceptions.HTTPError:\n"
        "    print('request sent')\n"
    )
    done = podman_run(tmp_path, "--entrypoint", "/opt/dradriver/bin/python", IMAGE, "-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["request", "sent"] * 2


def test_the_cdi_hook_is_in_the_image_and_runs(tmp_path: Path) -> None:
    done = podman_run(tmp_path, "--entrypoint", "/usr/local/bin/nvidia-cdi-hook", IMAGE, "--version")
    assert done.returncode == 0, done.stderr
    assert "NVIDIA CDI Hook" in done.stdout
    # The very binary scripts/build-cdi-hook built from the pinned module (its version string is not stamped).
    hook = subprocess.run([str(ROOT / "scripts/build-cdi-hook"), "--print"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()  # fmt: skip
    inside = podman_run(tmp_path, "--entrypoint", "/usr/bin/sha256sum", IMAGE, "/usr/local/bin/nvidia-cdi-hook")
    assert inside.stdout.split()[0] == hashlib.sha256(Path(hook).read_bytes()).hexdigest()


def test_no_build_tool_or_installer_is_left_in_the_image(tmp_path: Path) -> None:
    probe = "for c in pip pip3 gcc cc go make apt-get; do command -v $c && exit 1; done; " \
            "test ! -e /opt/dradriver/bin/pip && test ! -d /opt/dradriver/lib/python3.11/site-packages/pip"  # fmt: skip
    done = podman_run(tmp_path, "--entrypoint", "/bin/sh", IMAGE, "-c", probe)
    assert done.returncode == 0, f"found: {done.stdout}{done.stderr}"


def test_the_image_is_under_its_size_budget() -> None:
    archive()
    inspected = json.loads(subprocess.run(["podman", "image", "inspect", IMAGE], capture_output=True, text=True,
                                          check=True).stdout)  # fmt: skip
    size_mb = inspected[0]["Size"] / 1e6
    assert size_mb < SIZE_BUDGET_MB, f"{IMAGE} is {size_mb:.0f} MB (budget {SIZE_BUDGET_MB} MB)"
