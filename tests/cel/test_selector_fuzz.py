"""Selectors generated from a CEL grammar: every one compiles or is refused with CelCompileError, and
evaluates to a bool or raises CelEvaluationError, quickly; never another exception."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.cel import CelCompileError, CelEvaluationError, compile_selector

DRIVER = "gpu.dradriver.dev"
A = 'device.attributes["gpu.dradriver.dev"]'

ATOMS = st.sampled_from(
    [
        "1",
        "-7",
        "2u",
        "1.5",
        "true",
        "null",
        '"gpu"',
        "b'x'",
        "[]",
        "{}",
        "[1, 2, 3]",
        '{"a": 1}',
        "device.driver",
        f"{A}.type",
        f"{A}.productName",
        f"{A}.missing",
        f"{A}.?missing",
        f'{A}[?"type"]',
        'device.capacity["gpu.dradriver.dev"].memory',
        f"{A}.driverVersion",
        'quantity("1Gi")',
        'semver("1.2.3")',
        "optional.none()",
        'ip("10.0.0.1")',
        'cidr("10.0.0.0/8")',
        'timestamp("2024-01-01T00:00:00Z")',
        'duration("1h30m")',
        'url("https://example.com:80/p?q=1")',
        '"%s-%d-%.2f"',
        "lists.range(3)",
        "x",
    ]
)
UNARY = ["!{}", "-{}", "({})", "[{}]", "[?{}]", "{{{}: 1}}", "size({})", "dyn({})", "optional.of({})", "string({})"]
BINARY = [
    "{} && {}",
    "{} || {}",
    "{} == {}",
    "{} != {}",
    "{} < {}",
    "{} + {}",
    "{} * {}",
    "{} / {}",
    "{} % {}",
    "{} in {}",
    "[{}, {}]",
    "{{{}: {}}}",
    "{}.orValue({})",
    "{}.compareTo({})",
    '{}.replace("", {})',
    "{}.exists(x, {})",
    "{}.all(k, v, {})",
    "{}.map(x, {})",
    "{}.transformList(i, v, {})",
    "cel.bind(x, {}, {})",
    "{} - {}",
    "{}.format([{}])",
    "{}.getHours({})",
    "{}.containsIP({})",
    "{}.sortBy(x, {})",
    "{}.transformMap(k, v, {})",
    "{}.slice(0, {})",
]


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.tuples(st.sampled_from(UNARY), children).map(lambda t: t[0].format(t[1]))
    binary = st.tuples(st.sampled_from(BINARY), children, children).map(lambda t: t[0].format(t[1], t[2]))
    ternary = st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}")
    return unary | binary | ternary


EXPRESSIONS = st.recursive(ATOMS, _combine, max_leaves=40)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(EXPRESSIONS)
def test_generated_selector_ends_in_a_result_or_a_cel_error(gpu: dict[str, Any], expression: str) -> None:
    started = time.monotonic()
    try:
        selector = compile_selector(expression)
        result = selector.matches(gpu, driver=DRIVER)
    except (CelCompileError, CelEvaluationError):
        pass
    else:
        assert type(result) is bool
    assert time.monotonic() - started < 5, expression


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="()[]{}.?!-+*/%<>=&|\"'` a1b,:_\\u\n", max_size=60))
def test_arbitrary_text_compiles_or_is_a_compile_error(expression: str) -> None:
    try:
        compile_selector(expression)
    except CelCompileError as err:
        assert err.line >= 1 and err.column >= 1
