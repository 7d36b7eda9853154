"""Hostile opaque configs through the real prepare path: a claim as the API server returns it, with any
``status.allocation.devices.config`` (wrong types, huge numbers, unicode, deep nesting, unknown fields, wrong
apiVersion or kind, class and claim entries in any order, requests that do not exist, other drivers' entries).

Every claim is prepared or refused in a sentence that names the claim; a refused claim leaves the node exactly as
it was (no instance, compute mode, time-slice, MPS daemon, CDI spec or checkpoint record), and a prepared one is
unprepared back to the GPU's original state."""

from __future__ import annotations

import copy
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from dradriver import faults
from dradriver.driver.prepare.checkpoint import CheckpointStore
from dradriver.driver.prepare.mps import MpsControl
from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode, discover
from dradriver.gpu.models import ComputeMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor
from dradriver.sim.fakelib import simulated_gpulib_on
from dradriver.sim.node import SimulatedNode
from dradriver.sim.profiles import load_node_profile
from tests.driver.prepare.config_table import API, BAD, GOOD

DRIVER = "gpu.dradriver.dev"
REF = ClaimRef(namespace="default", name="c", uid="uid-1")
WHOLE = "gpu-0000-43-00-0"  # hgx-h100-80gb's second GPU, prepared whole
PARTITION = "gpu-0000-1b-00-0-mig-1g10gb-0"  # a partition of the first GPU, carved at prepare
STANDIN = [sys.executable, "-m", "dradriver.sim.mps_standin"]
# What describe_exception makes of an exception that is not ours: a crash, as the kubelet would see it.
PYTHON_EXCEPTION = re.compile(r"^[A-Z]\w*(Error|Exception|Interrupt): ")

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["8Gi", "512Mi", "1e400", "9" * 40 + "Ei", "-1Gi", "0", "\uff2d", "\x00", "Default", "MPS"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FIELDS = [
    "apiVersion",
    "kind",
    "sharing",
    "computeMode",
    "strategy",
    "timeSlicing",
    "timeSlicingConfig",
    "interval",
    "mps",
    "mpsConfig",
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "unknownField",
]


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, key)
            yield from _paths(inner, (*prefix, key))


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config with a few fields replaced, added or removed."""
    config = copy.deepcopy(draw(st.sampled_from(GOOD)))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(config))
        if not paths:
            break  # an earlier round removed every field: nothing left to mutate
        path = draw(st.sampled_from(paths))
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "add", "remove"]))
        if how == "replace":
            parent[path[-1]] = draw(json_values)
        elif how == "add":
            parent[draw(st.sampled_from(FIELDS))] = draw(json_values)
        elif path[-1] not in ("apiVersion", "kind") or draw(st.booleans()):
            del parent[path[-1]]
    return config


parameters = st.one_of(
    st.sampled_from(GOOD),
    st.sampled_from([bad for bad, _message in BAD]),
    mutated(),
    mutated(),
    json_values,
    st.builds(
        lambda kind, rest: {"apiVersion": API, "kind": kind, **rest},
        json_values,
        json_values.filter(dict.__instancecheck__),
    ),
)
entries = st.fixed_dictionaries(
    {
        "source": st.sampled_from(["FromClass", "FromClaim"]),
        "opaque": st.fixed_dictionaries(
            {"driver": st.sampled_from([DRIVER, DRIVER, DRIVER, "other.example.com"]), "parameters": parameters}
        ),
    },
    optional={"requests": st.lists(st.sampled_from(["whole", "part", "missing", "whole/sub"]), max_size=2)},
)


def entry(parameters: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"source": "FromClaim", "opaque": {"driver": driver, "parameters": parameters}}


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"strategy": value}
    return value


device_sets = st.sampled_from([[("whole", WHOLE)], [("part", PARTITION)], [("whole", WHOLE), ("part", PARTITION)]])


def api_claim(devices: list[tuple[str, str]], config: list[Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid},
        "spec": {},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}
                        for request, device in devices
                    ],
                    "config": config,
                }
            }
        },
    }


class OneClaim:
    def __init__(self, claim: Any) -> None:
        self.claim = claim

    def get_resource_claim(self, namespace: str, name: str) -> Any:
        return self.claim


@dataclass
class Node:
    """A simulated H100 node in dynamic MIG mode with the MPS stand-in, and the plugin layer's claim path."""

    root: Path
    sim: SimulatedNode
    store: CheckpointStore
    driver: GpuDriver
    mps: MpsControl

    @classmethod
    def start(cls, root: Path) -> Node:
        sim = SimulatedNode(load_node_profile("hgx-h100-80gb"), node_name="node-a")
        sim.set_compute_mode(1, ComputeMode.PROHIBITED)  # not the default, so a restore to Default shows
        gpulib = simulated_gpulib_on(sim)
        store = CheckpointStore.open(root / "state", boot_id="boot-1")
        mps = MpsControl(STANDIN, root / "mps")
        driver = GpuDriver(
            GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.DYNAMIC),
            inventory=discover(gpulib),
            cdi=CdiWriter(root / "cdi"),
            gpulib=gpulib,
            checkpoint=store,
            mps=mps,
        )
        return cls(root, sim, store, driver, mps)

    def hardware(self) -> list[tuple[Any, ...]]:
        """Everything a claim may change on the GPUs it uses."""
        return [
            (
                g.compute_mode,
                g.timeslice,
                sorted(
                    (gi.profile.id, gi.placement.start, len(gi.compute_instances)) for gi in g.gpu_instances.values()
                ),
            )
            for g in self.sim.gpus[:2]
        ]

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / "cdi").glob("*")) + sorted(
            str(p.relative_to(self.root)) for p in (self.root / "mps").glob("*")
        )

    def prepare(self, claim: dict[str, Any]) -> tuple[tuple[Any, ...], str | None]:
        processor = ClaimProcessor(
            driver_name=DRIVER, handler=self.driver, claim_source=OneClaim(claim), locks=ClaimLocks()
        )
        outcome = processor.prepare([REF])[REF.uid]
        return tuple(outcome.devices), outcome.error


def check_one(root: Path, devices: list[tuple[str, str]], config: list[Any]) -> str | None:
    """Prepare the claim on a fresh node and check the properties; the error, if it was refused."""
    node = Node.start(root)
    try:
        before = node.hardware()
        changes: list[str] = []
        faults.observer = changes.append
        try:
            _prepared, error = node.prepare(api_claim(devices, config))
        finally:
            faults.observer = None
        if error is not None:
            assert not PYTHON_EXCEPTION.match(error), error
            assert len(error) < 2000, error[:300]
            assert str(REF) in error or REF.uid in error, error
            assert node.hardware() == before, error
            assert node.files() == [] and node.store.records() == [], error
            # On an empty node only the config can be at fault, and it is refused before the first change:
            # nothing was carved, set or started, not even for a moment.
            assert not [p for p in changes if p.startswith("before:")], (error, changes)
            return error
        record = node.store.get(REF.uid)
        assert record is not None
        assert node.driver.unprepare_resource_claims([REF]) == {REF.uid: None}
        # Back to the GPU's original state: compute mode, time-slice, no instance and no MPS daemon left.
        assert node.hardware() == before
        assert node.files() == [] and node.store.records() == []
        return None
    finally:
        node.store.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(devices=device_sets, config=st.lists(entries, max_size=3))
# Found by this test: a ``sharing: null`` entry merged with a later one crashed the resolution.
@example(
    devices=[("whole", WHOLE)],
    config=[entry({"apiVersion": API, "kind": "GpuConfig", "sharing": None}), entry(GOOD[4])],
)
# A limit with an exponent no GPU has, and an error that would quote a 100 kB value in full.
@example(
    devices=[("whole", WHOLE)],
    config=[
        entry(
            {
                "apiVersion": API,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "1e400"}},
            }
        )
    ],
)
@example(
    devices=[("whole", WHOLE)], config=[entry({"apiVersion": API, "kind": "GpuConfig", "computeMode": "x" * 100_000})]
)
def test_any_opaque_config_prepares_or_is_refused_and_leaves_the_node_as_it_was(
    devices: list[tuple[str, str]], config: list[dict[str, Any]]
) -> None:
    root = Path(tempfile.mkdtemp(prefix="dra-config-"))
    try:
        event("refused" if check_one(root, devices, config) else "prepared")
    finally:
        shutil.rmtree(root, ignore_errors=True)


GOOD_GPU = [c for c in GOOD if c["kind"] == "GpuConfig"]
GOOD_MIG = [c for c in GOOD if c["kind"] == "MigDeviceConfig"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    devices=device_sets,
    whole=st.sampled_from(GOOD_GPU),
    part=st.sampled_from(GOOD_MIG),
    source=st.sampled_from(["FromClass", "FromClaim"]),
    for_all=st.booleans(),
)
def test_a_valid_config_always_prepares_and_unprepares_back_to_the_original_state(
    devices: list[tuple[str, str]], whole: dict[str, Any], part: dict[str, Any], source: str, for_all: bool
) -> None:
    """A valid config for each device (named by its request, or one entry per kind for all requests): the claim
    prepares, and unprepares back to what the GPUs were."""
    percentages = {
        mps.get("defaultActiveThreadPercentage")
        for request, c in (("whole", whole), ("part", part))
        if request in dict(devices)
        # ours spells it mps, NVIDIA's mpsConfig
        for mps in [(c.get("sharing") or {}).get("mps") or (c.get("sharing") or {}).get("mpsConfig") or {}]
    } - {None}
    assume(len(percentages) <= 1)  # one MPS daemon per claim: two percentages are refused (test_state_sharing)
    config = [
        {
            "source": source,
            **({} if for_all else {"requests": [request]}),
            "opaque": {"driver": DRIVER, "parameters": parameters},
        }
        for request, parameters in (("whole", whole), ("part", part))
        if request in dict(devices)
    ]
    root = Path(tempfile.mkdtemp(prefix="dra-config-"))
    try:
        assert check_one(root, devices, config) is None
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_config_nested_deeper_than_repr_goes_is_refused_in_a_short_sentence() -> None:
    deep = {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": _deep(5000)}
    root = Path(tempfile.mkdtemp(prefix="dra-config-"))
    try:
        error = check_one(root, [("part", PARTITION)], [entry(deep)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert error is not None and "sharing.strategy: {'strategy': {" in error and "is not allowed" in error
    assert len(error) < 300
