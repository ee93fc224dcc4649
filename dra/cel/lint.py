"""validate_expression: everything a user should know about a selector before using it."""
from __future__ import annotations

from .compiler import compile_expression
from .errors import CELCompileError


def validate_expression(expression: str, *, consumable_capacity: bool = True) -> list[dict]:
    """[] when the expression is fine; otherwise issues with severity "error" (it will be
    rejected) or "warning" (it compiles but will fail or never match, e.g. an unexpanded
    `{{ template }}` inside quantity())."""
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
    return [_issue(w.severity, w.message, w.position, w.hint) for w in compiled.checked.warnings]


def _issue(severity: str, message: str, position: int | None, hint: str | None) -> dict:
    return {"severity": severity, "message": message, "position": position, "hint": hint}
