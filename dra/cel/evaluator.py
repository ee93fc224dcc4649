"""cel-python's tree-walking Evaluator, extended for the DRA environment.

What is added on top of `celpy.evaluation.Evaluator`:
- a per-evaluation budget in cel-go's cost units (cost.py: reading a variable or field 1, a call
  1 or by the length it traverses, a list 10, each comprehension step what cel-go's expansion of
  the macro costs), charged before the work, so a runaway expression stops with
  CELBudgetExceeded after the same amount of work on every run; the wall clock, checked every
  few hundred units, is only a backstop;
- `cel.bind`, the namespaced `sets.*` / `strings.quote` functions, the two-variable
  comprehensions, and comprehensions that short-circuit like cel-go (`all` stops at the
  first false, `exists` at the first true);
- `&&`/`||` that short-circuit and are evaluated iteratively, so a long chain of conditions
  cannot exhaust the Python stack;
- upstream's error texts ("no such key: x") with the data a hint needs (which domains exist).
"""
from __future__ import annotations

import time
from typing import Any

import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator

from . import cost, operators
from .comprehensions import ComprehensionMixin
from .device import DomainMap, DomainsMap, MissingDomain
from .library import no_overload, type_name

# The run-time limit of one evaluation: the same number as the creation-time limit on the
# estimate (cost.py says why it is a tenth of upstream's), so a selector that was accepted is
# never stopped when the device keeps to the declared sizes.
DEFAULT_COST_LIMIT = cost.MAX_SELECTOR_COST
# A backstop only: the count stops an evaluation after 0.2-0.5 s of work (every node visited is
# charged, constants included), at the same point on every run. Real selectors take well under
# a millisecond.
DEFAULT_TIME_LIMIT_S = 5.0
_CLOCK_CHECK_EVERY = 256

# Type identifiers, for `type(x) == int`.
_TYPE_NAMES = {
    "int": celtypes.IntType, "uint": celtypes.UintType, "double": celtypes.DoubleType,
    "bool": celtypes.BoolType, "string": celtypes.StringType, "bytes": celtypes.BytesType,
    "list": celtypes.ListType, "map": celtypes.MapType, "null_type": type(None), "type": celtypes.TypeType,
}
_SYMBOLS = {"_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">=", "_==_": "==", "_!=_": "!=", "_in_": "in",
            "_+_": "+", "_-_": "-", "_*_": "*", "_/_": "/", "_%_": "%"}
_PASS_THROUGH = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member", "primary"}
)
_MACROS_ONE_VAR = {"all", "exists", "exists_one", "existsOne", "map", "filter"}
_MACROS_TWO_VAR = {"all", "exists", "existsOne", "exists_one", "transformList", "transformMap"}
_NAMESPACED = {
    ("sets", "contains"): "sets.contains",
    ("sets", "equivalent"): "sets.equivalent",
    ("sets", "intersects"): "sets.intersects",
    ("strings", "quote"): "strings.quote",
}


class BudgetExceeded(Exception):
    """Raised (never returned) so that `false && <runaway>` cannot swallow it."""

    def __init__(self, reason: str, tree: lark.Tree | None, kind: str = "cost"):
        super().__init__(reason)
        self.reason = reason
        self.tree = tree
        self.kind = kind  # "cost" (the count, deterministic) or "time" (the wall-clock backstop)


class Budget:
    __slots__ = ("used", "limit", "deadline", "time_limit", "next_clock_check")

    def __init__(self, limit: int = DEFAULT_COST_LIMIT, time_limit: float = DEFAULT_TIME_LIMIT_S):
        self.used = 0
        self.limit = limit
        self.time_limit = time_limit
        self.deadline = time.perf_counter() + time_limit
        self.next_clock_check = _CLOCK_CHECK_EVERY

    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def charge(self, units: int, tree: lark.Tree | None) -> None:
        self.used += units
        if self.used > self.limit:
            raise BudgetExceeded(
                f"operation cancelled: actual cost limit exceeded (more than {self.limit} cost units)", tree
            )
        if self.used >= self.next_clock_check:
            self.next_clock_check = self.used + _CLOCK_CHECK_EVERY
            if time.perf_counter() > self.deadline:
                raise BudgetExceeded(
                    "operation cancelled: actual cost limit exceeded "
                    f"(evaluation ran longer than {self.time_limit:g} s after {self.used} cost units)",
                    tree, "time",
                )


def error_at(message: str, tree: lark.Tree | None, hint: dict | None = None,
             position: int | None = None) -> CELEvalError:
    """A CEL error value; `position` (a character offset) is more precise than the tree's
    start, e.g. the operator of a comparison or the name in a field selection."""
    e = CELEvalError(message, ValueError, None, tree=tree)
    # Our extra fields on cel-python's error value (compiler.py reads them back with getattr).
    if hint:
        e.dra_hint = hint  # type: ignore[attr-defined]
    if position is not None:
        e.dra_position = position  # type: ignore[attr-defined]
    return e


def operator_position(op_tree: lark.Tree, symbol: str) -> int | None:
    """Offset of the operator of a binary node (its rule spans `left <op>`)."""
    meta = op_tree.meta
    return None if meta.empty else meta.end_pos - len(symbol)


def token_position(token) -> int | None:
    return getattr(token, "start_pos", None)


def _is_literal(tree: Any) -> bool:
    while isinstance(tree, lark.Tree) and tree.data in _PASS_THROUGH and len(tree.children) == 1:
        tree = tree.children[0]
    return isinstance(tree, lark.Tree) and tree.data == "literal"


def _tree_ident(tree: Any) -> str | None:
    """The identifier if `tree` (a member/primary chain) is just a bare identifier."""
    while isinstance(tree, lark.Tree) and len(tree.children) == 1 and tree.data in (
        "member", "primary", "expr", "conditionalor", "conditionaland", "relation",
        "addition", "multiplication", "unary",
    ):
        tree = tree.children[0]
    if isinstance(tree, lark.Tree) and tree.data == "ident":
        return str(tree.children[0])
    return None


class DRAEvaluator(ComprehensionMixin, Evaluator):
    """One evaluation of one expression (not shared between threads).

    Variables live in a plain dict per scope instead of cel-python's Activation/NameContainer:
    their protobuf-package name resolution costs more than the rest of a typical selector, and
    a DRA selector only ever sees `device` and comprehension/bind variables.
    """

    error_at = staticmethod(error_at)  # for ComprehensionMixin (no import back into this module)

    def __init__(self, ast: lark.Tree, variables: dict, functions: dict, literals: dict, budget: Budget):
        self.ast = ast
        self.variables = variables
        self.functions = functions
        self.literals = literals
        self.level = 0
        self.budget: Budget = budget

    # --- budget hook: every node visit goes through here ---------------------------------
    def _visit_tree(self, tree):
        # cel-python's tree wraps every operand in ~9 single-child nodes (expr -> conditionalor
        # -> ... -> primary); skipping them in a loop saves most Python frames and calls, and
        # makes one cost unit one CEL operation rather than one grammar rule.
        children = tree.children
        while tree.data in _PASS_THROUGH and len(children) == 1:
            tree = children[0]
            children = tree.children
        # Each handler charges its own cost (cost.py); parentheses, && / || and ?: themselves are free.
        return getattr(self, tree.data)(tree)

    visit = _visit_tree

    def visit_children(self, tree):
        return [self._visit_tree(c) if isinstance(c, lark.Tree) else c for c in tree.children]

    def _scoped(self, tree: lark.Tree, values: dict):
        saved = self.variables
        self.variables = {**saved, **values}
        try:
            return self.visit(tree)
        finally:
            self.variables = saved

    def literal(self, tree):
        # Literal values are decoded once per compiled expression (string unescaping is
        # surprisingly expensive in cel-python) and shared; they are immutable scalars.
        # cel-go charges nothing for a constant; visiting one is most of the work here, so it
        # costs 1 (otherwise a loop over `true && true && ...` would be free).
        self.budget.charge(1, tree)
        return self.literals[id(tree)]

    # --- logic -----------------------------------------------------------------------------
    def _chain(self, tree: lark.Tree, name: str) -> list[lark.Tree]:
        operands = []
        node = tree
        while node.data == name and len(node.children) == 2:
            operands.append(node.children[1])
            node = node.children[0]
        operands.append(node)
        operands.reverse()
        return operands

    def _logic(self, tree: lark.Tree, name: str, decisive: bool):
        if len(tree.children) == 1:
            return self.visit(tree.children[0])
        first_error = None
        for operand in self._chain(tree, name):
            value = self.visit(operand)
            if isinstance(value, celtypes.BoolType):
                if bool(value) is decisive:
                    return value
            elif first_error is None:
                first_error = value if isinstance(value, CELEvalError) else error_at(
                    f"no such overload: {'||' if decisive else '&&'} applied to {type_name(value)}", operand
                )
        return first_error if first_error is not None else celtypes.BoolType(not decisive)

    def conditionalor(self, tree):
        return self._logic(tree, "conditionalor", True)

    def conditionaland(self, tree):
        return self._logic(tree, "conditionaland", False)

    def expr(self, tree):
        if len(tree.children) == 1:
            return self.visit(tree.children[0])
        cond = self.visit(tree.children[0])
        if isinstance(cond, CELEvalError):
            return cond
        if not isinstance(cond, celtypes.BoolType):
            return error_at(f"no such overload: ternary condition is {type_name(cond)}, not bool", tree.children[0])
        return self.visit(tree.children[1] if cond else tree.children[2])

    _REL = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_ge": "_>=_", "relation_gt": "_>_",
            "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "_in_"}

    def relation(self, tree):
        if len(tree.children) == 1:
            return self.visit(tree.children[0])
        op_tree, right_tree = tree.children
        left = self.visit(op_tree.children[0])
        right = self.visit(right_tree)
        for v in (left, right):
            if isinstance(v, CELEvalError):
                return v
        op = self._REL[op_tree.data]
        try:
            if op == "_in_":
                return self._in(left, right, tree)
            self.budget.charge(self._relation_cost(op, left, right), tree)
            if op == "_==_":
                return celtypes.BoolType(operators.equals(left, right))
            if op == "_!=_":
                return celtypes.BoolType(not operators.equals(left, right))
            return celtypes.BoolType(operators.compare(op, left, right))
        except operators.NoOverload:
            return error_at(
                f"found no matching overload for '{op}' applied to '({type_name(left)}, {type_name(right)})'",
                tree,
                {"operator": op, "types": (type_name(left), type_name(right))},
                operator_position(op_tree, _SYMBOLS[op]),
            )

    def _relation_cost(self, op: str, left, right) -> int:
        if op in ("_==_", "_!=_"):
            return cost.equality_cost(left, right, self.budget.remaining())
        return cost.ordering_cost(left, right)

    _ARITH = {"addition_add": "_+_", "addition_sub": "_-_", "multiplication_mul": "_*_",
              "multiplication_div": "_/_", "multiplication_mod": "_%_"}

    def _arithmetic(self, tree):
        if len(tree.children) == 1:
            return self.visit(tree.children[0])
        op_tree, right_tree = tree.children
        left = self.visit(op_tree.children[0])
        right = self.visit(right_tree)
        for v in (left, right):
            if isinstance(v, CELEvalError):
                return v
        op = self._ARITH[op_tree.data]
        # Concatenation copies both operands: charged before it allocates anything.
        self.budget.charge(cost.concat_cost(left, right) if op == "_+_" else 1, tree)
        try:
            result = operators.arithmetic(op, left, right)
        except operators.NoOverload:
            return error_at(
                f"found no matching overload for '{op}' applied to '({type_name(left)}, {type_name(right)})'", tree,
                position=operator_position(op_tree, _SYMBOLS[op]),
            )
        except operators.OperatorError as exc:
            return error_at(str(exc), tree, position=operator_position(op_tree, _SYMBOLS[op]))
        return result

    addition = multiplication = _arithmetic

    def unary(self, tree):
        if len(tree.children) == 1:
            return self.visit(tree.children[0])
        op_tree, operand_tree = tree.children
        value = self.visit(operand_tree)
        if isinstance(value, CELEvalError):
            return value
        # cel-go folds a negated literal into a constant (free); `!x` and `-x` are calls (1).
        if not (op_tree.data == "unary_neg" and _is_literal(operand_tree)):
            self.budget.charge(1, tree)
        if op_tree.data == "unary_not":
            if isinstance(value, celtypes.BoolType):
                return celtypes.BoolType(not value)
            return error_at(f"found no matching overload for '!_' applied to '({type_name(value)})'", tree)
        try:
            return operators.negate(value)
        except operators.NoOverload:
            return error_at(f"found no matching overload for '-_' applied to '({type_name(value)})'", tree)
        except operators.OperatorError as exc:
            return error_at(str(exc), tree)

    def _in(self, item, container, tree):
        self.budget.charge(cost.in_cost(item, container, self.budget.remaining()), tree)
        if isinstance(container, celtypes.MapType):
            return celtypes.BoolType(item in container)
        if isinstance(container, celtypes.ListType):
            return celtypes.BoolType(any(operators.equals(item, c) for c in container))
        return no_overload("_in_", item, container)

    # --- member access ---------------------------------------------------------------------
    def member_dot(self, tree):
        member_tree, name_token = tree.children
        member = self.visit(member_tree)
        if isinstance(member, CELEvalError):
            return member
        self.budget.charge(1, tree)
        return self._lookup(member, str(name_token), tree, token_position(name_token))

    def member_index(self, tree):
        member = self.visit(tree.children[0])
        index = self.visit(tree.children[1])
        for v in (member, index):
            if isinstance(v, CELEvalError):
                return v
        self.budget.charge(1, tree)
        if isinstance(member, celtypes.ListType):
            if not isinstance(index, celtypes.IntType) or isinstance(index, celtypes.BoolType):
                return no_overload("_[_]", member, index)
            if not 0 <= int(index) < len(member):
                return error_at(f"index out of range: {int(index)}", tree)
            return member[int(index)]
        index_tree = tree.children[1]
        return self._lookup(member, index, tree, None if index_tree.meta.empty else index_tree.meta.start_pos)

    def _lookup(self, member, key, tree, position=None):
        if not isinstance(member, celtypes.MapType):
            return error_at(f"type '{type_name(member)}' does not support field selection", tree, position=position)
        try:
            return member[key]
        except (KeyError, TypeError):
            pass
        hint = None
        if isinstance(member, MissingDomain):
            hint = {"missing_domain": member.domain, "kind": member.kind, "available": member.available,
                    "name": str(key)}
        elif isinstance(member, DomainMap):
            names = tuple(sorted(str(k) for k in member))
            hint = {"domain": member.domain, "kind": member.kind, "names": names, "name": str(key)}
        return error_at(f"no such key: {key}", tree, hint, position)

    # --- has(), function and method calls --------------------------------------------------
    def macro_has_eval(self, exprlist):
        target = exprlist.children[0]
        node = target
        while node.data != "member_dot":
            node = node.children[0]
        operand = self.visit(node.children[0])
        if isinstance(operand, CELEvalError):
            return operand
        self.budget.charge(1, node)  # a presence test costs 1 plus its operand
        name = str(node.children[1])
        if isinstance(operand, DomainsMap):
            # Upstream's map with a default: every domain "exists" (as an empty map).
            return celtypes.BoolType(True)
        if isinstance(operand, celtypes.MapType):
            return celtypes.BoolType(name in operand)
        return error_at(f"invalid type for field selection: {type_name(operand)}", node)

    def _call(self, name: str, args: list, tree, position=None):
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        # String, regex and list functions cost by the length they traverse, as in cel-go.
        self.budget.charge(cost.call_cost(name, args), tree)
        try:
            fn = self.functions[name]
        except KeyError:
            return error_at(f"undeclared reference to '{name}'", tree, position=position)
        try:
            result = fn(*args)
        except (TypeError, AttributeError):
            result = no_overload(name, *args)
        except (ValueError, OverflowError) as exc:
            return error_at(str(exc) or "return error for overflow", tree, position=position)
        except ZeroDivisionError:
            return error_at("division by zero", tree, position=position)
        if isinstance(result, CELEvalError) and result.tree is None:
            result.tree, result.line, result.column = tree, tree.meta.line, tree.meta.column
            if position is not None:
                result.dra_position = position  # type: ignore[attr-defined]  # as in error_at
        return result

    def ident_arg(self, tree):
        name = str(tree.children[0])
        args_tree = tree.children[1] if len(tree.children) > 1 else None
        if name == "has":
            return self.macro_has_eval(args_tree)
        args = self.visit_children(args_tree) if args_tree is not None else []
        if name == "dyn":
            self.budget.charge(1, tree)
            return args[0]
        return self._call(name, args, tree, token_position(tree.children[0]))

    # Primary expressions are reached directly (the wrapper nodes are skipped).
    def ident(self, tree):
        self.budget.charge(1, tree)
        name = str(tree.children[0])
        try:
            return self.variables[name]
        except KeyError:
            if name in _TYPE_NAMES:
                return _TYPE_NAMES[name]
            return error_at(f"undeclared reference to '{name}'", tree)

    def paren_expr(self, tree):
        return self.visit(tree.children[0])

    def list_lit(self, tree):
        folded = self.literals.get(id(tree))
        if folded is not None:  # a list of constants, built once at compile time
            self.budget.charge(cost.LIST_CREATE, tree)
            return folded
        values = self.visit_children(tree.children[0]) if tree.children else []
        for v in values:
            if isinstance(v, CELEvalError):
                return v
        self.budget.charge(cost.LIST_CREATE, tree)
        return celtypes.ListType(values)

    def map_lit(self, tree):
        self.budget.charge(cost.MAP_CREATE, tree)
        result = celtypes.MapType()
        if not tree.children:
            return result
        items = self.visit_children(tree.children[0])
        for v in items:
            if isinstance(v, CELEvalError):
                return v
        seen = set()
        for key, value in zip(items[0::2], items[1::2], strict=False):
            # Keys equal under CEL's heterogeneous equality (1 and 1u) are repeated keys; one
            # set lookup each, not a comparison with every key so far.
            normal = operators.map_key(key)
            if normal in seen:
                return error_at(f"Failed with repeated key: {key}", tree)
            seen.add(normal)
            result[key] = value
        return result

    def dot_ident(self, tree):
        return error_at(f"undeclared reference to '.{tree.children[0]}'", tree)

    dot_ident_arg = dot_ident

    def primary(self, tree):
        return self.visit(tree.children[0])

    def member_dot_arg(self, tree):
        member_tree, name_token = tree.children[0], str(tree.children[1])
        args = tree.children[2].children if len(tree.children) > 2 and tree.children[2] is not None else []
        namespace = _tree_ident(member_tree)
        if namespace == "cel" and name_token == "bind":
            # A comprehension over an empty list in cel-go: that list is built (10).
            self.budget.charge(cost.LIST_CREATE, tree)
            var = _tree_ident(args[0])
            init = self.visit(args[1])
            return self._scoped(args[2], {var: init})
        if namespace is not None and (namespace, name_token) in _NAMESPACED:
            values = [self.visit(a) for a in args]
            fname = _NAMESPACED[(namespace, name_token)]
            return self._call(fname.replace(".", "_"), values, tree, token_position(tree.children[1]))
        if name_token in _MACROS_ONE_VAR and len(args) in (2, 3) and _tree_ident(args[0]) is not None and (
            len(args) == 2 or name_token == "map" or _tree_ident(args[1]) is None
        ):
            return self._comprehension(tree, name_token, member_tree, [_tree_ident(args[0])], args[1:])
        if name_token in _MACROS_TWO_VAR and len(args) in (3, 4) and _tree_ident(args[1]) is not None:
            return self._comprehension(
                tree, name_token, member_tree, [_tree_ident(args[0]), _tree_ident(args[1])], args[2:]
            )
        target = self.visit(member_tree)
        values = [self.visit(a) for a in args]
        return self._call(name_token, [target, *values], tree, token_position(tree.children[1]))
