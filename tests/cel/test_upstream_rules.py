"""Rules checked against cel-go, cel-spec and Kubernetes' sources, each case naming where its answer comes from.

- Map keys: CEL's ``bool`` and ``int`` are different types, so ``true`` and ``1`` are different keys (cel-spec
  langdef "Maps": keys are int, uint, bool or string; tests/simple/testdata/fields.textproto ``map_key_mixed_type``
  reads ``{true:1,2:2,5u:3}[true]`` as 1). Only numbers compare across types (``{0: 1, 0u: 2}`` repeats a key:
  fields.textproto ``map_value_repeat_key_heterogeneous``). Kubernetes' HomogeneousAggregateLiterals make such a
  literal a compile error unless its keys go through ``dyn()``.
- ``cond ? a : b``: cel-go's standard declaration is ``_?_:_(bool, A, A) -> A`` (common/stdlib/standard.go); the
  checker binds A to the first branch's type and accepts the second only if one is assignable to the other
  (checker/types.go ``isValidTypeSubstitution``), so ``true ? 1 : "a"`` is "found no matching overload" at
  compile time, while ``true ? 1 : dyn("a")`` and ``true ? null : timestamp(…)`` compile.
- Libraries: DRA selectors are compiled in ``environment.MustBaseEnvSet`` (k8s.io/apiserver/pkg/cel/environment/
  base.go) extended with ``ext.Bindings`` only (k8s.io/dynamic-resource-allocation/cel compile.go). base.go, up to
  the ``ext.Lists(ext.ListsVersion(3))`` it adds at 1.34 and through 1.37, enables neither ``ext.Math``
  (``math.greatest``, ``math.least``) nor ``ext.Encoders`` (``base64.encode``, ``base64.decode``): the API server
  refuses a selector calling them as an undeclared reference.
"""

from __future__ import annotations

import pytest

from dradriver.cel import CelCompileError, compile_selector
from dradriver.cel.selector import compile_expression


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('{dyn(1): "a", dyn(true): "b"}.size()', 2),
        ('{dyn(true): "b", dyn(1): "a"}.size()', 2),
        ('{dyn(1): "a", dyn(true): "b"}[1]', "a"),
        ('{dyn(1): "a", dyn(true): "b"}[true]', "b"),
        ('{dyn(0): "a", dyn(false): "b"}[false]', "b"),
        ('{dyn(1): "a", dyn(true): "b"}[1u]', "a"),  # numbers still match across int, uint and double
        ('{dyn(1): "a", dyn(true): "b"}[1.0]', "a"),
        ('true in {dyn(1): "a"}', False),
        ('1 in {dyn(true): "a"}', False),
        ('{dyn(1): "a", dyn(true): "b"}.all(k, k == 1 || k == true)', True),
        ('{dyn(1): "a", dyn(true): "b"}.exists(k, type(k) == bool)', True),
        ('{dyn(1): "a", dyn(true): "b"}.exists_one(k, type(k) == int)', True),
        ('{dyn(1): "a", dyn(true): "b"}.transformMap(k, v, v + "!")[true]', "b!"),
        ('{dyn(1): "a", dyn(true): "b"}.transformMap(k, v, v + "!").size()', 2),
        ('{dyn(1): "a", dyn(true): "b"} == {dyn(true): "b", dyn(1): "a"}', True),
        ('{dyn(1): "a", dyn(true): "b"} == {dyn(1): "a", dyn(false): "b"}', False),
        ("{true: 5}[true]", 5),  # fields.textproto map_key_bool
        ("[1, 2].transformMapEntry(i, v, i == 0 ? {dyn(true): v} : {dyn(1): v}).size()", 2),
    ],
)
def test_bool_and_int_map_keys_are_distinct(expression, expected):
    assert compile_expression(expression)() == expected


@pytest.mark.parametrize(
    "expression", ["{dyn(true): 1, dyn(false): 2, dyn(true): 3}.size() == 3", "{dyn(0): 1, dyn(0u): 2}.size() == 2"]
)
def test_repeated_keys_are_still_errors(expression):
    from dradriver.cel import CelEvaluationError

    with pytest.raises(CelEvaluationError, match="repeated key"):
        compile_expression(expression)()


@pytest.mark.parametrize(
    "expression",
    ['true ? 1 : "a"', "false ? [1] : ['a']", "device.driver == 'x' ? 1 : 2.0", "true ? null : 1"],
)
def test_conditional_branches_of_unrelated_types_do_not_type_check(expression):
    with pytest.raises(CelCompileError, match=r"found no matching overload for '_\?_:_'"):
        compile_selector(f"({expression}) == dyn(1)")


@pytest.mark.parametrize(
    "expression",
    [
        'true ? 1 : dyn("a")',
        "true ? [1] : []",
        "true ? null : timestamp('2020-01-01T00:00:00Z')",
        "true ? quantity('1') : null",
        "true ? {'a': 1} : {'b': dyn('x')}",
    ],
)
def test_conditional_branches_that_agree_or_involve_dyn_type_check(expression):
    selector = compile_selector(f"({expression}) == dyn(1) || true")  # type-checked here: no CelCompileError
    assert selector.matches({"name": "x", "attributes": {}, "capacity": {}}, driver="d", memoize=False) is True


@pytest.mark.parametrize(
    "call",
    [
        "math.greatest(1, 2) == 2",
        "math.least([1, 2]) == 1",
        'base64.encode(b"a") == "YQ=="',
        'base64.decode("YQ==") == b"a"',
    ],
)
def test_math_and_encoders_extensions_are_not_enabled_for_dra_selectors(call):
    with pytest.raises(CelCompileError) as caught:
        compile_selector(call)
    message = str(caught.value)
    assert "undeclared reference" in message
    assert "not enabled" in message and "part of Kubernetes' CEL but" not in message
