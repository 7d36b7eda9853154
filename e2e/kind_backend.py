"""The e2e suite's kind backend: a kind cluster made with README's "Try it on kind" commands (docker where its daemon
answers, else podman), on the node image scripts/build-kind made (the public kindest image where none was built),
with this machine's sandbox limits worked around only where they bite (docs/development.md, "kind")."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from kindutil import ROOT, Cluster, kubectl_binary
from support import helm, required

README = ROOT / "README.md"
QUICKSTART_HEADING = "### Try it on kind"
PUBLIC_NODE_IMAGE = "kindest/node:v1.35.0"  # resource.k8s.io/v1 needs 1.34 or newer
# podman's defaults for a container, which a sandbox without CAP_SYS_RESOURCE cannot grant above its own limits.
PODMAN_NOFILE = 1048576


def quickstart() -> list[str]:
    """README's "Try it on kind" commands, one string each (continuation lines joined, comments dropped)."""
    text = README.read_text()
    section = text[text.index(QUICKSTART_HEADING) :]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block, f"README.md: no console block under {QUICKSTART_HEADING!r}"
    joined = block.group(1).replace("\\\n", " ")
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [" ".join(command.split()) for command in commands if command and not command.startswith("#")]


@functools.cache
def provider() -> str | None:
    """The container engine kind runs its nodes with: docker where its daemon answers, else podman, else None."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=60)
        if probe.returncode == 0:
            return "docker"
    return "podman" if shutil.which("podman") else None


def backend() -> str:
    """The e2e backend: $E2E_BACKEND, else kind where a Docker daemon and kind exist (a laptop, a CI runner), else
    local."""
    chosen = os.environ.get("E2E_BACKEND")
    if chosen:
        return chosen
    return "kind" if provider() == "docker" and shutil.which("kind") else "local"


def built_kind() -> Path | None:
    """scripts/build-kind's directory (kind, the node image's name), or None where it was not built."""
    printed = subprocess.run([str(ROOT / "scripts/build-kind"), "--print"], capture_output=True, text=True,
                             check=True, timeout=60)  # fmt: skip
    directory = Path(printed.stdout.strip())
    return directory if (directory / "node-image").is_file() else None


def kind_binary() -> str | None:
    """$KIND, else kind on PATH, else scripts/build-kind's."""
    found = os.environ.get("KIND") or shutil.which("kind")
    built = built_kind()
    if not found and built:
        found = str(built / "kind")
    return found


def node_image() -> str:
    """$KIND_NODE_IMAGE, else scripts/build-kind's image (built or imported now), else the public kindest image."""
    if os.environ.get("KIND_NODE_IMAGE"):
        return os.environ["KIND_NODE_IMAGE"]
    if built_kind() is None:
        if required.demanding():  # scripts/test built it: a failed build fails here, not as a failed pull
            required.need("scripts/build-kind's node image", "the kind e2e suite runs on it", "run scripts/build-kind")
        return PUBLIC_NODE_IMAGE
    # Run again: a built image missing from the engine's store (pruned, another engine) is imported.
    built = run_logged([str(ROOT / "scripts/build-kind")], timeout=3600).strip()
    return (Path(built) / "node-image").read_text().strip()


def missing_tools() -> list[str]:
    """What the kind backend lacks here, by name."""
    missing = [] if provider() else ["docker (with a running daemon) or podman"]
    if not kind_binary():
        missing.append("kind (or scripts/build-kind)")
    return missing


def run_logged(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or an AssertionError carrying its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class Sandbox:
    """Where kind's containers meet this machine's limits, what works around each (none on an ordinary host):
    podman's default open-files limit above what the sandbox may grant, no /lib/modules for kind to mount,
    oom_score_adj that cannot be lowered, cgroup v1."""

    lowered_ulimits: bool
    no_modules: bool
    restrict_oom_score_adj: bool
    cgroup_v1: bool

    @classmethod
    def here(cls, engine: str) -> Sandbox:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        return cls(
            lowered_ulimits=engine == "podman" and hard != resource.RLIM_INFINITY and hard < PODMAN_NOFILE,
            no_modules=engine == "podman" and not Path("/lib/modules").is_dir(),
            restrict_oom_score_adj=not can_lower_oom_score_adj(),
            cgroup_v1=not Path("/sys/fs/cgroup/cgroup.controllers").exists(),
        )

    def environment(self, work: Path) -> dict[str, str]:
        """Variables for kind and the engine: a containers.conf with the ulimits this sandbox grants, a podman on
        PATH that mounts an empty directory as /lib/modules."""
        env: dict[str, str] = {}
        if self.lowered_ulimits:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            conf = work / "containers.conf"
            conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={hard}:{hard}", "nproc=32768:32768"]\n'
                            '[engine]\nruntime = "runc"\n')  # fmt: skip
            env["CONTAINERS_CONF"] = str(conf)
        if self.no_modules:
            (work / "modules").mkdir(exist_ok=True)
            wrappers = work / "bin"
            wrappers.mkdir(exist_ok=True)
            wrapper = wrappers / "podman"
            real = shutil.which("podman")
            wrapper.write_text(
                "#!/bin/sh\n# kind mounts /lib/modules, which this host lacks: an empty directory stands in.\n"
                f'for arg; do shift; [ "$arg" = /lib/modules:/lib/modules:ro ] && arg={work}/modules:/lib/modules:ro;'
                f' set -- "$@" "$arg"; done\nexec {real} "$@"\n'
            )
            wrapper.chmod(0o755)
            env["PATH"] = f"{wrappers}:{os.environ['PATH']}"
        return env

    def config_patches(self) -> dict[str, object]:
        """What the kind config adds for this host: containerd's and the kubelet's settings."""
        patches: dict[str, object] = {}
        if self.restrict_oom_score_adj:
            patches["containerdConfigPatches"] = [
                '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true'
            ]
        if self.cgroup_v1:
            patches["kubeadmConfigPatches"] = [
                "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nfailCgroupV1: false"
            ]
        return patches


def can_lower_oom_score_adj() -> bool:
    """Whether a process here may lower its oom_score_adj (a sandbox without CAP_SYS_RESOURCE may not)."""
    probe = subprocess.run(["sh", "-c", "echo -1 > /proc/self/oom_score_adj"], capture_output=True, check=False)
    return probe.returncode == 0


def kind_config(work: Path, *, image: str, sandbox: Sandbox, workers: int = 0) -> Path:
    """e2e/kind-config.yaml with the node image, this host's patches and ``workers`` worker nodes."""
    config = yaml.safe_load((ROOT / "e2e/kind-config.yaml").read_text())
    config["nodes"] = [{"role": "control-plane"}] + [{"role": "worker"} for _ in range(workers)]
    for node in config["nodes"]:
        node["image"] = image
    config.update(sandbox.config_patches())
    path = work / "kind-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class KindRun:
    """README's "Try it on kind", run for the suite: the cluster it creates (a name of its own, this host's
    config), the environment its commands run in (kubectl and helm of the suite, a kubeconfig of its own)."""

    def __init__(self, work: Path, *, workers: int = 0, install_values: Sequence[str] = ()) -> None:
        engine = provider()
        assert engine, "no container engine"
        self.work = work
        self.name = f"dradriver-e2e-{uuid.uuid4().hex[:6]}"
        self.engine = engine
        self.install_values = list(install_values)
        sandbox = Sandbox.here(engine)
        self.config = kind_config(work, image=node_image(), sandbox=sandbox, workers=workers)
        tools = work / "tools"
        tools.mkdir(exist_ok=True)
        for name, path in (("kind", kind_binary()), ("kubectl", kubectl_binary()), ("helm", helm.helm())):
            assert path, name
            (tools / name).symlink_to(shutil.which(path) or path)
        self.env = {**os.environ, "KUBECONFIG": str(work / "kubeconfig"), "KIND_EXPERIMENTAL_PROVIDER": engine}
        extra = sandbox.environment(work)
        self.env.update(extra)
        self.env["PATH"] = f"{tools}:{extra.get('PATH', os.environ['PATH'])}"

    def command(self, line: str) -> str:
        """One README command as the suite runs it: its cluster name, config and image archive (and the chart's
        install with the ``--set`` values a module asked for, as a user adds them)."""
        line = line.replace("--name dradriver", f"--name {self.name}")
        if line.startswith("helm install") and self.install_values:
            line += "".join(f" --set {value}" for value in self.install_values)
        line = line.replace("e2e/kind-config.yaml", str(self.config))
        line = line.replace("dradriver.tar", str(self.work / "dradriver.tar"))
        if self.engine == "docker":
            line = line.replace("podman save --format docker-archive", "docker save")
        return line

    def sh(self, line: str, *, timeout: float = 900) -> str:
        return run_logged(["bash", "-euo", "pipefail", "-c", self.command(line)], timeout=timeout, env=self.env)

    def cluster(self) -> Cluster:
        return Cluster(f"kind-{self.name}", env=self.env)

    def collect_logs(self) -> Path:
        """`kind export logs` of the cluster into the work directory (kept for a failed run)."""
        logs = self.work / "logs"
        subprocess.run(["kind", "export", "logs", str(logs), "--name", self.name], env=self.env, capture_output=True,
                       check=False, timeout=300)  # fmt: skip
        return logs

    def delete(self) -> None:
        subprocess.run(["kind", "delete", "cluster", "--name", self.name], env=self.env, capture_output=True,
                       check=False, timeout=300)  # fmt: skip


def setup_commands() -> list[str]:
    """The quickstart up to the chart's install (what makes the cluster); the rest runs a scenario."""
    commands = quickstart()
    last = max(i for i, command in enumerate(commands) if command.startswith("helm install"))
    return commands[: last + 1]


@contextlib.contextmanager
def kind_cluster(work: Path, *, workers: int = 0, install_values: Sequence[str] = ()) -> Iterator[KindRun]:
    """A cluster from README's quickstart, chart installed and rolled out; its logs kept in ``work`` when the
    set-up or the block fails (the caller exports them for a failed test), deleted afterwards with ``work``
    (unless E2E_KEEP_CLUSTER=1 or there are logs). ``install_values`` are ``--set`` values added to the chart's
    install."""
    missing = missing_tools()
    if missing:
        required.need_tools(missing, "the e2e suite runs on kind", "install Docker or podman (and kind, or run "
                            "scripts/build-kind), or set E2E_BACKEND=local for the local node")  # fmt: skip
    try:
        kind = KindRun(work, workers=workers, install_values=install_values)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    failed = True
    try:
        for line in setup_commands():
            kind.sh(line, timeout=1800)
        yield kind
        failed = False
    finally:
        if failed:
            print(f"kind e2e: logs of cluster {kind.name} in {kind.collect_logs()}")
        if os.environ.get("E2E_KEEP_CLUSTER") != "1":
            kind.delete()
            if not (work / "logs").exists():  # a failed run's logs stay
                shutil.rmtree(work, ignore_errors=True)
