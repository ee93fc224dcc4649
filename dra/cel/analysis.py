"""Static facts about a parsed expression that make fleet-scale evaluation cheap.

- `footprint`: which parts of the `device` variable the expression can read. The result of an
  expression depends only on those parts, so devices that agree on them (the same GPU model on
  hundreds of nodes, differing only in uuid and PCI address) share one evaluation.
- `drivers`: the drivers a device must have for the expression to be true, when the expression
  says so at top level (`device.driver == "x" && ...`), so callers can skip other devices.
- `nesting_depth`: how deeply the expression nests, to refuse expressions that would exhaust the
  Python stack of a tree-walking evaluator.

All walks are iterative: they run before the nesting limit is enforced.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import lark
from celpy import celtypes
from celpy.evaluation import celstr

_WRAPPERS = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member", "primary"}
)
# Nodes that open a new nesting level in CEL terms (a call, brackets, parentheses, an operator).
_NESTING = frozenset(
    {"paren_expr", "list_lit", "map_lit", "ident_arg", "member_dot_arg", "member_index", "member_dot",
     "relation", "addition", "multiplication", "unary", "expr"}
)
_BINDERS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter", "transformList", "transformMap",
                      "bind"})


def subtrees(tree: lark.Tree) -> list[lark.Tree]:
    """Every subtree of ``tree``, children before parents: the order of lark's ``iter_subtrees``, which
    costs several times more (it guards against shared subtrees, which a parse tree never has). A compile
    walks the tree five times."""
    out: list[lark.Tree] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(child for child in node.children if isinstance(child, lark.Tree))
    out.reverse()  # pre-order reversed: every node after all of its descendants
    return out


def decode_string(token: lark.Token) -> celtypes.StringType:
    """A string literal's value, as cel-python's ``celstr`` gives it (raises ValueError as it does).
    ``celstr`` matches the literal one character at a time; a compile asks several times per literal."""
    return _decode_string(token.value)


# Most asks come from one compile (the checker, the estimator and the literal pass each decode a literal), so a
# small cache serves; small also bounds what a tenant's literals (up to an expression's 10 KiB each) can pin.
@functools.lru_cache(maxsize=512)
def _decode_string(text: str) -> celtypes.StringType:
    if "\\" not in text and "\n" not in text and text[:1] in ("'", '"'):
        # No escapes: the characters between the quotes. (``celstr`` drops a raw newline, which its
        # one-character pattern does not match: such literals still go through it, to agree with evaluation.)
        quote = 3 if text[:3] in ('"""', "'''") else 1
        return celtypes.StringType(text[quote:-quote])
    return celstr(lark.Token("STRING_LIT", text))


def unwrap(node):
    """Skip single-child wrapper nodes (`expr -> conditionalor -> ... -> primary`)."""
    while isinstance(node, lark.Tree) and node.data in _WRAPPERS and len(node.children) == 1:
        node = node.children[0]
    return node


def string_literal(node) -> str | None:
    """The value of `node` if it is a plain string literal, else None."""
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "literal":
        token = node.children[0]
        if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
            return str(decode_string(token))
    return None


def ident_name(node) -> str | None:
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def nesting_depth(tree: lark.Tree) -> int:
    """Max count of nesting constructs on any root-to-leaf path. Links of `&&`/`||` chains do
    not count: the evaluator walks those iteratively."""
    deepest = 0
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if node.data in _NESTING and (len(node.children) > 1 or node.data not in _WRAPPERS):
            depth += 1
        deepest = max(deepest, depth)
        for child in node.children:
            if isinstance(child, lark.Tree):
                stack.append((child, depth))
    return deepest


@dataclass(frozen=True)
class Footprint:
    """What an expression reads from `device`. `paths` are (kind, domain, name) with kind "a"
    (attribute) or "c" (capacity); `domains` are (kind, domain) read as a whole map."""

    driver: bool
    multi: bool
    paths: tuple[tuple[str, str, str], ...]
    domains: tuple[tuple[str, str], ...]
    domain_sets: bool


def _parents(nodes: list[lark.Tree]) -> dict[int, lark.Tree]:
    parents: dict[int, lark.Tree] = {}
    for node in nodes:
        for child in node.children:
            if isinstance(child, lark.Tree):
                parents[id(child)] = node
    return parents


def _consumer(node, parents):
    """The first non-wrapper ancestor of `node`, and whether `node` is its operand (child 0)."""
    child = node
    parent = parents.get(id(child))
    while parent is not None and parent.data in _WRAPPERS and len(parent.children) == 1:
        child = parent
        parent = parents.get(id(child))
    return parent, child


def _binds_device(nodes: list[lark.Tree]) -> bool:
    for node in nodes:
        if node.data != "member_dot_arg":
            continue
        if str(node.children[1]) in _BINDERS and len(node.children) > 2 and node.children[2] is not None:
            for arg in node.children[2].children[:2]:
                if ident_name(arg) == "device":
                    return True
    return False


def footprint(tree: lark.Tree, nodes: list[lark.Tree] | None = None) -> Footprint | None:
    """The parts of `device` the expression reads, or None if it cannot be determined (then the
    whole device content must be used as the memo key). ``nodes``: ``subtrees(tree)``, if the caller has it."""
    if nodes is None:
        nodes = subtrees(tree)
    if _binds_device(nodes):
        return None
    parents = _parents(nodes)
    driver = multi = domain_sets = False
    paths: set[tuple[str, str, str]] = set()
    domains: set[tuple[str, str]] = set()
    for ident in nodes:
        if ident.data != "ident" or str(ident.children[0]) != "device":
            continue
        parent, child = _consumer(ident, parents)
        if parent is None or parent.data != "member_dot" or parent.children[0] is not child:
            return None  # `device` used as a whole value
        field = str(parent.children[1])
        if field == "driver":
            driver = True
            continue
        if field == "allowMultipleAllocations":
            multi = True
            continue
        if field not in ("attributes", "capacity"):
            continue  # the type checker has already rejected unknown fields
        kind = field[0]
        outer, child = _consumer(parent, parents)
        domain = None
        if outer is not None and outer.children[0] is child:
            if outer.data == "member_index":
                domain = string_literal(outer.children[1])
            elif outer.data == "member_dot":
                domain = str(outer.children[1])
        if domain is None:
            if (outer is not None and outer.data == "relation" and len(outer.children) == 2
                    and outer.children[1] is child and outer.children[0].data == "relation_in"):
                domain_sets = True  # `"x" in device.attributes` needs only the domain names
                continue
            return None
        inner, child = _consumer(outer, parents)
        name = None
        if inner is not None and inner.children[0] is child:
            if inner.data == "member_index":
                name = string_literal(inner.children[1])
            elif inner.data == "member_dot":
                name = str(inner.children[1])
        if name is None:
            domains.add((kind, domain))
        else:
            paths.add((kind, domain, name))
            # A failed lookup's hint lists the domain's names, so they are part of the result.
            domains.add((kind + "#names", domain))
    return Footprint(driver, multi, tuple(sorted(paths)), tuple(sorted(domains)), domain_sets)


def _driver_atom(node) -> frozenset[str] | None:
    node = unwrap(node)
    while isinstance(node, lark.Tree) and node.data == "paren_expr":
        node = unwrap(node.children[0])
    if not isinstance(node, lark.Tree):
        return None
    if node.data in ("conditionaland", "conditionalor") and len(node.children) == 2:
        return drivers(node)
    if node.data != "relation" or len(node.children) != 2:
        return None
    op, right = node.children
    left = op.children[0]
    if op.data == "relation_eq":
        for a, b in ((left, right), (right, left)):
            if _is_device_driver(a):
                value = string_literal(b)
                if value is not None:
                    return frozenset({value})
    if op.data == "relation_in" and _is_device_driver(left):
        lst = unwrap(right)
        if isinstance(lst, lark.Tree) and lst.data == "list_lit" and lst.children:
            values = [string_literal(e) for e in lst.children[0].children]
            strings = [v for v in values if v is not None]
            if len(strings) == len(values):
                return frozenset(strings)
    return None


def _is_device_driver(node) -> bool:
    node = unwrap(node)
    return (
        isinstance(node, lark.Tree)
        and node.data == "member_dot"
        and str(node.children[1]) == "driver"
        and ident_name(node.children[0]) == "device"
    )


def drivers(tree) -> frozenset[str] | None:
    """Drivers outside which the expression is certainly false (CEL's `false && x` is false even
    when x is an error), or None when the expression does not restrict the driver."""
    node = unwrap(tree)
    while isinstance(node, lark.Tree) and node.data == "paren_expr":
        node = unwrap(node.children[0])
    if not isinstance(node, lark.Tree):
        return None
    if node.data in ("conditionaland", "conditionalor") and len(node.children) == 2:
        operands = []
        cur = node
        while cur.data == node.data and len(cur.children) == 2:
            operands.append(cur.children[1])
            cur = cur.children[0]
        operands.append(cur)
        sets = [_driver_atom(o) for o in operands]
        known = [s for s in sets if s is not None]
        if node.data == "conditionaland":
            if not known:
                return None
            result = known[0]
            for s in known[1:]:
                result = result & s
            return result
        if len(known) < len(sets):
            return None
        return frozenset().union(*known)
    return _driver_atom(node)
