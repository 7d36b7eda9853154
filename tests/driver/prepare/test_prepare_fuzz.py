"""The prepare path (kubelet request → claim from the API server → driver) under generated claims: every claim
gets an answer, devices or an error that is a sentence, never a Python exception's repr, and nothing is left
half-written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.nodes import inventory_of

from dradriver.driver.prepare.state import GpuDriver, GpuDriverOptions
from dradriver.gpu.inventory import MigMode
from dradriver.nvidia_install.cdi import CdiWriter
from dradriver.plugin.handler import ClaimRef
from dradriver.plugin.kubeletplugin.claims import ClaimLocks
from dradriver.plugin.kubeletplugin.dra_service import ClaimProcessor

DRIVER = "gpu.dradriver.dev"
REF = ClaimRef(namespace="default", name="c", uid="uid-1")
INVENTORY = inventory_of("mixed")
# What describe_exception makes of an exception that is not ours: a crash, as the kubelet would see it.
PYTHON_EXCEPTION = re.compile(r"^[A-Z]\w*(Error|Exception|Interrupt): ")

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=True))
junk = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, junk)


results = st.fixed_dictionaries(
    {
        "request": maybe(st.sampled_from(["gpu", "gpu/big"])),
        "driver": maybe(st.sampled_from([DRIVER, "other.example.com"])),
        "pool": maybe(st.sampled_from(["node-a", "node-b"])),
        "device": maybe(st.sampled_from(["gpu-0", "gpu-1", "gpu-2", "gpu-9", "gpu-1-mig-1g10gb-0"])),
    },
    optional={"adminAccess": maybe(st.booleans()), "shareID": maybe(st.uuids().map(str))},
)
claims = st.fixed_dictionaries(
    {
        "metadata": maybe(st.fixed_dictionaries({"uid": maybe(st.just("uid-1")), "name": st.just("c")})),
        "status": maybe(
            st.fixed_dictionaries(
                {
                    "allocation": maybe(
                        st.fixed_dictionaries(
                            {
                                "devices": maybe(
                                    st.fixed_dictionaries({"results": maybe(st.lists(maybe(results), max_size=3))})
                                )
                            }
                        )
                    )
                }
            )
        ),
    }
)


class OneClaim:
    def __init__(self, claim: Any) -> None:
        self.claim = claim

    def get_resource_claim(self, namespace: str, name: str) -> Any:
        return self.claim


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claim=claims)
def test_generated_claims_are_prepared_or_refused_in_a_sentence(tmp_path: Path, claim: dict[str, Any]) -> None:
    cdi = CdiWriter(tmp_path / "cdi")
    driver = GpuDriver(
        GpuDriverOptions(driver_name=DRIVER, pool="node-a", mig_mode=MigMode.STATIC), inventory=INVENTORY, cdi=cdi
    )
    processor = ClaimProcessor(driver_name=DRIVER, handler=driver, claim_source=OneClaim(claim), locks=ClaimLocks())
    outcome = processor.prepare([REF])[REF.uid]
    if outcome.error is not None:
        assert not PYTHON_EXCEPTION.match(outcome.error), outcome.error
        assert not cdi.spec_path(REF.uid).exists()
    else:
        assert outcome.devices and cdi.spec_path(REF.uid).exists()
    assert driver.unprepare_resource_claims([REF]) == {REF.uid: None}
