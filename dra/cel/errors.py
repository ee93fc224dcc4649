"""Error types of the DRA CEL environment.

Every error carries the expression, a plain-English reason, the character offset where the
problem is (when the parser or evaluator can tell) and an optional hint for the user. The
allocator, the lint endpoint and the API all render these the same way, so the message is
built in one place (`CELError.__str__`).
"""
from __future__ import annotations


class CELError(Exception):
    """Base of all CEL failures; never raised directly."""

    kind = "CEL error"

    def __init__(self, expression: str, reason: str, position: int | None = None, hint: str | None = None):
        self.expression = expression
        self.reason = reason
        self.position = position
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [f"{self.kind}: {self.reason}"]
        if self.position is not None:
            line, column = line_and_column(self.expression, self.position)
            parts.append(f" (at line {line}, column {column})")
        parts.append(f"\n  expression: {_abbreviate(self.expression)}")
        if self.position is not None:
            pointer = _pointer_line(self.expression, self.position)
            if pointer:
                parts.append(f"\n{pointer}")
        if self.hint:
            parts.append(f"\n  hint: {self.hint}")
        return "".join(parts)

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self):
        # Celery and multiprocessing pickle exceptions; keep the structured fields across that.
        return (self.__class__, (self.expression, self.reason, self.position, self.hint))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and (self.expression, self.reason, self.position, self.hint)
            == (other.expression, other.reason, other.position, other.hint)
        )

    __hash__ = Exception.__hash__


class CELCompileError(CELError):
    """The expression is not valid DRA CEL: syntax, unknown names, type errors, limits."""

    kind = "invalid CEL expression"


class CELCostLimitExceeded(CELCompileError):
    """The expression compiles, but its estimated worst-case cost exceeds the budget, so it is
    refused where selectors are stored (upstream: field.Forbidden "too complex, exceeds cost
    limit"). Carries the estimate and the budget."""

    kind = "CEL expression too expensive"
    forbidden = True  # a field.Forbidden, not a field.Invalid, in API error lists

    def __init__(self, expression: str, reason: str, position: int | None = None, hint: str | None = None,
                 estimated_cost: int = 0, cost_limit: int = 0):
        self.estimated_cost = estimated_cost
        self.cost_limit = cost_limit
        super().__init__(expression, reason, position, hint)

    def __reduce__(self):
        return (self.__class__, (self.expression, self.reason, self.position, self.hint, self.estimated_cost,
                                 self.cost_limit))


class CELRuntimeError(CELError):
    """Evaluation against one device failed (missing key, wrong type, non-bool result, budget)."""

    kind = "CEL evaluation failed"


class CELBudgetExceeded(CELRuntimeError):
    """The evaluation used more than its cost or time budget and was stopped."""

    kind = "CEL evaluation stopped"


def line_and_column(text: str, position: int) -> tuple[int, int]:
    """1-based line and column of a 0-based character offset."""
    position = max(0, min(position, len(text)))
    line = text.count("\n", 0, position) + 1
    start = text.rfind("\n", 0, position) + 1
    return line, position - start + 1


def _abbreviate(expression: str, limit: int = 300) -> str:
    flat = " ".join(expression.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _pointer_line(expression: str, position: int) -> str:
    """The offending source line with a caret under the position (short lines only)."""
    start = expression.rfind("\n", 0, position) + 1
    end = expression.find("\n", position)
    line = expression[start : end if end != -1 else len(expression)]
    if len(line) > 200:
        return ""
    column = position - start
    return f"  | {line}\n  | {' ' * column}^"
