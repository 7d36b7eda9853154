"""Hostile selectors end in a result or a clear compile/runtime error, in bounded time and memory.

The limits follow the API server's: cel-go's parser stops at 250 levels of nesting; the estimated cost of
a DRA selector may not exceed 1,000,000 (CELSelectorExpressionMaxCost), with string and list growth
counted; evaluation stops when its cost passes the same budget.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from dradriver.cel import CelCompileError, CelEvaluationError, compile_selector

DRIVER = "gpu.dradriver.dev"
X60 = "x" * 60


def outcome(expression: str, device: dict[str, Any]) -> str:
    """ "True"/"False", or the kind of error, for one fresh compile and evaluation."""
    compile_selector.cache_clear()
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return "compile error"
    try:
        return str(selector.matches(device, driver=DRIVER))
    except CelEvaluationError:
        return "runtime error"


HOSTILE = [
    ("!" * 300 + "true", "True"),  # a run of one operator collapses by parity, as in cel-go
    ("!" * 301 + "true", "False"),
    ("-" * 301 + "1 < 0", "True"),
    ("(" * 250 + "true" + ")" * 250, "True"),
    ("(" * 251 + "true" + ")" * 251, "compile error"),
    ("[" * 240 + "1" + "]" * 240 + " != []", "True"),
    ("[" * 300 + "1" + "]" * 300 + " != []", "compile error"),
    ("{1:" * 200 + "1" + "}" * 200 + " != {}", "True"),
    ("int(" * 240 + "1" + ")" * 240 + " == 1", "True"),
    ("int(" * 300 + "1" + ")" * 300 + " == 1", "compile error"),
    ("device.driver" + ".size()" * 1 + " > 0", "True"),
    ('{"a": 1}' + ".a" * 300 + " == 1", "compile error"),  # a member chain deeper than 250
    ("1" + " + 1" * 240 + " > 0", "True"),
    ("1" + "+1" * 3000 + " > 0", "compile error"),
    ("true" + " && true" * 1200, "True"),  # && and || chains are balanced, as in cel-go
    ("false" + " || false" * 1000, "False"),
    ('"ab"' + f'.replace("", "{X60}")' * 6 + ' == ""', "compile error"),  # ~10^11 characters
    ('"ab"' + f'.replace("", "{X60}")' * 2 + ' != ""', "True"),
    (
        'cel.bind(s, "' + "a" * 100 + '", s.split("").join(s).split("").join(s).split("").join(s).size() > 0)',
        "compile error",
    ),
    ('"a".matches("(")', "compile error"),
    ("lists.range(2000000).size() > 0", "runtime error"),  # estimated within budget, refused while running
    ("lists.range(100000000).size() > 0", "compile error"),
    ("lists.range(size(device.driver) * 1000000).size() > 0", "compile error"),
    ("[1,2,3,4,5,6,7,8,9,10].all(a, " * 6 + "true" + ")" * 6, "compile error"),
]


@pytest.mark.parametrize(("expression", "expected"), HOSTILE, ids=[f"{i}:{e[:30]}" for i, (e, _) in enumerate(HOSTILE)])
def test_hostile_selector_ends_in_a_result_or_an_error(gpu: dict[str, Any], expression: str, expected: str) -> None:
    tracemalloc.start()
    # CPU time of this process, not wall time: the bound is on the work an expression can cause, and a loaded
    # machine (xdist workers, other builds) stretches wall time without changing it.
    started = time.process_time()
    try:
        result = outcome(expression, gpu)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result == expected
    assert time.process_time() - started < 5
    assert peak < 64 * 2**20


def run_in_deep_stack(depth: int, work: Callable[[], str]) -> str:
    """``work()`` called ``depth`` frames deep, in a thread, as a caller deep in a CLI or server would."""
    result: list[str] = []

    def nest(n: int) -> str:
        return nest(n - 1) if n else work()

    thread = threading.Thread(target=lambda: result.append(nest(depth)))
    thread.start()
    thread.join(timeout=60)
    assert result, "the thread did not finish"
    return result[0]


def test_deeply_nested_selector_works_under_a_deep_caller(gpu: dict[str, Any]) -> None:
    expression = "int(" * 240 + "1" + ")" * 240 + " == 1"
    depth = min(300, sys.getrecursionlimit() // 3)
    assert run_in_deep_stack(depth, lambda: outcome(expression, gpu)) == "True"


def test_nested_comprehensions_over_large_ranges_are_refused_at_compile_time() -> None:
    # 1,100 x 1,100 iterations: each list is small enough for the estimate of its own size, but the
    # nested comprehension is refused at compile time, as the API server refuses it.
    with pytest.raises(CelCompileError, match="estimated cost"):
        compile_selector("lists.range(1100).all(a, lists.range(1100).all(b, a + b >= 0))")


def test_cost_error_names_the_limit_and_the_remedy() -> None:
    with pytest.raises(CelCompileError) as raised:
        compile_selector('"ab"' + f'.replace("", "{X60}")' * 6 + ' == ""')
    assert "exceeds the limit of 1000000" in str(raised.value)
    assert "strings" in str(raised.value)
