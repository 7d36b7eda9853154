"""Owner-only: every file, directory and socket `dradriver run` creates under its directories, after a prepare
that carves a MIG partition and starts an MPS daemon, has the mode docs/reliability.md ("Who can read what")
gives it. Anything new the driver starts writing fails here until it is given a mode on purpose."""

from __future__ import annotations

import stat
from fnmatch import fnmatch
from pathlib import Path

from support.apiserver import FakeApiServer

from dradriver.plugin.kubeletplugin.kubelet_client import Claim, KubeletClient
from integration.test_run_process import NODE, DriverProcess

DRIVER = "gpu.dradriver.dev"
API = "gpu.dradriver.dev/v1alpha1"
PARTITION = "gpu-0000-1b-00-0-mig-1g10gb-0"
WHOLE = "gpu-0000-43-00-0"

# (pattern relative to the test's root, mode, why); the first that matches a path decides. Directories are
# matched with their own path; "*" crosses "/" (fnmatch), so "a/*" covers everything below a.
EXCEPTIONS = [
    ("kubeconfig", None, "the test's own file"),
    ("plugin/sim-driver-root", 0o755, "the simulated host driver files (libraries and tools containers mount)"),
    ("plugin/sim-driver-root/*", None, "as above: stand-ins for files the NVIDIA driver installs on a host"),
    ("plugin/mps/*/pipe", 0o755, "the MPS pipe directory, mounted into the claim's containers (any user)"),
    ("plugin/mps/*/log", 0o755, "the MPS log directory, mounted into the claim's containers (any user)"),
    ("plugin/mps/*/pipe/*", None, "the MPS control daemon's own files"),
    ("plugin/mps/*/log/*", None, "the MPS control daemon's own files"),
    ("plugin/mps/*/shm", 0o1777, "the /dev/shm of the claim's daemon and containers (any user, sticky)"),
    ("plugin/mps/*/shm/*", None, "the MPS daemon's and its clients' shared memory"),
    ("plugin/dra-device-metadata", 0o755, "device metadata (KEP-5304): containers read it as any user"),
    ("plugin/dra-device-metadata/*", "0o755 dirs, 0o644 files", "as above"),
    ("cdi", 0o755, "the CDI directory: shared with the container runtime and other drivers"),
    ("cdi/*-metadata_*.json", 0o644, "the device metadata CDI spec mounts world-readable files"),
]


def expected(relative: str, is_dir: bool) -> int | None:
    for pattern, mode, _why in EXCEPTIONS:
        if fnmatch(relative, pattern):
            if isinstance(mode, str):
                return 0o755 if is_dir else 0o644
            return mode
    return 0o700 if is_dir else 0o600


def test_every_file_and_socket_the_driver_creates_is_owner_only_but_the_documented_exceptions(
    root: Path, api: FakeApiServer
) -> None:
    driver = DriverProcess(
        root,
        api.write_kubeconfig(root / "kubeconfig"),
        "--mig-mode",
        "dynamic",
        "--rescan-interval",
        "0",
        "--device-metadata",
        "true",
        profile="hgx-h100-80gb",
    )
    try:
        driver.wait_ready()
        created = api.create(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "modes", "namespace": "default"},
                "spec": {
                    "devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 2}}]}
                },
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d}
                                for d in (PARTITION, WHOLE)
                            ],
                            "config": [
                                {
                                    "source": "FromClaim",
                                    "opaque": {
                                        "driver": DRIVER,
                                        "parameters": {"apiVersion": API, "kind": kind, "sharing": {"strategy": "MPS"}},
                                    },
                                }
                                for kind in ("MigDeviceConfig", "GpuConfig")
                            ],
                        }
                    }
                },
            },
            namespace="default",
        )
        claim = Claim("default", "modes", created["metadata"]["uid"])
        with KubeletClient(root / "registry").register() as kubelet:
            assert kubelet.prepare([claim])[claim.uid].error == "", driver.log
            found = {}
            for path in sorted(root.rglob("*")):
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    continue  # a link's own mode means nothing
                found[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), stat.S_ISDIR(info.st_mode))
            assert kubelet.unprepare([claim]) == {claim.uid: ""}
    finally:
        driver.stop()
    # What this test is about is there: sockets, checkpoint, health state, MPS, CDI and metadata files.
    for name in (
        "plugin/dra.sock",
        "registry/gpu.dradriver.dev-reg.sock",
        "plugin/checkpoint.json",
        "plugin/health.json",
    ):
        assert name in found
    assert any(fnmatch(name, "plugin/mps/*/pipe") for name in found)
    assert any(fnmatch(name, "plugin/mps/*/shm") for name in found)
    assert any(fnmatch(name, "cdi/k8s.gpu.dradriver.dev-claim_*.json") for name in found)
    wrong = {
        name: f"{oct(mode)}, expected {oct(want)}"
        for name, (mode, is_dir) in found.items()
        if (want := expected(name, is_dir)) is not None and mode != want
    }
    assert wrong == {}
