"""compile_expression / CompiledExpression: parse once, check once, evaluate many times."""
from __future__ import annotations

import functools
import threading
from typing import Any

import lark
import lark.exceptions
from celpy import celtypes
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import Activation, CELEvalError, Evaluator, base_functions

from . import analysis, estimator, library, library_ext
from .cost import COST_HINT, MAX_SELECTOR_COST, UPSTREAM_MAX_SELECTOR_COST, budget_reason
from .device import CELDevice, DeviceView
from .errors import CELBudgetExceeded, CELCompileError, CELCostLimitExceeded, CELRuntimeError
from .evaluator import DEFAULT_COST_LIMIT, DEFAULT_TIME_LIMIT_S, Budget, BudgetExceeded, DRAEvaluator
from .hints import runtime_hint
from .meter import CostMeter

# Upstream limits a selector's length by the size of the API object; 10 KiB is ours.
MAX_EXPRESSION_LENGTH = 10 * 1024
# Nesting levels (calls, brackets, parentheses, binary operators other than && and ||). The
# checker and the tree-walking evaluator recurse about four Python frames per level; measured
# under Python's default recursion limit of 1000, evaluation stays safe to ~240 levels, so 64
# leaves room for the caller's own stack and is still far deeper than any real selector.
MAX_NESTING_DEPTH = 64

FUNCTIONS: dict[str, Any] = {
    name: getattr(library, name)
    for name in (
        "quantity", "isQuantity", "sign", "isInteger", "asInteger", "asApproximateFloat", "add", "sub",
        "isGreaterThan", "isLessThan", "compareTo", "semver", "isSemver", "major", "minor", "patch",
        "matches", "find", "findAll",
    )
}
FUNCTIONS.update(
    {
        name: getattr(library_ext, name)
        for name in (
            "charAt", "indexOf", "lastIndexOf", "lowerAscii", "upperAscii", "replace", "split", "substring",
            "trim", "join", "isSorted", "sum", "min", "max",
        )
    }
)
FUNCTIONS.update(
    {
        "sets_contains": library_ext.sets_contains,
        "sets_equivalent": library_ext.sets_equivalent,
        "sets_intersects": library_ext.sets_intersects,
        "strings_quote": library_ext.strings_quote,
    }
)

# cel-python's standard functions (size, contains, int(), ...) with ours taking precedence.
_ALL_FUNCTIONS: dict[str, Any] = {**base_functions, **FUNCTIONS}

_parser_lock = threading.Lock()
_parser: CELParser | None = None


def _parse(expression: str) -> lark.Tree:
    global _parser
    # Lark parsers are not documented as thread-safe; parsing is rare (results are cached).
    with _parser_lock:
        if _parser is None:
            _parser = CELParser()
        return _parser.parse(expression)


def _offset(expression: str, line: int | None, column: int | None) -> int | None:
    if not line or not column:
        return None
    lines = expression.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + column - 1


def _activation(view: DeviceView) -> dict:
    """The variables for one device content; built once, shared by all expressions."""
    activation = view.activation
    if activation is None:
        activation = {"device": view.value}
        view.activation = activation
    return activation


def _prepare(tree: lark.Tree, nodes: list[lark.Tree]) -> dict:
    """Normalise the parse tree for fast evaluation and decode every literal once.

    Rule names become plain str (lark's Token compares in Python code, and the evaluator
    checks rule names on every step); literal values are keyed by node identity.
    """
    literals: dict[int, Any] = {}
    probe = Evaluator(tree, Activation())
    for node in nodes:  # children before parents (``analysis.subtrees``): nested constant lists fold too
        node.data = str(node.data)
        if node.data == "literal":
            literals[id(node)] = _literal(probe, node)
        elif node.data == "list_lit" and node.children and node.children[0] is not None:
            items = [analysis.unwrap(c) for c in node.children[0].children]
            if all(id(i) in literals for i in items):
                # A list of constants is the same value on every evaluation: build it once.
                literals[id(node)] = celtypes.ListType([literals[id(i)] for i in items])
    return literals


def _literal(probe: Evaluator, node: lark.Tree) -> Any:
    """The literal's value as cel-python's evaluator makes it; string literals through the cached decoder."""
    token = node.children[0] if len(node.children) == 1 else None
    if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
        try:
            return analysis.decode_string(token)
        except ValueError:
            pass  # the evaluator words the error
    return probe.literal(node)


class CompiledExpression:
    """A checked DRA selector. Immutable and safe to share between threads."""

    def __init__(self, expression: str, tree: lark.Tree, consumable_capacity: bool, checked: Any):
        self.expression = expression
        self.consumable_capacity = consumable_capacity
        self._tree = tree
        nodes = analysis.subtrees(tree)  # one walk for both passes below
        self._literals = _prepare(tree, nodes)
        self.drivers: frozenset[str] | None = analysis.drivers(tree)
        self.footprint: analysis.Footprint | None = analysis.footprint(tree, nodes)
        # Worst-case cost in cel-go units (estimator.py): ours, which bounds what an evaluation
        # is charged, and Kubernetes' own number. Creation refuses more than MAX_SELECTOR_COST
        # (compile_selector); compiling never does: upstream's table compiles its "expensive"
        # case and expects it to fail at run time.
        self.max_cost: int = estimator.estimate(tree, checked.types, self._literals)
        self.upstream_max_cost: int = estimator.estimate(tree, checked.types, self._literals, upstream=True)
        checked.types = {}
        self.checked = checked

    def __repr__(self) -> str:
        return f"CompiledExpression({self.expression!r})"

    def evaluate(self, device: CELDevice, *, cost_limit: int = DEFAULT_COST_LIMIT,
                 time_limit: float = DEFAULT_TIME_LIMIT_S, meter: CostMeter | None = None) -> bool:
        """True if the device matches; raises CELRuntimeError (or CELBudgetExceeded), or
        CostBudgetExhausted when `meter` (shared by many evaluations) runs out first."""
        return self.evaluate_view(device.view(), cost_limit=cost_limit, time_limit=time_limit, meter=meter)

    def evaluate_view(self, view: DeviceView, *, cost_limit: int = DEFAULT_COST_LIMIT,
                      time_limit: float = DEFAULT_TIME_LIMIT_S, meter: CostMeter | None = None) -> bool:
        if view.error is not None:
            raise CELRuntimeError(self.expression, view.error)
        own = (cost_limit, time_limit)
        if meter is not None:
            cost_limit, time_limit, _ = meter.clamp(cost_limit, time_limit)
        budget = Budget(cost_limit, time_limit)
        evaluator = DRAEvaluator(self._tree, _activation(view), _ALL_FUNCTIONS, self._literals, budget)
        try:
            value = evaluator.visit(self._tree)
        except BudgetExceeded as exc:
            if meter is not None:
                meter.record(budget.used)
                # The meter's limit, not this evaluation's own, is what stopped it.
                if (exc.kind == "cost" and cost_limit < own[0]) or (exc.kind == "time" and time_limit < own[1]):
                    raise meter.error() from None
            raise CELBudgetExceeded(self.expression, exc.reason, _tree_offset(exc.tree),
                                    "simplify the expression: nested comprehensions multiply their cost") from None
        except RecursionError:
            raise CELBudgetExceeded(self.expression, "expression nests too deeply to evaluate") from None
        if meter is not None:
            meter.record(budget.used)
        return self._result(value)

    def _result(self, value) -> bool:
        if isinstance(value, CELEvalError):
            raise _runtime_error(self.expression, value) from None
        if not isinstance(value, celtypes.BoolType):
            raise CELRuntimeError(
                self.expression,
                f"CEL result of type {library.type_name(value)} could not be converted to bool",
                hint="a selector must evaluate to true or false",
            )
        return bool(value)


def _tree_offset(tree: lark.Tree | None) -> int | None:
    if tree is None:
        return None
    meta = getattr(tree, "meta", None)
    return getattr(meta, "start_pos", None) if meta is not None and not meta.empty else None


def _runtime_error(expression: str, error: CELEvalError) -> CELRuntimeError:
    reason = str(error.args[0]) if error.args else "evaluation failed"
    position = getattr(error, "dra_position", None)
    if position is None:
        position = _tree_offset(error.tree)
    if position is None:
        position = _offset(expression, error.line, error.column)
    hint = runtime_hint(getattr(error, "dra_hint", None))
    if hint is None and reason.startswith("no such key:"):
        # Upstream's EnhanceRuntimeError advice, adapted: cel-python has no optional syntax.
        hint = "guard optional attributes with has(...) before reading them"
    return CELRuntimeError(expression, reason, position, hint)


# A compiled selector holds its parse tree and program: about 40 KB. A worker meets an endless stream of
# distinct selectors (commit ids in CI), so this LRU bounds that memory (~80 MB); a miss costs ~0.6 ms.
COMPILED_CACHE_SIZE = 2048


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def compile_expression(expression: str, *, consumable_capacity: bool = True) -> CompiledExpression:
    """Parse and check a selector; cached by (text, flag). Raises CELCompileError."""
    from .checker import check  # the checker imports the function table defined here

    if not isinstance(expression, str):
        raise CELCompileError(str(expression), "expression must be a string")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            expression[:200],
            f"expression is {len(expression)} characters long, more than the limit of {MAX_EXPRESSION_LENGTH}",
        )
    if not expression.strip():
        raise CELCompileError(expression, "Syntax error: expression is empty", 0)
    try:
        tree = _parse(expression)
    except CELParseError as exc:
        position = _offset(expression, getattr(exc, "line", None), getattr(exc, "column", None))
        reason, hint = _syntax_reason(expression, position, exc.__context__)
        if reason == "unexpected end of expression":
            position = len(expression.rstrip())
        raise CELCompileError(expression, f"Syntax error: {reason}", position, hint) from None
    depth = analysis.nesting_depth(tree)
    if depth > MAX_NESTING_DEPTH:
        raise CELCompileError(
            expression, f"expression nests {depth} levels deep, more than the limit of {MAX_NESTING_DEPTH}",
            hint="split deeply nested conditions or use cel.bind to name intermediate values",
        )
    try:
        checked = check(expression, tree, consumable_capacity=consumable_capacity)
    except RecursionError:
        # Only reachable if the caller is already deep in its own stack.
        raise CELCompileError(expression, "expression nests too deeply to check") from None
    return CompiledExpression(expression, tree, consumable_capacity, checked)


def _syntax_reason(expression: str, position: int | None, cause: BaseException | None) -> tuple[str, str | None]:
    """cel-python's error carries only the position; the lark error it wraps (its implicit
    context) tells whether the input ended early. Say what is wrong and, for the usual
    suspects, what to write instead."""
    token = getattr(cause, "token", None)
    if (isinstance(cause, lark.exceptions.UnexpectedToken) and getattr(token, "type", None) == "$END") or \
            position is None or position >= len(expression.rstrip()):
        return "unexpected end of expression", "an operand, a closing bracket or a closing quote is missing"
    char = expression[position]
    before = expression[:position].rstrip()
    if char == "?" and before.endswith(".") or expression[position:].startswith("?."):
        return "unexpected '?'", "optional field selection (.?field, ?.) is not supported; guard with has(...) instead"
    if char in "\"'":
        return "unterminated string literal", None
    if char == "=" and before.endswith("="):
        return "unexpected '='", "equality is written =="
    if char == "=" and not before.endswith(("!", "<", ">", "=")):
        return "unexpected '='", "equality is written =="
    return f"unexpected {char!r}", None


def compile_selector(expression: str, *, consumable_capacity: bool = True, cost_limit: int | None = None,
                     upstream: bool = False) -> CompiledExpression:
    """What storing a selector (in a claim or a DeviceClass) requires: it compiles, and its
    estimated worst-case cost is within the budget (upstream's validateCELSelector). Raises
    CELCompileError, or its subclass CELCostLimitExceeded with the estimate and the budget.

    By default this service's estimate and budget (MAX_SELECTOR_COST). With `upstream`, exactly
    the API server's test (its estimate against UPSTREAM_MAX_SELECTOR_COST): for objects a
    cluster pushes, which its API server has already accepted and we must not refuse."""
    compiled = compile_expression(expression, consumable_capacity=consumable_capacity)
    estimate = compiled.upstream_max_cost if upstream else compiled.max_cost
    if cost_limit is None:
        cost_limit = UPSTREAM_MAX_SELECTOR_COST if upstream else MAX_SELECTOR_COST
    if estimate > cost_limit:
        raise CELCostLimitExceeded(expression, budget_reason(estimate, cost_limit), hint=COST_HINT,
                                   estimated_cost=estimate, cost_limit=cost_limit)
    return compiled


def check_selector_cost(expression: str, *, consumable_capacity: bool = True) -> None:
    """Only the cost part of compile_selector: for callers whose compile errors are reported
    elsewhere (simulate leaves them to the engine, which words them as the scheduler does)."""
    try:
        compile_selector(expression, consumable_capacity=consumable_capacity)
    except CELCostLimitExceeded:
        raise
    except CELCompileError:
        return
