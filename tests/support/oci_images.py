"""Container images without a registry: OCI image archives written here from Debian's busybox-static, for the
`node` tests' containerd (imported with ``ctr images import``).

One layer (busybox and a link per applet) serves two images: the workload image the example scenarios name
(``busybox:1.36``) and the pod sandbox ("pause") image, whose entrypoint only sleeps. The sandbox never shares
its PID namespace here, so it has no zombies to reap.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")
# The names the kubelet and containerd use: the workload image the scenarios name, as containerd normalises it.
WORKLOAD_IMAGE = "docker.io/library/busybox:1.36"
SANDBOX_IMAGE = "localhost/dradriver/pause:1"
# Directories a container's runtime mounts over or a program expects.
DIRECTORIES = ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run", "root")


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Image:
    name: str
    entrypoint: list[str]
    cmd: list[str]


IMAGES = (
    Image(WORKLOAD_IMAGE, [], ["sh"]),
    Image(SANDBOX_IMAGE, ["/bin/sleep", "infinity"], []),
)


def busybox_applets(busybox: Path = BUSYBOX) -> list[str]:
    """The applets a static busybox offers (``busybox --list``)."""
    if not busybox.is_file():
        raise ImageError(f"{busybox} is missing: install Debian's busybox-static package")
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=30)
    return sorted({name for name in out.stdout.split() if name and "/" not in name and name != "busybox"})


def _entry(name: str, kind: bytes, mode: int, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = 0  # reproducible: the same layer digest every time
    return info


def busybox_layer(busybox: Path = BUSYBOX) -> bytes:
    """An uncompressed layer tar: the directories, ``bin/busybox`` and a symlink per applet."""
    applets = busybox_applets(busybox)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in DIRECTORIES:
            tar.addfile(_entry(directory, tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755))
        data = busybox.read_bytes()
        tar.addfile(_entry("bin/busybox", tarfile.REGTYPE, 0o755, size=len(data)), io.BytesIO(data))
        for applet in applets:
            tar.addfile(_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        tar.addfile(_entry("etc/passwd", tarfile.REGTYPE, 0o644, size=len(passwd)), io.BytesIO(passwd))
        group = b"root:x:0:\n"
        tar.addfile(_entry("etc/group", tarfile.REGTYPE, 0o644, size=len(group)), io.BytesIO(group))
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def write_archive(path: Path, image: Image, layer: bytes) -> Path:
    """An OCI image archive (oci-layout, index.json, blobs) of ``image`` on ``layer``, tarred to ``path``; the
    index names the image, so ``ctr images import`` registers it under that name."""
    compressed = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            **({"Entrypoint": image.entrypoint} if image.entrypoint else {}),
            **({"Cmd": image.cmd} if image.cmd else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    config_blob = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _digest(config_blob),
            "size": len(config_blob),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": _digest(compressed),
                "size": len(compressed),
            }
        ],
    }
    manifest_blob = _json(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": image.name,
                    "org.opencontainers.image.ref.name": image.name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json(index),
        **{f"blobs/sha256/{_digest(b).removeprefix('sha256:')}": b for b in (config_blob, manifest_blob, compressed)},
    }
    with tarfile.open(path, "w") as tar:
        tar.addfile(_entry("blobs", tarfile.DIRTYPE, 0o755))
        tar.addfile(_entry("blobs/sha256", tarfile.DIRTYPE, 0o755))
        for name, data in files.items():
            tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, size=len(data)), io.BytesIO(data))
    return path


def build_archives(directory: Path, busybox: Path = BUSYBOX) -> dict[str, Path]:
    """Every image of :data:`IMAGES` as an archive in ``directory``, by image name."""
    directory.mkdir(parents=True, exist_ok=True)
    layer = busybox_layer(busybox)
    archives = {}
    for number, image in enumerate(IMAGES):
        archives[image.name] = write_archive(directory / f"image-{number}.oci.tar", image, layer)
    return archives


def have_busybox() -> bool:
    return BUSYBOX.is_file() and shutil.which(str(BUSYBOX)) is not None
