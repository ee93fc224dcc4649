"""The type checker: what cel-go's checker does for the DRA environment, on cel-python's tree.

cel-python only parses; without this pass `device.allowMultipleAllocations` with the feature
off, `1` as a selector, or `capacity.memory >= quantity("40Gi")` would only fail per device at
run time (or not at all). Upstream rejects them when the DeviceClass or claim is created, so
we do too, with cel-go's wording and our hints.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import lark

from . import analysis, hints, regex
from .errors import CELCompileError
from .evaluator import _SYMBOLS, operator_position, token_position
from .types import (
    ANY,
    ATTRIBUTES,
    BOOL,
    BYTES,
    CAPACITY,
    DEVICE,
    DOUBLE,
    DYN,
    INT,
    NULL,
    QUANTITY,
    SEMVER,
    SIGNATURES,
    STRING,
    TYPE,
    UINT,
    UNSUPPORTED,
    binary_result,
    device_fields,
    fmt,
    is_dyn,
    list_of,
    map_of,
    match,
    substitute,
    unify,
)

_REL_OPS = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_ge": "_>=_", "relation_gt": "_>_",
            "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "_in_"}
_ADD_OPS = {"addition_add": "_+_", "addition_sub": "_-_", "multiplication_mul": "_*_",
            "multiplication_div": "_/_", "multiplication_mod": "_%_"}
_MACROS = {"all", "exists", "exists_one", "existsOne", "map", "filter", "transformList", "transformMap"}
_NAMESPACES = {"sets", "strings", "optional", "math"}
_REGEX_FUNCTIONS = {"matches", "find", "findAll"}


@dataclass
class Issue:
    message: str
    position: int | None
    hint: str | None = None
    severity: str = "error"


@dataclass
class Checked:
    """Result of checking: the output type and the warnings worth showing to a user."""

    output_type: object
    warnings: list[Issue] = field(default_factory=list)
    # id(node) -> type of every checked (unwrapped) node, for the cost estimator; the compiler
    # drops it once the estimate is made.
    types: dict = field(default_factory=dict)


def _pos(node) -> int | None:
    meta = getattr(node, "meta", None)
    if meta is None or meta.empty:
        return getattr(node, "start_pos", None)
    return meta.start_pos


def _source(expression: str, node) -> str | None:
    meta = getattr(node, "meta", None)
    if meta is None or meta.empty:
        return None
    text = expression[meta.start_pos : meta.end_pos].strip()
    return text if len(text) <= 80 else None


class _Checker:
    def __init__(self, expression: str, consumable_capacity: bool):
        self.expression = expression
        self.fields = device_fields(consumable_capacity)
        self.errors: list[Issue] = []
        self.warnings: list[Issue] = []
        self.scopes: list[dict] = [{"device": DEVICE}]
        self.types: dict[int, object] = {}

    def error(self, message: str, node, hint: str | None = None, position: int | None = None):
        self.errors.append(Issue(message, _pos(node) if position is None else position, hint))
        return DYN

    # --- dispatch ------------------------------------------------------------------------
    def check(self, node):
        # Skip single-child wrapper nodes in a loop (see analysis.unwrap) to keep recursion
        # proportional to the CEL nesting, not to the grammar.
        node = analysis.unwrap(node)
        t = getattr(self, "t_" + node.data)(node)
        self.types[id(node)] = t
        return t

    def _single(self, node):
        return self.check(node.children[0])

    t_member = t_primary = t_paren_expr = _single

    def t_expr(self, node):
        if len(node.children) == 1:
            return self.check(node.children[0])
        cond, a, b = (self.check(c) for c in node.children)
        if not is_dyn(cond) and cond != BOOL:
            self.error(f"found no matching overload for '_?_:_' applied to '({fmt(cond)}, {fmt(a)}, {fmt(b)})'", node)
        joined = unify(a, b)
        if joined is None:
            return self.error(
                f"found no matching overload for '_?_:_' applied to '({fmt(cond)}, {fmt(a)}, {fmt(b)})'", node)
        return joined

    def _logic(self, node, name: str, op: str):
        if len(node.children) == 1:
            return self.check(node.children[0])
        operands = []
        cur = node
        while cur.data == name and len(cur.children) == 2:
            operands.append(cur.children[1])
            cur = cur.children[0]
        operands.append(cur)
        for operand in reversed(operands):
            t = self.check(operand)
            if not is_dyn(t) and t != BOOL:
                self.error(f"found no matching overload for '{op}' applied to '({fmt(t)}, bool)'", operand)
        return BOOL

    def t_conditionalor(self, node):
        return self._logic(node, "conditionalor", "_||_")

    def t_conditionaland(self, node):
        return self._logic(node, "conditionaland", "_&&_")

    def t_relation(self, node):
        if len(node.children) == 1:
            return self.check(node.children[0])
        op_tree, right_tree = node.children
        op = _REL_OPS[op_tree.data]
        left = self.check(op_tree.children[0])
        right = self.check(right_tree)
        result = binary_result(op, left, right)
        if result is None:
            hint = None
            for t in (QUANTITY, SEMVER):
                if t in (left, right) and op in ("_<_", "_<=_", "_>_", "_>=_"):
                    hint = hints.ordering_on_library_type(
                        op, t, _source(self.expression, op_tree.children[0]), _source(self.expression, right_tree))
            return self.error(f"found no matching overload for '{op}' applied to '({fmt(left)}, {fmt(right)})'", node,
                              hint, operator_position(op_tree, _SYMBOLS[op]))
        return result

    def _arith(self, node, prefix: str):
        if len(node.children) == 1:
            return self.check(node.children[0])
        op_tree, right_tree = node.children
        op = _ADD_OPS[op_tree.data]
        left = self.check(op_tree.children[0])
        right = self.check(right_tree)
        result = binary_result(op, left, right)
        if result is None:
            hint = None
            if QUANTITY in (left, right) and op in ("_+_", "_-_"):
                hint = "quantities are added with q.add(other) and subtracted with q.sub(other)"
            return self.error(f"found no matching overload for '{op}' applied to '({fmt(left)}, {fmt(right)})'", node,
                              hint, operator_position(op_tree, _SYMBOLS[op]))
        return result

    def t_addition(self, node):
        return self._arith(node, "addition")

    def t_multiplication(self, node):
        return self._arith(node, "multiplication")

    def t_unary(self, node):
        if len(node.children) == 1:
            return self.check(node.children[0])
        op, operand = node.children
        t = self.check(operand)
        if op.data == "unary_not":
            if not is_dyn(t) and t != BOOL:
                return self.error(f"found no matching overload for '!_' applied to '({fmt(t)})'", node)
            return BOOL
        if not is_dyn(t) and t not in (INT, DOUBLE):
            return self.error(f"found no matching overload for '-_' applied to '({fmt(t)})'", node)
        return t

    # --- literals and names ----------------------------------------------------------------
    def t_literal(self, node):
        token = node.children[0]
        kind = token.type
        if kind in ("STRING_LIT", "MLSTRING_LIT"):
            try:
                analysis.decode_string(token)
            except ValueError as exc:
                return self.error(f"Syntax error: invalid string literal: {exc}", node)
            return STRING
        return {"INT_LIT": INT, "UINT_LIT": UINT, "FLOAT_LIT": DOUBLE, "BYTES_LIT": BYTES,
                "BOOL_LIT": BOOL, "NULL_LIT": NULL}.get(kind, DYN)

    def lookup(self, name: str):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def t_ident(self, node):
        name = str(node.children[0])
        t = self.lookup(name)
        if t is None:
            if name in ("int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"):
                return TYPE
            return self.error(f"undeclared reference to '{name}' (in container '')", node)
        return t

    def t_dot_ident(self, node):
        return self.error(f"undeclared reference to '.{node.children[0]}' (in container '')", node)

    t_dot_ident_arg = t_dot_ident

    def t_list_lit(self, node):
        if not node.children:
            return list_of(DYN)
        elem = None
        for item in node.children[0].children:
            t = self.check(item)
            if elem is None:
                elem = t
                continue
            joined = unify(elem, t)
            if joined is None:
                # HomogeneousAggregateLiterals, as in the Kubernetes base environment.
                self.error(f"expected type '{fmt(elem)}' but found '{fmt(t)}'", item)
            else:
                elem = joined
        return list_of(elem or DYN)

    def t_map_lit(self, node):
        if not node.children:
            return map_of(DYN, DYN)
        items = node.children[0].children
        key_t = val_t = None
        for k, v in zip(items[0::2], items[1::2], strict=False):
            kt, vt = self.check(k), self.check(v)
            if not is_dyn(kt) and kt not in (STRING, INT, UINT, BOOL):
                self.error(f"unsupported map key type: {fmt(kt)}", k)
            for current, new, where in ((key_t, kt, k), (val_t, vt, v)):
                if current is not None and unify(current, new) is None:
                    self.error(f"expected type '{fmt(current)}' but found '{fmt(new)}'", where)
            key_t = kt if key_t is None else (unify(key_t, kt) or key_t)
            val_t = vt if val_t is None else (unify(val_t, vt) or val_t)
        return map_of(key_t, val_t)

    def t_member_object(self, node):
        return self.error("message construction is not supported in DRA selectors", node)

    # --- field selection and indexing ------------------------------------------------------
    def t_member_dot(self, node):
        operand_node, name_token = node.children
        name = str(name_token)
        t = self.check(operand_node)
        return self.select(t, name, node, token_position(name_token))

    def select(self, t, name: str, node, position: int | None = None):
        if t == DEVICE:
            if name not in self.fields:
                if name == "allowMultipleAllocations":
                    hint = ("device.allowMultipleAllocations exists only when the DRAConsumableCapacity feature is "
                            "enabled")
                else:
                    hint = _did_you_mean(name, self.fields) + "the device variable has the fields: " + ", ".join(
                        sorted(self.fields))
                return self.error(f"undefined field '{name}'", node, hint, position)
            return self.fields[name]
        if t in (ATTRIBUTES, CAPACITY):
            # device.attributes.productName reads the *domain* "productName".
            kind = "attributes" if t == ATTRIBUTES else "capacity"
            self.warn(f'device.{kind}.{name} selects the {kind} domain "{name}", which is not a domain name',
                      position, f'write device.{kind}["<domain>"].{name}, e.g. device.{kind}["gpu.nvidia.com"].{name}')
        if is_dyn(t):
            return t
        if isinstance(t, tuple) and t[0] == "map":
            if not is_dyn(t[1]) and t[1] != STRING:
                return self.error(f"type '{fmt(t)}' does not support field selection", node)
            return t[2]
        return self.error(f"type '{fmt(t)}' does not support field selection", node)

    def t_member_index(self, node):
        operand_node, index_node = node.children
        t = self.check(operand_node)
        index = self.check(index_node)
        if is_dyn(t):
            return t
        if isinstance(t, tuple) and t[0] == "list":
            if not is_dyn(index) and index not in (INT, UINT):
                return self.error(f"found no matching overload for '_[_]' applied to '({fmt(t)}, {fmt(index)})'", node)
            return t[1]
        if isinstance(t, tuple) and t[0] == "map":
            if unify(t[1], index) is None:
                return self.error(f"found no matching overload for '_[_]' applied to '({fmt(t)}, {fmt(index)})'", node)
            if t in (ATTRIBUTES, CAPACITY):
                self.lint_domain(t, index_node)
            return t[2]
        return self.error(f"found no matching overload for '_[_]' applied to '({fmt(t)}, {fmt(index)})'", node)

    def lint_domain(self, t, index_node):
        """Domain keys that are really qualified names or bare names are common mistakes."""
        domain = analysis.string_literal(index_node)
        if domain is None:
            return
        kind = "attributes" if t == ATTRIBUTES else "capacity"
        if "/" in domain:
            d, _, n = domain.partition("/")
            self.warn(f'"{domain}" is a qualified name, not a domain: no device has that {kind} domain',
                      _pos(index_node), f'write device.{kind}["{d}"].{n}')
        elif "." not in domain:
            self.warn(f'"{domain}" does not look like a domain (domains are DNS names such as "gpu.nvidia.com")',
                      _pos(index_node), f'names go after the domain: device.{kind}["<driver domain>"].{domain}')

    def warn(self, message: str, position: int | None, hint: str | None = None):
        self.warnings.append(Issue(message, position, hint, "warning"))

    # --- calls and macros ------------------------------------------------------------------
    def t_ident_arg(self, node):
        name = str(node.children[0])
        args = node.children[1].children if len(node.children) > 1 else []
        if name == "has":
            return self.has(node, args)
        return self.call(name, None, None, args, node, token_position(node.children[0]))

    def has(self, node, args):
        target = analysis.unwrap(args[0]) if len(args) == 1 else None
        if not isinstance(target, lark.Tree) or target.data != "member_dot":
            return self.error("invalid argument to has() macro", node)
        self.check(target)
        return BOOL

    def t_member_dot_arg(self, node):
        operand_node, name = node.children[0], str(node.children[1])
        args = node.children[2].children if len(node.children) > 2 and node.children[2] is not None else []
        namespace = analysis.ident_name(operand_node)
        if namespace == "cel" and self.lookup("cel") is None:
            if name == "bind":
                return self.bind(node, args)
            return self.error(f"undeclared reference to 'cel.{name}' (in container '')", node)
        if namespace in _NAMESPACES and self.lookup(namespace) is None:
            return self.call(f"{namespace}.{name}", None, None, args, node, token_position(node.children[1]))
        if name in _MACROS:
            macro = self.comprehension(node, name, operand_node, args)
            if macro is not None:
                return macro
        receiver = self.check(operand_node)
        return self.call(name, receiver, operand_node, args, node, token_position(node.children[1]))

    def bind(self, node, args):
        var = analysis.ident_name(args[0]) if len(args) == 3 else None
        if var is None:
            return self.error("cel.bind() variable name must be a simple identifier", node)
        init = self.check(args[1])
        self.scopes.append({var: init})
        try:
            return self.check(args[2])
        finally:
            self.scopes.pop()

    def comprehension(self, node, name, range_node, args):
        names = [analysis.ident_name(a) for a in args]
        two_var = name in ("transformList", "transformMap") or (
            len(args) >= 3 and names[1] is not None and name != "map")
        nvars = 2 if two_var else 1
        if len(args) < nvars + 1 or any(n is None for n in names[:nvars]):
            needs = "two variable names" if two_var else "a variable name"
            return self.error(f"{name}() needs {needs} and an expression", node)
        if name in ("all", "exists", "exists_one", "existsOne", "filter") and len(args) != nvars + 1:
            return self.error(f"{name}() takes {nvars + 1} arguments, not {len(args)}", node)
        if name in ("map", "transformList", "transformMap") and len(args) not in (nvars + 1, nvars + 2):
            return self.error(f"{name}() takes {nvars + 1} or {nvars + 2} arguments, not {len(args)}", node)
        source = self.check(range_node)
        if is_dyn(source):
            key_t = val_t = DYN
        elif isinstance(source, tuple) and source[0] == "list":
            key_t, val_t = INT, source[1]
        elif isinstance(source, tuple) and source[0] == "map":
            key_t, val_t = source[1], source[2]
        else:
            return self.error(f"expression of type '{fmt(source)}' cannot be range of a comprehension "
                              "(must be list, map, or dynamic)", range_node)
        is_map = isinstance(source, tuple) and source[0] == "map"
        scope = {names[0]: key_t, names[1]: val_t} if two_var else {names[0]: key_t if is_map else val_t}
        if not two_var and is_dyn(source):
            scope = {names[0]: DYN}
        self.scopes.append(scope)
        try:
            bodies = [self.check(a) for a in args[nvars:]]
        finally:
            self.scopes.pop()
        # The first body is a predicate for all/exists/filter and for the filtering forms of
        # map/transformList/transformMap (which take predicate and transform).
        if name in ("all", "exists", "exists_one", "existsOne", "filter") or len(bodies) == 2:
            pred = bodies[0]
            if not is_dyn(pred) and pred != BOOL:
                self.error(f"found no matching overload for '{name}' predicate of type '{fmt(pred)}'", args[nvars])
        if name in ("all", "exists", "exists_one", "existsOne"):
            return BOOL
        if name == "filter":
            return list_of(key_t if is_map else val_t)
        if name == "transformMap":
            return map_of(key_t, bodies[-1])
        return list_of(bodies[-1])

    def call(self, name: str, receiver, receiver_node, arg_nodes, node, position: int | None = None):
        arg_types = [self.check(a) for a in arg_nodes]
        overloads = SIGNATURES.get(name)
        if overloads is None:
            hint = UNSUPPORTED.get(name) or (_did_you_mean(name, SIGNATURES).rstrip("; ") or None)
            return self.error(f"undeclared reference to '{name}' (in container '')", node, hint, position)
        results = []
        for recv, params, result in overloads:
            if (recv is None) != (receiver is None) or len(params) != len(arg_types):
                continue
            bindings: dict = {}
            if recv is not None and not match(recv, receiver, bindings):
                continue
            if all(match(p, a, bindings) for p, a in zip(params, arg_types, strict=False)):
                results.append(substitute(result, bindings))
        if not results:
            return self.error(
                f"found no matching overload for '{name}' applied to "
                f"'{fmt(receiver) + '.' if receiver is not None else ''}"
                f"({', '.join(fmt(t) for t in arg_types)})'", node, _call_hint(name, receiver), position)
        if name in _REGEX_FUNCTIONS:
            pattern_node = arg_nodes[1] if receiver is None else arg_nodes[0]
            self.check_regex_literal(pattern_node)
        if name in ("quantity", "semver") and arg_nodes:
            self.warn_bad_literal(name, arg_nodes)
        first = results[0]
        return first if all(r == first for r in results) else DYN

    def check_regex_literal(self, node):
        pattern = analysis.string_literal(node)
        if pattern is None:
            return
        try:
            regex.compile_pattern(pattern)
        except regex.RegexError as exc:
            # cel-go's ValidateRegexLiterals rejects a bad literal pattern at compile time.
            self.error(f"invalid matches argument: {exc}", node)

    def warn_bad_literal(self, name: str, arg_nodes):
        from .quantity import Quantity, QuantityError
        from .semver import Semver, SemverError

        text = analysis.string_literal(arg_nodes[0])
        if text is None:
            return
        try:
            if name == "quantity":
                Quantity.parse(text)
            elif len(arg_nodes) == 1:
                Semver.parse(text)
            else:
                Semver.parse_normalized(text)
        except (QuantityError, SemverError) as exc:
            templated = "{{" in text or "${" in text
            self.warnings.append(Issue(
                f'{name}("{text}") will fail for every device: {exc}', _pos(arg_nodes[0]),
                "the value looks like an unexpanded template placeholder" if templated else None, "warning"))


def _did_you_mean(name: str, candidates) -> str:
    by_lower = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    return f"did you mean '{by_lower[close[0]]}'? " if close else ""


def _call_hint(name: str, receiver) -> str | None:
    if name in ("isGreaterThan", "isLessThan", "compareTo") and receiver is not None \
            and receiver not in (QUANTITY, SEMVER):
        return (f"{name} compares two quantities or two semantic versions; "
                'wrap literals as quantity("40Gi") or semver("1.2.3")')
    if name == "contains" and receiver is not None and isinstance(receiver, tuple):
        return 'use `value in list` to test list membership'
    return None


def check(expression: str, tree: lark.Tree, *, consumable_capacity: bool) -> Checked:
    """Type-check a parsed expression; raise CELCompileError for the first error (all errors
    are attached as `.issues` for the lint endpoint)."""
    checker = _Checker(expression, consumable_capacity)
    output = checker.check(tree)
    if not checker.errors and output not in (BOOL, ANY):
        checker.error(f"must evaluate to bool or the unknown type, not {fmt(output)}", tree,
                      "a selector must be a condition, e.g. compare the value with ==")
    if checker.errors:
        first = checker.errors[0]
        exc = CELCompileError(expression, first.message, first.position, first.hint)
        # Extra fields only this error carries; lint reads them back with getattr.
        exc.issues = checker.errors  # type: ignore[attr-defined]
        exc.warnings = checker.warnings  # type: ignore[attr-defined]
        raise exc
    return Checked(output, checker.warnings, checker.types)
