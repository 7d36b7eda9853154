"""The simulated node's stub driver root: laid out like an installed driver, safe to write again."""

import os
import subprocess
import sys
from pathlib import Path

from dradriver.computedomain.imexconf import render_config, render_nodes
from dradriver.sim.driver_root import STUB_BINARIES, STUB_IMEX_BINARIES, write_stub_driver_root

VERSION = "580.65.06"


def test_libraries_carry_the_version_with_soname_links_and_binaries_are_executable(tmp_path: Path):
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="aarch64")
    libdir = root / "usr/lib/aarch64-linux-gnu"
    assert (libdir / f"libcuda.so.{VERSION}").is_file()
    assert os.readlink(libdir / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert os.readlink(libdir / "libnvidia-nvvm.so.4") == f"libnvidia-nvvm.so.{VERSION}"
    for name in STUB_BINARIES:
        assert (root / "usr/bin" / name).stat().st_mode & 0o111
    assert list((root / "lib/firmware/nvidia" / VERSION).glob("gsp*.bin"))


def test_writing_the_stub_root_again_is_harmless(tmp_path: Path):
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="x86_64")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    write_stub_driver_root(root, VERSION, machine="x86_64")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_the_stub_imex_tools_run_the_stand_in_through_dradriver_on_path(tmp_path: Path):
    """What a ComputeDomain daemon pod of our image runs when the node mounts the simulated driver's IMEX."""
    root = write_stub_driver_root(tmp_path / "r", VERSION, machine="x86_64")
    assert all((root / "usr/bin" / name).stat().st_mode & 0o111 for name in STUB_IMEX_BINARIES)
    nodes = tmp_path / "nodes.cfg"
    nodes.write_text(render_nodes(2))
    config = tmp_path / "imexd.cfg"
    config.write_text(render_config(pod_ip="127.0.0.1", nodes_file=nodes).replace("50005", "0"))
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tcompute-domain-daemon-0000\n")
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "IMEX_STANDIN_HOSTS": str(hosts)}
    # No daemon listens: the control tool says so as the real one does, with a failing status.
    done = subprocess.run([root / "usr/bin/nvidia-imex-ctl", "-c", config, "-q"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode != 0 and "cannot connect to the IMEX daemon" in done.stderr, done
    usage = subprocess.run([root / "usr/bin/nvidia-imex"], capture_output=True, text=True, env=env, timeout=60,
                           check=False)  # fmt: skip
    assert usage.returncode != 0 and "usage: imex_standin.py daemon" in usage.stderr + usage.stdout, usage
