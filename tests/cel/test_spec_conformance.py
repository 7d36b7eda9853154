"""cel-spec's ``simple`` conformance cases (tests/cel/spec_cases.py), run in the device-selector environment.

Kubernetes' environment differs from the one cel-spec assumes in known ways; each difference is a rule
below, stated by the upstream option that causes it, and the case is checked against that rule instead:

* cel-spec evaluates "unchecked" cases without the type checker; the API server always type-checks, so
  such a case either gives cel-spec's value or is a compile error.
* Kubernetes turns on cel-go's HomogeneousAggregateLiterals: a list or map literal that mixes types is a
  compile error there (HOMOGENEOUS names those cases).
* Quoted field names (``m.`a-b```) need cel-go's opt-in parser.EnableIdentEscapeSyntax, which Kubernetes
  does not set: a syntax error there.

Cases this evaluator cannot run are skipped with the reason (``skip_reason``); docs/explain.md lists them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spec_cases import CASES, ERROR, M, T, U

from dradriver.cel import CelCompileError, CelEvaluationError
from dradriver.cel.selector import compile_expression
from dradriver.cel.values import CelType, Uint

HOMOGENEOUS = {
    "not_eq_list_null",
    "eq_list_mixed_type_numbers",
    "not_eq_list_mixed_type_numbers",
    "not_eq_list_false_vs_types",
    "not_eq_map_null",
    "eq_map_mixed_type_numbers",
    "not_eq_map_false_vs_types",
    "eq_map_value_mixed_types",
    "not_eq_list_elem_null",
    "not_eq_map_value_null",
    "elem_in_mixed_type_list",
    "elem_in_mixed_type_list_cross_type",
    "key_in_mixed_key_type_map",
    "key_in_mixed_key_type_map_cross_type",
    "dyn_heterogeneous_list",
    "list_elem_type_shortcircuit",
    "list_elem_type_exhaustive",
    "map_key_type_shortcircuit",
    "map_key_type_exhaustive",
    "list_elem_type_error_exhaustive",
    "optional_chaining_13",
    "map_key_mixed_type_optindex_value",
    "map_key_mixed_numbers_double_key_optindex_value",
    "map_key_mixed_numbers_uint_key_optindex_value",
    "map_key_mixed_numbers_int_key_optindex_value",
    "map_key_int64",
    "map_key_uint64",
    "map_key_mixed_type",
    "map_key_mixed_numbers_double_key",
    "map_key_mixed_numbers_lossy_double_key",
    "map_key_mixed_numbers_uint_key",
    "map_key_mixed_numbers_int_key",
    "map_value_mix_type",
    "map_value_repeat_key_heterogeneous",
    "mixed_numbers_and_keys_present",
    "mixed_numbers_and_keys_absent",
}
# cel-spec's format() cases follow the strings extension's version-4 formatter; Kubernetes enables
# version 2, whose formatter accepts fewer types for %d/%f/%e, spells infinity +Inf and prints lists and
# maps differently (cel-go ext/formatting.go). These cases are not run.
FORMAT_V4 = {
    "default precision for fixed-point clause with int",
    "default precision for fixed-point clause with uint",
    "default precision for scientific notation with int",
    "default precision for scientific notation with uint",
    "positive infinity support for scientific notation",
    "negative infinity support for scientific notation",
    "NaN support for decimal",
    "positive infinity support for decimal",
    "negative infinity support for decimal",
    "positive infinity support for fixed-point",
    "negative infinity support for fixed-point",
    "map support (all key types)",
    "dyntype NaN/infinity support",
    "dyntype support for lists",
    "list support for string",
    "map support for string",
    "dyntype support for maps",
}
# Kubernetes validates constant timestamp()/duration() arguments when it compiles
# (cel.ValidateTimestampLiterals / ValidateDurationLiterals): where cel-spec expects an evaluation error
# from such a constant, the API server gives a compile error.
TIME_LITERALS = {
    ("timestamp_range", "from_string_under"),
    ("timestamp_range", "from_string_over"),
    ("duration_range", "from_string_under"),
    ("duration_range", "from_string_over"),
    ("duration_range", "add_under"),
    ("duration_range", "add_over"),
    ("duration_range", "sub_under"),
    ("duration_range", "sub_over"),
}
_MESSAGE = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*\{|google\.protobuf|TestAllTypes|NestedTestAllTypes")
_QUOTED_FIELD = re.compile(r"\.\s*`")


def skip_reason(expression: str, notes: tuple[str, ...], name: str = "") -> str | None:
    """Why a case cannot run here, or None."""
    if name in FORMAT_V4:
        return "format() case for the strings extension's version 4; Kubernetes runs version 2's formatter"
    if "container" in notes or any(n.startswith("value:object_value") for n in notes) or _MESSAGE.search(expression):
        return "protobuf messages and wrapper types: not part of the device-selector environment"
    if any(n.startswith("value:") for n in notes) or "check_only" in notes:
        return "a type-deduction (check-only) case, or an expected value outside this test's model"
    if "variables" in notes:
        return "declares variables; the device-selector environment has only `device`"
    return None


def same(got: Any, want: Any) -> bool:
    """Equality by CEL type: 1 and 1u and 1.0 differ; NaN equals NaN; -0.0 differs from 0.0."""
    if isinstance(want, U):
        return type(got) is Uint and int(got) == int(want)
    if isinstance(want, T):
        return type(got) is CelType and got.name == str(want)
    if isinstance(want, M):
        return (
            isinstance(got, dict)
            and len(got) == len(want)
            and all(sum(1 for k, v in got.items() if same(k, wk) and same(v, wv)) == 1 for wk, wv in want)
        )
    if isinstance(want, list):
        return type(got) is list and len(got) == len(want) and all(same(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(want, float):
        if type(got) is not float:
            return False
        if math.isnan(want):
            return math.isnan(got)
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    if want is None:
        return got is None
    return type(got) is type(want) and got == want


def outcome(expression: str) -> tuple[str, Any]:
    try:
        program = compile_expression(expression)
    except CelCompileError as err:
        return "compile", err.message
    try:
        return "value", program()
    except CelEvaluationError as err:
        return "error", err.message


def judge(case: tuple[str, str, str, str, Any, tuple[str, ...]]) -> str | None:
    """None when the case passes, else what went wrong."""
    file, section, name, expression, want, notes = case
    kind, got = outcome(expression)
    # string reverse() is the strings extension's version 3; Kubernetes enables version 2
    strings_v3 = file == "string_ext" and section == "reverse"
    literal_check = (section, name) in TIME_LITERALS
    if name in HOMOGENEOUS or _QUOTED_FIELD.search(expression) or strings_v3 or literal_check:
        return None if kind == "compile" else f"want a compile error (Kubernetes' options), got {kind} {got!r}"
    if kind == "compile" and "unchecked" in notes:
        return None  # the API server type-checks what cel-spec evaluates unchecked
    if want == ERROR:
        return None if kind == "error" else f"want an evaluation error, got {kind} {got!r}"
    if kind != "value":
        return f"want {want!r}, got {kind}: {got}"
    return None if same(got, want) else f"want {want!r}, got {got!r}"


RUNNABLE = [case for case in CASES if skip_reason(case[3], case[5], case[2]) is None]


@pytest.mark.parametrize("case", RUNNABLE, ids=[f"{c[0]}/{c[1]}/{c[2]}" for c in RUNNABLE])
def test_cel_spec_case(case: tuple[str, str, str, str, Any, tuple[str, ...]]) -> None:
    problem = judge(case)
    assert problem is None, f"{case[0]}/{case[1]}/{case[2]}: {case[3]}: {problem}"


def test_skipped_cases_are_accounted_for() -> None:
    reasons = Counter(skip_reason(c[3], c[5], c[2]) for c in CASES)
    del reasons[None]
    # every skip has one of the documented reasons (docs/explain.md, "Conformance")
    assert set(reasons) <= {
        "protobuf messages and wrapper types: not part of the device-selector environment",
        "a type-deduction (check-only) case, or an expected value outside this test's model",
        "declares variables; the device-selector environment has only `device`",
        "format() case for the strings extension's version 4; Kubernetes runs version 2's formatter",
    }
    assert len(RUNNABLE) >= 1000


def test_the_counts_quoted_in_the_docs_are_this_suites() -> None:
    """docs/explain.md ("Conformance") quotes how many cases there are, how many run and why the others do not:
    checked here, so that the page stays true as cases are added."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text()
    section = text.split("### Conformance", 1)[1].split("\n#", 1)[0]
    reasons = Counter(skip_reason(c[3], c[5], c[2]) for c in CASES)
    run = reasons.pop(None)
    assert f"holds {len(CASES):,} cases" in section
    assert f"**{run:,} run and all pass (100%)**" in section
    assert f"{sum(reasons.values()):,} are not run" in section
    table = [int(n.replace(",", "")) for n in re.findall(r"^\|[^|]+\|\s*([\d,]+)\s*\|", section, re.M)]
    assert sorted(table) == sorted(reasons.values())
