"""cel-go's cost estimator (checker/cost.go) over cel-python's parse tree.

Each subexpression gets an `Est`: its worst-case cost and, where CEL can know it, the maximum
size of its value (from a literal, from a field path below `device` with a declared size, or
derived from the sizes of the operands). cel-go expands macros into comprehensions with an
accumulator; the costs below are those of the expansions (`all` steps cost
`@not_strictly_false(@result)` + `@result && p`, and so on), so the numbers match upstream's.
The Kubernetes function costs come from apiserver/pkg/cel/library/cost.go (`estimate_call`).

Two modes. `upstream=True` is the exact port: the 37 upstream table tests give upstream's
numbers. The default is this service's estimate, which bounds what our evaluator charges
(runtime cost in cost.py): the same units plus the work cel-python does and cel-go does not
(visiting a constant costs 1, concatenating lists copies them, selecting from a dynamic value
costs 1, parsing a quantity or semver traverses its text, the global form of matches() runs the
regex, replace() builds its result). It is never below upstream's, and a run over a device that
keeps to the declared sizes never costs more than it.
"""
from __future__ import annotations

from dataclasses import dataclass

import lark

from .analysis import ident_name, string_literal, unwrap
from .cost import LIST_CREATE, MAP_CREATE, REGEX_LENGTH, STRING_TRAVERSAL, UNBOUNDED, add, declared_size, factor, mul
from .types import BOOL, BYTES, DEVICE, DOUBLE, DURATION, INT, QUANTITY, SEMVER, STRING, TIMESTAMP, UINT, is_dyn

_SCALARS = frozenset({BOOL, DOUBLE, DURATION, INT, TIMESTAMP, UINT})
_MACROS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter", "transformList", "transformMap"})
_NAMESPACES = frozenset({"sets", "strings"})
_TEXT = (STRING, BYTES)


@dataclass(slots=True)
class Est:
    """The estimate of one subexpression."""

    cost: int
    size: int | None = None  # maximum size (characters, bytes, entries); None when unknown
    path: tuple = ()  # field path below a variable, for declared sizes: ("device", "attributes", "@values", ...)
    entry: tuple | None = None  # (key size, value size) of a list's or map's entries, when known

    @property
    def bound(self) -> int:
        return UNBOUNDED if self.size is None else self.size


@dataclass(slots=True)
class _Var:
    path: tuple
    size: int | None
    entry: tuple | None


def _union_entry(a: tuple | None, b: tuple | None) -> tuple | None:
    if a is None or b is None:
        return None
    return (max(a[0], b[0]), max(a[1], b[1]))


def _is(t, kind: str) -> bool:
    return isinstance(t, tuple) and t[0] == kind


def sum_costs(items) -> int:
    total = 0
    for item in items:
        total = add(total, item.cost)
    return total


class _Estimator:
    """One walk over a checked tree; `types` maps id(node) to the checker's type of the node."""

    def __init__(self, types: dict, literals: dict, upstream: bool):
        self.types = types
        self.literals = literals
        self.upstream = upstream
        self.constant = 0 if upstream else 1  # what visiting a constant costs
        # A macro variable that is not an identifier (the checker rejects it) is keyed None, never looked up.
        self.scopes: list[dict[str | None, _Var]] = []

    def type(self, node):
        return self.types.get(id(unwrap(node)))

    def est(self, node) -> Est:
        node = unwrap(node)
        return getattr(self, "e_" + node.data)(node)

    def sized(self, node, cost: int, computed: int | None = None, path: tuple = (), entry=None,
              local: int | None = None) -> Est:
        """cel-go's computeSize order: a computed size, the declared size at the path, 1 for a
        fixed-width scalar, the size of a local variable."""
        size = computed
        if size is None:
            size = declared_size(path)
        if size is None and self.type(node) in _SCALARS:
            size = 1
        if size is None:
            size = local
        return Est(cost, size, path, entry)

    def lookup(self, name: str) -> _Var | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    # --- leaves ------------------------------------------------------------------------------
    def e_literal(self, node) -> Est:
        value = self.literals.get(id(node))
        return Est(self.constant, len(value) if isinstance(value, (str, bytes)) else 1)

    def e_ident(self, node) -> Est:
        name = str(node.children[0])
        var = self.lookup(name)
        if var is None:
            return self.sized(node, 1, path=(name,))
        return self.sized(node, 1, path=var.path, entry=var.entry, local=var.size)

    def e_paren_expr(self, node) -> Est:
        return self.est(node.children[0])  # cel-go's parser drops parentheses

    def e_list_lit(self, node) -> Est:
        items = [self.est(c) for c in node.children[0].children] if node.children else []
        value = max((i.bound for i in items), default=0)
        return Est(add(LIST_CREATE, sum_costs(items)), len(items), (), (1, value))

    def e_map_lit(self, node) -> Est:
        items = [self.est(c) for c in node.children[0].children] if node.children else []
        keys, values = items[0::2], items[1::2]
        entry = (max((k.bound for k in keys), default=0), max((v.bound for v in values), default=0))
        return Est(add(MAP_CREATE, sum_costs(items)), len(keys), (), entry)

    def e_member_object(self, node) -> Est:
        return Est(UNBOUNDED)  # rejected by the checker; never reached

    e_dot_ident = e_dot_ident_arg = e_member_object

    # --- operators ---------------------------------------------------------------------------
    def e_expr(self, node) -> Est:
        if len(node.children) == 1:
            return self.est(node.children[0])
        cond, a, b = (self.est(c) for c in node.children)
        return Est(add(cond.cost, max(a.cost, b.cost)), max(a.bound, b.bound), (), _union_entry(a.entry, b.entry))

    def _chain(self, node, name: str) -> Est:
        # `a && b` costs a + b: the operator itself is free, as in cel-go.
        if len(node.children) == 1:
            return self.est(node.children[0])
        total, cur = 0, node
        while cur.data == name and len(cur.children) == 2:
            total = add(total, self.est(cur.children[1]).cost)
            cur = unwrap(cur.children[0])
        return Est(add(total, self.est(cur).cost), 1)

    def e_conditionalor(self, node) -> Est:
        return self._chain(node, "conditionalor")

    def e_conditionaland(self, node) -> Est:
        return self._chain(node, "conditionaland")

    def e_relation(self, node) -> Est:
        if len(node.children) == 1:
            return self.est(node.children[0])
        op_tree, right_node = node.children
        left_node = op_tree.children[0]
        left, right = self.est(left_node), self.est(right_node)
        lt, rt = self.type(left_node), self.type(right_node)
        op = op_tree.data
        if op in ("relation_eq", "relation_ne"):
            fn = _equality_cost(lt, rt, left, right)
        elif op == "relation_in":
            fn = _in_cost(rt, right)
        else:
            fn = _ordering_cost(lt, rt, left, right)
        return Est(add(add(left.cost, right.cost), fn), 1)

    def _arith(self, node) -> Est:
        if len(node.children) == 1:
            return self.est(node.children[0])
        op_tree, right_node = node.children
        left_node = op_tree.children[0]
        left, right = self.est(left_node), self.est(right_node)
        args = add(left.cost, right.cost)
        if op_tree.data != "addition_add":
            return self.sized(node, add(args, 1))
        kinds = {t for t in (self.type(left_node), self.type(right_node)) if not is_dyn(t)}
        joined = add(left.bound, right.bound)
        if kinds and kinds <= set(_TEXT):
            fn = factor(joined, STRING_TRAVERSAL)
            return Est(add(args, fn if self.upstream else max(1, fn)), joined)
        if kinds and all(_is(t, "list") for t in kinds):
            # List concatenation is O(1) in cel-go (only its size is tracked); cel-python copies.
            fn = 1 if self.upstream else max(1, factor(joined, STRING_TRAVERSAL))
            return Est(add(args, fn), joined, (), _union_entry(left.entry, right.entry))
        if not kinds:
            # Both operands dynamic: every overload applies and the costliest one counts.
            return Est(add(args, max(1, factor(joined, STRING_TRAVERSAL))), joined)
        return self.sized(node, add(args, 1))

    e_addition = e_multiplication = _arith

    def e_unary(self, node) -> Est:
        if len(node.children) == 1:
            return self.est(node.children[0])
        op, operand_node = node.children
        if op.data == "unary_neg" and unwrap(operand_node).data == "literal":
            return Est(self.constant, 1)  # cel-go's parser folds -1 into a constant
        return self.sized(node, add(self.est(operand_node).cost, 1))

    # --- selection and indexing --------------------------------------------------------------
    def e_member_dot(self, node) -> Est:
        operand_node, name = node.children
        operand = self.est(operand_node)
        t = self.type(operand_node)
        # Selecting from a map or an object costs 1; from a dynamic value cel-go charges nothing.
        cost = add(operand.cost, 1 if t == DEVICE or _is(t, "map") or not self.upstream else 0)
        return self.sized(node, cost, path=operand.path + (str(name),))

    def e_member_index(self, node) -> Est:
        operand_node, index_node = node.children
        operand, index = self.est(operand_node), self.est(index_node)
        is_list = _is(self.type(operand_node), "list")
        computed = operand.entry[1] if operand.entry is not None else None
        path = operand.path + ("@items" if is_list else "@values",)
        return self.sized(node, add(add(operand.cost, index.cost), 1), computed, path)

    # --- calls -------------------------------------------------------------------------------
    def e_ident_arg(self, node) -> Est:
        name = str(node.children[0])
        args = node.children[1].children if len(node.children) > 1 and node.children[1] is not None else []
        if name == "has":
            # A presence test costs 1 plus its operand; the selection itself is not charged.
            target = unwrap(args[0])
            return Est(add(self.est(target.children[0]).cost, 1), 1)
        if name == "dyn":
            arg = self.est(args[0])
            return Est(add(arg.cost, 1), arg.size, (), arg.entry)
        return self.call(node, name, None, args)

    def e_member_dot_arg(self, node) -> Est:
        operand_node, name = node.children[0], str(node.children[1])
        args = node.children[2].children if len(node.children) > 2 and node.children[2] is not None else []
        namespace = ident_name(operand_node)
        if namespace == "cel" and name == "bind" and self.lookup("cel") is None:
            return self.bind(args)
        if namespace in _NAMESPACES and self.lookup(namespace) is None:
            return self.call(node, f"{namespace}.{name}", None, args)
        if name in _MACROS:
            return self.comprehension(name, operand_node, args)
        return self.call(node, name, operand_node, args)

    def call(self, node, name: str, target_node, arg_nodes) -> Est:
        target = self.est(target_node) if target_node is not None else None
        args = [self.est(a) for a in arg_nodes]
        types = [self.type(a) for a in arg_nodes]
        ttype = self.type(target_node) if target_node is not None else None
        fn, size = estimate_call(name, target, ttype, args, types, arg_nodes, self.upstream)
        cost = add(sum_costs(args), fn)
        if target is not None:
            cost = add(cost, target.cost)
        return self.sized(node, cost, size)

    def bind(self, args) -> Est:
        # cel.bind is a comprehension over an empty list: that list is built (10), then init and body.
        init = self.est(args[1])
        self.scopes.append({ident_name(args[0]): _Var(init.path, init.size, init.entry)})
        try:
            body = self.est(args[2])
        finally:
            self.scopes.pop()
        return Est(add(add(LIST_CREATE, init.cost), body.cost), body.size, (), body.entry)

    def comprehension(self, name: str, range_node, args) -> Est:
        names = [ident_name(a) for a in args]
        two = name in ("transformList", "transformMap") or (len(args) >= 3 and names[1] is not None and name != "map")
        nvars = 2 if two else 1
        source = self.est(range_node)
        is_list = _is(self.type(range_node), "list")
        entry = source.entry or (None, None)
        keys = _Var(source.path + ("@indices" if is_list else "@keys",), entry[0], None)
        values = _Var(source.path + ("@items" if is_list else "@values",), entry[1], None)
        scope = {names[0]: keys, names[1]: values} if two else {names[0]: values if is_list else keys}
        self.scopes.append(scope)
        try:
            bodies = [self.est(a) for a in args[nvars:]]
        finally:
            self.scopes.pop()
        init, step, result, out = _expansion(name, bodies, scope[names[1]] if two else scope[names[0]])
        total = add(add(source.cost, init), add(mul(source.bound, step), result))
        if out is None:
            return Est(total, 1)
        return Est(total, source.bound, (), out)


def _expansion(name: str, bodies: list[Est], item: _Var) -> tuple[int, int, int, tuple | None]:
    """(accumulator init, cost of one iteration, result, entry sizes of the result) of cel-go's
    expansion of a macro; `bodies` are the predicate and/or transform."""
    kind = {"exists_one": "existsOne"}.get(name, name)
    last = bodies[-1].cost
    if kind == "all":  # cond @not_strictly_false(@r) = 2; step @r && p = 1 + p
        return 0, add(3, last), 1, None
    if kind == "exists":  # cond @not_strictly_false(!@r) = 3; step @r || p = 1 + p
        return 0, add(4, last), 1, None
    if kind == "existsOne":  # step p ? @r + 1 : @r = p + 2; result @r == 1 = 2
        return 0, add(2, last), 2, None
    predicate = bodies[0].cost if len(bodies) == 2 else 0
    if kind == "filter":  # step p ? @r + [x] : @r = p + 13
        return LIST_CREATE, add(13, last), 1, (1, UNBOUNDED if item.size is None else item.size)
    if kind == "transformMap":  # step cel.@mapInsert(@r, k, t) = 3 + t; init {}
        return MAP_CREATE, add(add(3, last), predicate), 1, None
    # map / transformList: step @r + [t] = 12 + t (p ? ... : @r with a predicate)
    return LIST_CREATE, add(add(12, last), predicate), 1, (1, bodies[-1].bound)


def _equality_cost(lt, rt, left: Est, right: Est) -> int:
    # Kubernetes: == on two quantities or two semvers is O(1) (library/cost.go). Its estimator
    # forgets !=, which then costs "unknown size" and is refused; != is the same O(1) work, so
    # we count 1 for it too (the one place where we accept what upstream may not).
    if lt == rt and lt in (QUANTITY, SEMVER):
        return 1
    return factor(min(left.bound, right.bound), STRING_TRAVERSAL)


def _ordering_cost(lt, rt, left: Est, right: Est) -> int:
    textual = (lt in _TEXT or is_dyn(lt)) and (rt in _TEXT or is_dyn(rt))
    if not textual or (lt in _TEXT and rt in _TEXT and lt != rt):
        return 1
    by_size = factor(min(left.bound, right.bound), STRING_TRAVERSAL)
    # With both sides dynamic the numeric overloads (cost 1) apply too.
    return by_size if lt in _TEXT or rt in _TEXT else max(1, by_size)


def _in_cost(rt, right: Est) -> int:
    if _is(rt, "map"):
        return 1
    if _is(rt, "list"):
        return factor(right.bound, 1)
    return max(1, factor(right.bound, 1))


def estimate_call(name: str, target: Est | None, ttype, args: list[Est], types: list, arg_nodes,
                  upstream: bool) -> tuple[int, int | None]:
    """(cost of the function itself, maximum size of its result or None): cel-go's functionCost
    with Kubernetes' EstimateCallCost and the sets extension's estimators."""
    if target is not None:
        found = _method_estimate(name, target, ttype, args, arg_nodes, upstream)
        if found is not None:
            return found
    if not upstream and args:
        if name == "matches" and len(args) == 2:  # the global form runs the same regex
            found = _method_estimate(name, args[0], STRING, args[1:], arg_nodes[1:], upstream)
            assert found is not None  # every regex function has an estimate
            return found
        if name in ("quantity", "isQuantity", "semver", "isSemver"):
            return max(1, factor(args[0].bound, STRING_TRAVERSAL)), None
    if name == "strings.quote":
        return factor(args[0].bound, STRING_TRAVERSAL), add(mul(args[0].bound, 2), 2)
    if name in ("sets.contains", "sets.intersects", "sets.equivalent"):
        pairs = mul(args[0].bound, args[1].bound)
        return add(factor(pairs, 2 if name == "sets.equivalent" else 1), 1), None
    if name in ("bytes", "string") and args:
        # string -> bytes and bytes -> string traverse their argument; other conversions are O(1).
        source = STRING if name == "bytes" else BYTES
        if types[0] == source or is_dyn(types[0]):
            by_size = factor(args[0].bound, STRING_TRAVERSAL)
            size = mul(args[0].bound, 4) if name == "bytes" else args[0].bound
            return (by_size if types[0] == source else max(1, by_size)), size
    # Everything else is O(1), including quantity() and semver(): upstream's library estimates
    # them only as methods (`target != nil`), which they never are.
    return 1, None


def _method_estimate(name: str, target: Est, ttype, args: list[Est], arg_nodes,
                     upstream: bool) -> tuple[int, int | None] | None:
    size = target.bound
    if name == "contains":
        return mul(factor(size, STRING_TRAVERSAL), factor(args[0].bound, STRING_TRAVERSAL)), None
    if name in ("startsWith", "endsWith"):
        return factor(args[0].bound, STRING_TRAVERSAL), None
    if name in ("matches", "find", "findAll"):
        # RE2 is linear: text length times a guess of the pattern's size (4 characters a term).
        regex = mul(factor(add(size, 1), STRING_TRAVERSAL), factor(args[0].bound, REGEX_LENGTH))
        return regex, (None if name == "matches" else size)
    if name in ("lowerAscii", "upperAscii", "substring", "trim"):
        return factor(size, STRING_TRAVERSAL), size
    if name == "replace" and len(args) >= 2:
        result = _replaced_size(size, args, arg_nodes)
        growth = 0 if upstream else factor(max(result - size, 0), STRING_TRAVERSAL)
        return add(factor(size, 2 * STRING_TRAVERSAL), growth), result
    if name == "split":
        limit = _int_literal(arg_nodes[1]) if len(arg_nodes) > 1 else None
        return factor(size, 2 * STRING_TRAVERSAL), (size if limit is None else limit % 2**64)
    if name == "join" and _is(ttype, "list"):
        joined = mul(size, _item_size(target))
        if args:
            joined = add(joined, mul(args[0].bound, max(size - 1, 0)))
        return factor(joined, STRING_TRAVERSAL), joined
    if name in ("indexOf", "lastIndexOf", "isSorted", "sum", "min", "max"):
        if not _is(ttype, "list"):
            return factor(size, STRING_TRAVERSAL), None
        per_item = 1
        if ttype[1] in _TEXT:
            per_item = add(1, factor(_item_size(target), STRING_TRAVERSAL))
        return mul(size, per_item), None
    return None


def _item_size(target: Est) -> int:
    """Upstream's listElementNode: only a declared size at the list's path (never the entries)."""
    size = declared_size(target.path + ("@items",)) if target.path else None
    return UNBOUNDED if size is None else size


def _replaced_size(size: int, args: list[Est], arg_nodes) -> int:
    old = string_literal(arg_nodes[0])
    old_min = len(old) if old is not None else 0  # sizes not from a literal have a minimum of 0
    new_max = args[1].bound
    if old_min == 0:  # "" is replaced around every character
        count, kept = (add(size, 1) if size < UNBOUNDED else size), size
    elif new_max <= old_min:
        count, kept = 0, size
    else:
        count, kept = -(-size // old_min), 0
    return add(mul(count, new_max), kept)


def _int_literal(node) -> int | None:
    node = unwrap(node)
    sign = 1
    if isinstance(node, lark.Tree) and node.data == "unary" and len(node.children) == 2 \
            and node.children[0].data == "unary_neg":
        sign, node = -1, unwrap(node.children[1])
    if isinstance(node, lark.Tree) and node.data == "literal" and isinstance(node.children[0], lark.Token) \
            and node.children[0].type == "INT_LIT":
        try:
            return sign * int(str(node.children[0]), 0)
        except ValueError:
            return None
    return None


def estimate(tree: lark.Tree, types: dict, literals: dict, *, upstream: bool = False) -> int:
    """The worst-case cost of a checked expression in cel-go cost units (UNBOUNDED if unknown):
    this service's estimate, or with `upstream` exactly Kubernetes' (see the module docstring)."""
    try:
        return _Estimator(types, literals, upstream).est(tree).cost
    except RecursionError:
        # Only reachable if the caller is already deep in its own stack (the nesting limit keeps
        # the walk shallow); an expression whose cost cannot be known is too expensive to store.
        return UNBOUNDED


__all__ = ["Est", "estimate"]
