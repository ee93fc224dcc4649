"""validate_expression: everything a user should know about a selector before using it."""
from __future__ import annotations

from .compiler import compile_expression
from .cost import COST_HINT, MAX_SELECTOR_COST, budget_reason
from .errors import CELCompileError


def validate_expression(expression: str, *, consumable_capacity: bool = True,
                        cost_limit: int = MAX_SELECTOR_COST) -> list[dict]:
    """[] when the expression is fine; otherwise issues with severity "error" (it will be
    rejected: it does not compile, or its estimated cost exceeds the budget) or "warning" (it
    compiles but will fail or never match, e.g. an unexpanded `{{ template }}` inside
    quantity())."""
    try:
        compiled = compile_expression(expression, consumable_capacity=consumable_capacity)
    except CELCompileError as exc:
        issues = getattr(exc, "issues", None)
        if issues:
            out = [_issue("error", i.message, i.position, i.hint) for i in issues]
        else:
            out = [_issue("error", exc.reason, exc.position, exc.hint)]
        out += [_issue(w.severity, w.message, w.position, w.hint) for w in getattr(exc, "warnings", [])]
        return out
    out = []
    if compiled.max_cost > cost_limit:
        out.append(_issue("error", budget_reason(compiled.max_cost, cost_limit), None, COST_HINT))
    return out + [_issue(w.severity, w.message, w.position, w.hint) for w in compiled.checked.warnings]


def _issue(severity: str, message: str, position: int | None, hint: str | None) -> dict:
    return {"severity": severity, "message": message, "position": position, "hint": hint}
