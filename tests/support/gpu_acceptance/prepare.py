"""``scripts/gpu-acceptance --prepare``: build, on a machine with the network and no GPU, everything the GPU
machine (no network, Python 3.12, root, NVIDIA's driver and nothing else) needs, into the kit folder
(:mod:`~support.gpu_acceptance.kit` says what is where). Downloads and builds are cached in
``${XDG_CACHE_HOME:-~/.cache}/dradriver/gpu-acceptance``; the kit itself is rebuilt from the cache each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from support.gpu_acceptance import host
from support.gpu_acceptance.kit import REPO, TARGET_PYTHON, WORKLOAD_DIR, WORKLOADS

#: Debian packages the kit takes files from (the release of the machine that prepares it).
DEBS = ("runc", "libseccomp2", "libc6", "libgcc-s1", "busybox-static", "ocl-icd-libopencl1", "libegl1", "libglvnd0")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")
EXTRA_WHEELS = ("pytest", "pip")
TRIPLET = "x86_64-linux-gnu"
TRAVEL_LIMIT = 64 * 1024 * 1024
BUSYBOX_APPLETS = ("sh", "env", "ls", "cat", "true", "echo", "test", "grep", "head", "mount")
#: Libraries from the loaders' packages: an application image's part of OpenCL and EGL, not the driver's.
LOADERS = ("libOpenCL.so.1", "libEGL.so.1", "libGLdispatch.so.0")
DEVICE_COMMAND = "PYTHONUNBUFFERED=1 scripts/gpu-acceptance --out $OUT"
DEVICE_TIMEOUT_S = 480


def say(message: str) -> None:
    print(f"gpu-acceptance --prepare: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "dradriver/gpu-acceptance"
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(*parts: bytes) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(part)
        hashed.update(b"\0")
    return hashed.hexdigest()[:16]


def run(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run ``command``; its stdout, or SystemExit naming the step and its output's end."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gpu-acceptance --prepare: {' '.join(command[:4])} … failed: {done.stderr.strip()[-1500:]}")
    return done.stdout


def own_wheel(dest: Path) -> Path:
    """dradriver built from this checkout (pure Python, any platform)."""
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(REPO)])
    return next(dest.glob("dradriver-*.whl"))


def wheelhouse(own: Path) -> Path:
    """The dependencies of ``own`` (pinned by constraints.txt) and the extras, for the target Python, cached by
    the pins and the requirements."""
    stamp = digest(
        (REPO / "constraints.txt").read_bytes(),
        (REPO / "pyproject.toml").read_bytes(),
        " ".join(EXTRA_WHEELS + PLATFORMS).encode(),
        TARGET_PYTHON.encode(),
    )
    folder = cache_dir() / f"wheels-{stamp}"
    if not (folder / ".done").exists():
        say(f"downloading wheels for CPython {TARGET_PYTHON} into {folder}")
        shutil.rmtree(folder, ignore_errors=True)
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary=:all:",
                "--python-version",
                TARGET_PYTHON,
                "--implementation",
                "cp",
                "--abi",
                f"cp{TARGET_PYTHON.replace('.', '')}",
                *platforms,
                "-c",
                str(REPO / "constraints.txt"),
                "-d",
                str(folder),
                str(own),
                *EXTRA_WHEELS,
            ]
        )
        (folder / ".done").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return folder


def debian_packages() -> dict[str, Path]:
    """The .deb of each of :data:`DEBS`, downloaded once with apt-get (after an update if the lists are stale)."""
    folder = cache_dir() / "debs"
    folder.mkdir(exist_ok=True)

    def found() -> dict[str, Path]:
        return {name: hit for name in DEBS if (hit := next(iter(sorted(folder.glob(f"{name}_*.deb"))), None))}

    missing = [name for name in DEBS if name not in found()]
    if missing:
        say(f"apt-get download {' '.join(missing)}")
        done = subprocess.run(
            ["apt-get", "download", *missing], cwd=folder, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            run(["apt-get", "update", "-q"])
            run(["apt-get", "download", *missing], cwd=folder)
    return found()


def unpack_deb(deb: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    run(["dpkg-deb", "-x", str(deb), str(dest)])
    return dest


def go_command() -> str:
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("gpu-acceptance --prepare: no Go toolchain (install Go >= 1.23 or set GO=/path/to/go)")


def cdi_apply() -> Path:
    """tools/cdi-apply built static (CGO off), cached by its sources."""
    source = REPO / "tools/cdi-apply"
    stamp = digest(*(p.read_bytes() for p in sorted(source.iterdir()) if p.is_file()))
    binary = cache_dir() / f"cdi-apply-{stamp}"
    if not binary.exists():
        say("building tools/cdi-apply")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath -mod=mod"}
        run([go_command(), "build", "-ldflags", "-s -w", "-o", str(binary), "."], cwd=source, env=env)
    return binary


def cdi_hook() -> Path:
    """NVIDIA's nvidia-cdi-hook from scripts/build-cdi-hook (built there once, cached)."""
    return Path(run([str(REPO / "scripts/build-cdi-hook")]).strip().splitlines()[-1])


def ptx_header(ptx: Path) -> str:
    """workloads/kernel.ptx as a C string (the program carries its kernel: no file to find at run time)."""
    escaped = (line.replace("\\", "\\\\").replace('"', '\\"') for line in ptx.read_text().splitlines())
    return "static const char KERNEL_PTX[] =\n" + "".join(f'    "{line}\\n"\n' for line in escaped) + ";\n"


def workloads(build: Path) -> dict[str, Path]:
    """The three C programs, compiled here against glibc alone (libcuda, libOpenCL and libEGL are dlopen'ed)."""
    sources = Path(__file__).parent / "workloads"
    build.mkdir(parents=True, exist_ok=True)
    (build / "kernel_ptx.h").write_text(ptx_header(sources / "kernel.ptx"))
    built = {}
    for name in WORKLOADS:
        source = sources / f"{name.replace('-', '_')}.c"
        built[name] = build / name
        run(
            [
                os.environ.get("CC", "cc"),
                "-O2",
                "-std=c11",
                "-D_GNU_SOURCE",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-I{build}",
                "-o",
                str(built[name]),
                str(source),
                "-ldl",
            ]
        )
    return built


def libdir(unpacked: Path) -> Path:
    """Where a Debian package keeps its multiarch libraries (``lib/`` before the /usr merge, ``usr/lib/`` after)."""
    for candidate in (unpacked / "lib" / TRIPLET, unpacked / "usr/lib" / TRIPLET):
        if candidate.is_dir():
            return candidate
    raise SystemExit(f"gpu-acceptance --prepare: no {TRIPLET} libraries in {unpacked}")


def copy_real(source: Path, dest: Path) -> None:
    """Copy what ``source`` points to (through its symlinks) to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source.resolve(), dest)


def rootfs(stage: Path, debs: dict[str, Path], built: dict[str, Path]) -> None:
    """The container image: merged-/usr Debian glibc, busybox for a shell, the OpenCL and EGL loaders, the
    workloads in /opt/gpu-acceptance. Nothing that helps the driver's files be found (no ld.so.cache)."""
    root, lib = stage / "rootfs", stage / "rootfs/usr/lib" / TRIPLET
    libc = libdir(unpack_deb(debs["libc6"], stage / "deb/libc6"))
    shutil.copytree(libc, lib, symlinks=True, ignore=shutil.ignore_patterns("gconv", "audit", "*.a"))
    copy_real(libc / "ld-linux-x86-64.so.2", root / "usr/lib64/ld-linux-x86-64.so.2")
    copy_real(libdir(unpack_deb(debs["libgcc-s1"], stage / "deb/gcc")) / "libgcc_s.so.1", lib / "libgcc_s.so.1")
    for package in ("ocl-icd-libopencl1", "libegl1", "libglvnd0"):
        unpacked = libdir(unpack_deb(debs[package], stage / "deb" / package))
        for soname in LOADERS:
            if (unpacked / soname).exists():
                copy_real(unpacked / soname, lib / soname)
                copy_real(unpacked / soname, stage / "loaders" / soname)
    busybox = unpack_deb(debs["busybox-static"], stage / "deb/busybox") / "bin/busybox"
    copy_real(busybox, root / "usr/bin/busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "usr/bin" / applet).symlink_to("busybox")
    for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin"), ("sbin", "usr/sbin")):
        (root / link).symlink_to(target)
    for folder in ("usr/sbin", "etc", "root", "dev", "proc", "sys", "tmp", "var/log"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    opt = root / WORKLOAD_DIR.lstrip("/")
    for name, program in built.items():
        copy_real(program, opt / name)
    copy_real(Path(__file__).parent / "workloads/run-workloads.sh", opt / "run-workloads.sh")


def stage_payload(stage: Path, debs: dict[str, Path]) -> dict[str, str]:
    """Everything of the payload laid out in ``stage``; returns where each binary came from."""
    hook, apply = cdi_hook(), cdi_apply()
    runc = unpack_deb(debs["runc"], stage / "deb/runc") / "usr/sbin/runc"
    seccomp = libdir(unpack_deb(debs["libseccomp2"], stage / "deb/seccomp")) / "libseccomp.so.2"
    for source, dest in (
        (runc, "bin/runc"),
        (hook, "bin/nvidia-cdi-hook"),
        (apply, "bin/cdi-apply"),
        (seccomp, "lib/libseccomp.so.2"),
    ):
        copy_real(source, stage / dest)
    rootfs(stage, debs, workloads(stage / "build"))
    shutil.rmtree(stage / "deb")
    shutil.rmtree(stage / "build")
    return {"runc": debs["runc"].name, "nvidia-cdi-hook": str(hook), "cdi-apply": str(apply)}


def pack(stage: Path, payload: Path) -> None:
    """``stage`` as one xz tarball (the binaries shrink to a third; the wheels are already compressed)."""
    partial = payload.with_suffix(".partial")
    with tarfile.open(partial, "w:xz", preset=6) as archive:
        for entry in sorted(stage.iterdir()):
            archive.add(entry, arcname=entry.name)
    partial.replace(payload)


def travelling_bytes() -> int:
    """The bytes of the checkout that travel without being named: tracked and untracked files git does not ignore."""
    listed = run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    total = 0
    for name in {n for n in listed.split("\0") if n}:
        path = REPO / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def carry_path(kit: Path) -> str:
    try:
        return str(kit.resolve().relative_to(REPO))
    except ValueError:
        return ""


def fill_kit(kit: Path) -> dict[str, object]:
    """Rebuild ``kit`` from the cache: the wheelhouse and the payload; returns the manifest's sources."""
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-") as scratch:
        own = own_wheel(Path(scratch) / "own")
        wheels = wheelhouse(own)
        debs = debian_packages()
        stage = Path(scratch) / "stage"
        sources = stage_payload(stage, debs)
        if kit.exists():
            shutil.rmtree(kit)
        (kit / "wheels").mkdir(parents=True)
        for wheel in [*sorted(wheels.glob("*.whl")), own]:
            if wheel.name.startswith("dradriver-") and wheel != own:
                continue
            shutil.copy2(wheel, kit / "wheels" / wheel.name)
        say("packing the payload (xz)")
        pack(stage, kit / "payload.tar.xz")
    return {"debs": sorted(d.name for d in debs.values()), **sources}


def prepare(kit: Path) -> int:
    """Build the kit, write its manifest, and print its size, what must travel and the command to run there."""
    sources = fill_kit(kit)
    kit_bytes, tree_bytes = folder_bytes(kit), travelling_bytes()
    carry = carry_path(kit)
    wheels = sorted(p.name for p in (kit / "wheels").glob("*.whl"))
    manifest = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "targetPython": TARGET_PYTHON,
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "srcHash": host.tree_hash(REPO / "src"),
        "wheels": wheels,
        "sources": sources,
        "bytes": {"kit": kit_bytes, "tree": tree_bytes, "travels": kit_bytes + tree_bytes, "limit": TRAVEL_LIMIT},
        "carry": [carry],
        "command": DEVICE_COMMAND,
        "timeoutSeconds": DEVICE_TIMEOUT_S,
    }
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    mib = 1024 * 1024
    print(f"kit: {kit} ({kit_bytes / mib:.1f} MiB: {len(wheels)} wheels, payload.tar.xz)")
    print(
        f"travels: {(kit_bytes + tree_bytes) / mib:.1f} MiB of {TRAVEL_LIMIT // mib} MiB "
        f"(the checkout {tree_bytes / mib:.1f} MiB + the kit)"
    )
    if not carry:
        print(f"the kit is outside the checkout ({REPO}): it cannot travel; use the default --kit")
        return 2
    print(f"carry: {json.dumps([carry])}")
    print(
        f"run (device tool): command={json.dumps(DEVICE_COMMAND)}, carry={json.dumps([carry])}, "
        f"timeout_s={DEVICE_TIMEOUT_S}"
    )
    if kit_bytes + tree_bytes > TRAVEL_LIMIT:
        print("over the limit: the device tool would refuse it")
        return 1
    return 0
