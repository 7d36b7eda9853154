"""Evaluate ValidatingAdmissionPolicy expressions with our CEL interpreter.

Our CEL package declares only the DRA selector environment (``device``); an admission policy sees ``request``,
``object``, ``oldObject`` (and more). This helper compiles an expression against those variables typed ``dyn``
with the package's own parser, checker and compiler, so the policy's CEL is checked and run by the same
evaluator as our selectors. It evaluates boolean expressions only (the checker insists on bool or dyn).
"""

from __future__ import annotations

import functools
from typing import Any

from dradriver.cel.checker import Checker
from dradriver.cel.interpreter import STEPS, Compiler
from dradriver.cel.parser import parse

ADMISSION_VARIABLES = ("request", "object", "oldObject", "params", "namespaceObject", "authorizer", "variables")


@functools.cache
def _compiled(expression: str) -> Any:
    """Parsed, checked and compiled once per expression: a policy's expressions run over many requests."""
    tree = parse(expression)
    checked = Checker(expression, dict.fromkeys(ADMISSION_VARIABLES, "dyn")).check(tree)
    return Compiler(checked).compile(tree)


def evaluate(expression: str, **activation: Any) -> Any:
    """The value of ``expression`` with ``activation`` bound (unbound admission variables are null)."""
    program = _compiled(expression)
    variables: dict[str, Any] = dict.fromkeys(ADMISSION_VARIABLES)
    variables.update(activation)
    variables[STEPS] = [0]
    return program(variables)


def evaluate_variable(expression: str, **activation: Any) -> Any:
    """The value of a policy variable's ``expression`` (of any type: wrapped in ``dyn()`` for the checker)."""
    return evaluate(f"dyn({expression})", **activation)
