"""CEL errors: compile errors (the expression is wrong) and evaluation errors (it fails for a device)."""

from __future__ import annotations

from dradriver.errors import ConfigError, DradriverError


class CelError(DradriverError):
    """Base class of every CEL error."""


class CelCompileError(CelError, ConfigError):
    """The expression does not parse, uses an unknown name or function, or cannot yield a bool.

    ``line`` and ``column`` are 1-based positions in the expression; ``hint`` says how to fix it.
    """

    def __init__(
        self, message: str, *, expression: str, line: int = 1, column: int = 1, hint: str | None = None
    ) -> None:
        self.message = message
        self.expression = expression
        self.line = line
        self.column = column
        self.hint = hint
        text = f"line {line}, column {column}: {message}"
        if hint:
            text += f" (hint: {hint})"
        super().__init__(text)


class CelEvaluationError(CelError):
    """The expression failed at run time for one device (a missing attribute, an overflow, a bad value).

    ``missing_attribute`` is the fully qualified attribute (or capacity) name whose absence caused the
    error, when that was the cause; the selector should guard it with ``in`` or ``has()``.
    """

    def __init__(
        self,
        message: str,
        *,
        missing_attribute: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.message = message
        self.missing_attribute = missing_attribute
        self.line = line
        self.column = column
        super().__init__(message)
