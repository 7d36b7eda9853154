"""A bare container built from a CDI spec alone: an image holding only glibc and one program, run by podman.

Nothing in the image helps the driver's files be found: no linker cache, no LD_LIBRARY_PATH, no ldconfig, no
shell. What the program finds, it finds because the spec put it where a plain loader and PATH look.

Two loader families:

- ``debian``: this machine's glibc, the loader at ``/lib64/ld-linux-x86-64.so.2`` and libc in
  ``/usr/lib/x86_64-linux-gnu``; the loader's built-in search path is ``/lib/x86_64-linux-gnu``,
  ``/usr/lib/x86_64-linux-gnu``, ``/lib``, ``/usr/lib``;
- ``rhel``: a glibc built for ``/lib64`` (Debian's ``libc6-amd64``, the biarch glibc of its i386 port, which
  ``scripts/build-biarch-glibc`` unpacks), with libc in ``/usr/lib64``; its built-in search path is ``/lib64``,
  ``/usr/lib64`` (then ``/lib``, ``/usr/lib``), as on RHEL, Fedora, SUSE and Amazon Linux.

podman reads CDI specs only from ``/etc/cdi`` and ``/var/run/cdi``: each run happens in a private mount namespace
where ``/run/cdi`` is the test's spec directory (shared tooling notes §10).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

ARCH = "x86_64-linux-gnu"
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
"""
PROBE = "/opt/probe/probe"
FAMILIES = ("debian", "rhel")


def podman_missing() -> list[str]:
    missing = [tool for tool in ("podman", "runc", "unshare") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def biarch_glibc() -> Path | None:
    """The unpacked ``libc6-amd64`` (its ``lib64/`` holds the loader and libc), if fetched on this machine."""
    script = Path(__file__).resolve().parents[2] / "scripts/build-biarch-glibc"
    found = subprocess.run([str(script), "--print"], capture_output=True, text=True, check=False, timeout=30)
    path = Path(found.stdout.strip())
    return path if found.returncode == 0 and (path / "lib64/ld-linux-x86-64.so.2").exists() else None


@dataclass
class Podman:
    """A private podman (its own storage under ``base``) that runs images with CDI specs from ``cdi_dir``."""

    base: Path

    def __post_init__(self) -> None:
        for folder in ("cdi", "empty", "store", "run", "tmp"):
            (self.base / folder).mkdir(parents=True, exist_ok=True)
        (self.base / "containers.conf").write_text(CONTAINERS_CONF)

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = " ".join(
            [
                "podman",
                f"--root {self.base}/store --runroot {self.base}/run --tmpdir {self.base}/tmp",
                "--events-backend none --cgroup-manager cgroupfs",
                *(f"'{a}'" for a in args),
            ]
        )
        inner = (
            "mount --make-rprivate / && mount -t tmpfs t /run && mkdir -p /run/cdi && "
            f"mount --bind {self.cdi_dir} /run/cdi && "
            f"if [ -d /etc/cdi ]; then mount --bind {self.base}/empty /etc/cdi; fi && exec {command}"
        )
        return subprocess.run(
            ["unshare", "--mount", "sh", "-c", inner],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "CONTAINERS_CONF": str(self.base / "containers.conf")},
            check=False,
        )

    def import_rootfs(self, rootfs: Path, image: str) -> None:
        tar = rootfs.with_suffix(".tar")
        with tarfile.open(tar, "w") as archive:
            archive.add(rootfs, arcname=".")
        done = self.podman("import", str(tar), image)
        if done.returncode != 0:
            raise RuntimeError(f"podman import failed: {done.stderr.strip()[-500:]}")

    def run(self, image: str, cdi_ids: list[str], *command: str) -> subprocess.CompletedProcess[str]:
        devices = [arg for cdi_id in cdi_ids for arg in ("--device", cdi_id)]
        return self.podman("run", "--rm", "--network=none", *devices, image, *command)


def make_rootfs(dest: Path, family: str, probe: Path) -> Path:
    """An image root with only glibc (of ``family``'s layout) and the ``probe`` program at :data:`PROBE`."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "lib64").mkdir(parents=True)
    if family == "debian":
        loader = Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2"))
        libc = Path(os.path.realpath(f"/lib/{ARCH}/libc.so.6"))
        libdir = dest / "usr/lib" / ARCH
    elif family == "rhel":
        glibc = biarch_glibc()
        if glibc is None:
            raise FileNotFoundError("no biarch glibc: run scripts/build-biarch-glibc")
        loader = Path(os.path.realpath(glibc / "lib64/ld-linux-x86-64.so.2"))
        libc = glibc / "lib64/libc.so.6"
        libdir = dest / "usr/lib64"
    else:
        raise ValueError(family)
    libdir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(loader, dest / "lib64/ld-linux-x86-64.so.2")
    shutil.copy2(libc, libdir / "libc.so.6")
    (dest / "opt/probe").mkdir(parents=True)
    shutil.copy2(probe, dest / PROBE.lstrip("/"))
    for folder in ("etc", "tmp", "usr/bin"):
        (dest / folder).mkdir(parents=True, exist_ok=True)
    return dest
