"""Generated YAML documents, claims and selectors through ``explain`` and ``demo``: whatever a user feeds them,
the answer is an exit status (0, 1 or 2) and messages, never a traceback or an internal error, within a bound."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SLICES = str(ROOT / "tests/fixtures/slices/dgx-a100-80gb.yaml")
# Each generated input must be answered within this many seconds (generous for a loaded CI machine).
BOUND_SECONDS = 10.0
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["gpu.dradriver.dev", "a", "All", "ExactCount", "1Gi", "gpu.dradriver.dev/uuid", "true"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes any JSON value: claims that are almost right, as users write them."""
    return st.one_of(good, good, good, json_values)


selectors = st.lists(
    maybe(st.fixed_dictionaries({"cel": maybe(st.fixed_dictionaries({"expression": maybe(st.just("true"))}))})),
    max_size=2,
)
device_requests = st.fixed_dictionaries(
    {"deviceClassName": maybe(st.sampled_from(["gpu.dradriver.dev", "mig.dradriver.dev"]))},
    optional={
        "count": maybe(st.integers(min_value=-1, max_value=3)),
        "allocationMode": maybe(st.sampled_from(["ExactCount", "All"])),
        "selectors": maybe(selectors),
        "adminAccess": maybe(st.booleans()),
        "tolerations": maybe(st.lists(st.fixed_dictionaries({"operator": maybe(st.just("Exists"))}), max_size=2)),
        "capacity": maybe(st.fixed_dictionaries({"requests": maybe(st.just({"memory": "10Gi"}))})),
    },
)
requests = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["a", "b"]))},
    optional={
        "exactly": maybe(device_requests),
        "firstAvailable": maybe(
            st.lists(
                st.fixed_dictionaries({"name": maybe(st.sampled_from(["x", "y"]))}).flatmap(
                    lambda head: device_requests.map(lambda body: {**head, **body})
                ),
                max_size=2,
            )
        ),
    },
)
claim_specs = st.fixed_dictionaries(
    {"devices": maybe(st.fixed_dictionaries({"requests": maybe(st.lists(maybe(requests), max_size=3))}))},
    optional={},
).flatmap(
    lambda spec: st.fixed_dictionaries(
        {
            "constraints": maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {"matchAttribute": maybe(st.just("gpu.dradriver.dev/nvlinkDomain"))},
                        optional={"requests": maybe(st.lists(st.sampled_from(["a", "b", "a/x"]), max_size=2))},
                    ),
                    max_size=2,
                )
            ),
            "config": maybe(
                st.lists(
                    st.fixed_dictionaries(
                        {"opaque": maybe(st.just({"driver": "gpu.dradriver.dev", "parameters": {"a": 1}}))}
                    ),
                    max_size=1,
                )
            ),
        }
    ).map(lambda extra: _merge_devices(spec, extra))
)


def _merge_devices(spec: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec.get("devices"), dict):
        spec["devices"].update(extra)
    return spec


def _template(claim: dict[str, Any]) -> dict[str, Any]:
    if claim.get("kind") == "ResourceClaimTemplate":
        claim["spec"] = {"spec": claim["spec"]}
    return claim


claims = st.fixed_dictionaries(
    {
        "apiVersion": maybe(st.just("resource.k8s.io/v1")),
        "kind": maybe(st.sampled_from(["ResourceClaim", "ResourceClaimTemplate"])),
        "metadata": maybe(st.fixed_dictionaries({"name": maybe(st.just("c"))})),
        "spec": maybe(claim_specs),
    }
).map(_template)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` in-process (fast), returning the exit status and stderr; fails past the time bound."""
    err = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    assert time.monotonic() - started < BOUND_SECONDS, argv
    return code, err.getvalue()


def assert_answered(code: int, err: str, allowed: tuple[int, ...] = (0, 1, 2)) -> None:
    assert code in allowed, err
    assert "Traceback" not in err and "internal error" not in err, err


@FUZZ
@given(text=st.text(max_size=200) | json_values.map(yaml.safe_dump))
def test_any_yaml_text_gets_an_answer_from_explain(tmp_path: Path, text: str) -> None:
    path = tmp_path / "input.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    assert_answered(*run_cli(["explain", str(path), "--slices", SLICES]))


@FUZZ
@given(documents=st.lists(claims, min_size=1, max_size=3))
def test_generated_claims_get_an_answer_from_explain(tmp_path: Path, documents: list[dict[str, Any]]) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    code, err = run_cli(["explain", str(path), "--slices", SLICES, "-o", "json"])
    assert_answered(code, err)


@settings(FUZZ, max_examples=6)
@given(claim=claims)
def test_generated_claims_are_demonstrated_or_refused_by_demo(tmp_path: Path, claim: dict[str, Any]) -> None:
    """``demo`` runs the real prepare path (gRPC, CDI spec) for every claim it accepts."""
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(claim))
    assert_answered(*run_cli(["demo", "--claim", str(path)]))


attribute = st.sampled_from(
    ['device.attributes["gpu.dradriver.dev"].productName', 'device.attributes["gpu.dradriver.dev"].index', "1"]
)
leaf = st.one_of(
    attribute,
    st.sampled_from(['"a"', "1", "2.5", "true", "[1, 2]", '{"k": 1}', 'device.capacity["gpu.dradriver.dev"].memory']),
)
expressions = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["==", "!=", "<", "+", "&&", "||", "in"]), inner).map(" ".join),
        inner.map(lambda e: f"!({e})"),
        inner.map(lambda e: f"({e}).size()"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        inner.map(lambda e: f"[{e}].exists(x, x == {e})"),
    ),
    max_leaves=6,
)


@FUZZ
@given(expression=expressions)
def test_generated_selectors_get_an_answer(expression: str) -> None:
    assert_answered(*run_cli(["explain", "--selector", expression, "--slices", SLICES]))
