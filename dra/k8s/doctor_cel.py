"""The CEL half of the manifest doctor: selectors written for older DRA APIs (or blog posts) -> what v1 compiles.

Two mistakes account for nearly every selector copied from an article:

* names without a domain: ``device.attributes["memory"].quantity()``, ``device.attributes["productName"]``,
  ``device.capacity["memory"]``. In v1 the map is keyed by domain and the name is a field:
  ``device.attributes["gpu.nvidia.com"].productName``, ``device.capacity["gpu.nvidia.com"].memory``. Which
  domain (and whether a name is an attribute or a capacity) is a fact about the fleet, so it is looked up in a
  ``FleetVocabulary``; a name several domains publish is resolved by the driver the selector (or its class)
  names, else left alone and its candidates reported.
* ordering operators on quantities (``memory >= "40Gi"``, ``>= quantity("40Gi")``), which Kubernetes CEL does
  not define: ``memory.compareTo(quantity("40Gi")) >= 0``. Likewise versions with ``semver``.

The rewrite works on the parse tree of ``dra.cel`` (its nodes carry source positions) and splices replacement
text into the original, so everything the rules do not touch keeps its spelling. A fixed point of the rules is
reached in a few passes (an inner rewrite can enable an outer one); the result is compiled with
``dra.cel.compile_selector`` and any remaining error is reported, never hidden.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import lark
from celpy.celparser import CELParseError

from dra.cel import MAX_EXPRESSION_LENGTH, CELCompileError, compile_expression, compile_selector
from dra.cel.analysis import drivers as expression_drivers
from dra.cel.analysis import ident_name, string_literal, unwrap
from dra.cel.compiler import _parse as parse_cel  # the engine's own parser (thread-safe, shared)

__all__ = ["FixedSelector", "FleetVocabulary", "PublishedName", "WorkBudget", "class_drivers", "fix_selector"]

ATTRIBUTES, CAPACITY = "attributes", "capacity"
# Typed getters of the pre-v1 attribute API (``.quantity()``, ``.string()``...): v1 attributes are typed values.
_GETTERS = frozenset({"quantity", "string", "int", "bool", "version"})
# Methods on the domain map itself (CEL macros and size): their receiver's key is a domain.
_MAP_METHODS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter", "size"})
# Methods of quantities: a name they are called on wants to be a capacity when the fleet has both.
_QUANTITY_METHODS = frozenset({"add", "sub", "sign", "isInteger", "asInteger", "asApproximateFloat",
                               "isGreaterThan", "isLessThan", "compareTo"})
_WRAPPERS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
                       "unary", "member", "primary"})
_OPERATORS = {"relation_ge": ">=", "relation_gt": ">", "relation_le": "<=", "relation_lt": "<",
              "relation_eq": "==", "relation_ne": "!="}
_ORDERING = frozenset({">=", ">", "<=", "<"})
# A string literal that reads as a Kubernetes quantity with a unit ("40Gi", "1.5T"): the other side of a
# comparison with it wants a quantity.
_QUANTITY_TEXT = re.compile(r"^[+-]?\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)$")
_MAX_PASSES = 8
# Characters of CEL one request may have the doctor parse (about 2 s of parsing): a pass parses the whole
# expression, and a body (up to the upload limit) may hold thousands of 10 KiB selectors. Real manifests
# use a few hundred characters.
DEFAULT_BUDGET = 128 * 1024


@dataclass(frozen=True, order=True)
class PublishedName:
    """One attribute or capacity name a driver publishes: ``kind`` is "attributes" or "capacity"; ``type`` the
    attribute's type ("string", "int", "bool", "version", ...) or "quantity" for a capacity."""

    kind: str
    driver: str
    domain: str
    name: str
    type: str


class FleetVocabulary:
    """Which (domain, name) attributes and capacities each driver of a fleet publishes, and which drivers each
    DeviceClass selects. Build it from v1 ResourceSlices (``from_slices``) or from stored keys (``from_keys``)."""

    def __init__(self, names: Iterable[PublishedName] = (),
                 class_drivers: Mapping[str, Iterable[str]] | None = None):
        self.names = frozenset(names)
        self.class_drivers = {k: frozenset(v) for k, v in (class_drivers or {}).items()}
        self._by_name: dict[str, list[PublishedName]] = defaultdict(list)
        for name in sorted(self.names):
            self._by_name[name.name].append(name)
        self.domains = frozenset(n.domain for n in self.names)
        self._types = {(n.kind, n.domain, n.name): n.type for n in self.names}

    @classmethod
    def from_keys(cls, attributes: Iterable[tuple[str, str, str]], capacity: Iterable[tuple[str, str]],
                  class_drivers: Mapping[str, Iterable[str]] | None = None) -> FleetVocabulary:
        """``attributes``: (driver, key as published, type); ``capacity``: (driver, key). A key without a
        domain belongs to the driver's domain, as in a ResourceSlice."""
        names = [_published(ATTRIBUTES, driver, key, typ) for driver, key, typ in attributes]
        names += [_published(CAPACITY, driver, key, "quantity") for driver, key in capacity]
        return cls(names, class_drivers)

    @classmethod
    def from_slices(cls, slices: Iterable[dict], device_classes: Iterable[dict] = ()) -> FleetVocabulary:
        """From ResourceSlices (v1, or v1beta1/v1alpha3 with fields under ``basic``) and optionally v1 DeviceClasses
        (for the drivers each class selects)."""
        attributes: set[tuple[str, str, str]] = set()
        capacity: set[tuple[str, str]] = set()
        for obj in slices:
            spec = obj.get("spec") or {}
            driver = spec.get("driver") or ""
            for device in spec.get("devices") or []:
                device = device.get("basic") or device  # v1beta1 / v1alpha3 nest the fields under basic
                for key, value in (device.get("attributes") or {}).items():
                    attributes.add((driver, key, next(iter(value), "") if isinstance(value, dict) else ""))
                capacity.update((driver, key) for key in device.get("capacity") or {})
        return cls.from_keys(attributes, capacity, class_drivers(device_classes))

    def lookup(self, name: str) -> list[PublishedName]:
        return list(self._by_name.get(name, ()))

    def type_of(self, kind: str, domain: str, name: str) -> str | None:
        return self._types.get((kind, domain, name))

    def has(self, kind: str, domain: str, name: str) -> bool:
        return (kind, domain, name) in self._types


def _published(kind: str, driver: str, key: str, typ: str) -> PublishedName:
    domain, sep, name = key.rpartition("/")
    return PublishedName(kind, driver, domain if sep else driver, name, typ)


def class_drivers(device_classes: Iterable[dict]) -> dict[str, frozenset[str]]:
    """DeviceClass name -> the drivers its selectors restrict it to (classes that say nothing are left out)."""
    out: dict[str, frozenset[str]] = {}
    for obj in device_classes:
        name = (obj.get("metadata") or {}).get("name")
        found: frozenset[str] | None = None
        for selector in (obj.get("spec") or {}).get("selectors") or []:
            expression = ((selector or {}).get("cel") or {}).get("expression")
            try:
                drivers = compile_expression(expression).drivers
            except CELCompileError:
                continue
            if drivers is not None:
                found = drivers if found is None else found & drivers
        if name and found:
            out[name] = found
    return out


class WorkBudget:
    """What is left of the parsing the doctor may do for one request (``DEFAULT_BUDGET`` characters)."""

    def __init__(self, chars: int = DEFAULT_BUDGET):
        self.left = chars

    def spend(self, chars: int) -> bool:
        if chars > self.left:
            self.left = 0
            return False
        self.left -= chars
        return True


@dataclass
class FixedSelector:
    """``expression``: the rewritten text (the input when no rule applied); ``reasons``: why, one per rewrite;
    ``unresolved``: names it could not place, each with the candidates; ``error``: the compile error of the
    result, None when it compiles."""

    original: str
    expression: str
    reasons: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.expression != self.original


def fix_selector(expression: str, vocabulary: FleetVocabulary | None, drivers: Iterable[str] = (),
                 budget: WorkBudget | None = None) -> FixedSelector:
    """Rewrite one selector. ``drivers``: what its context says about the driver (the DeviceClass the request
    names, the class's other selectors); the expression's own ``device.driver ==`` clause is added to it.
    ``budget``: shared by the selectors of a request; when it is spent the selector is left as it is."""
    result = FixedSelector(expression, expression)
    hint = frozenset(drivers)
    if len(expression) > MAX_EXPRESSION_LENGTH:
        result.error = f"expression is longer than the limit of {MAX_EXPRESSION_LENGTH} characters"
        return result
    for _ in range(_MAX_PASSES):
        if budget is not None and not budget.spend(len(result.expression)):
            result.unresolved.append("the doctor's parsing budget for this request is spent; not looked at")
            break
        try:
            tree = parse_cel(result.expression)
        except CELParseError:
            quoted, bare = _quote_bare_quantities(result.expression)
            if not bare or (budget is not None and not budget.spend(len(quoted))) or not _parses(quoted):
                break  # a syntax error the doctor does not know: compile_selector below says where
            result.expression = quoted
            result.reasons.append(f"{', '.join(bare)}: a quantity is not a CEL literal; "
                                  f'quantity("{bare[0]}") is')
            continue
        own = expression_drivers(tree)
        rewriter = _Rewriter(result.expression, tree, vocabulary, hint | own if own else hint)
        edits = rewriter.edits()
        result.unresolved = rewriter.unresolved
        if not edits:
            break
        result.expression = _apply(result.expression, edits)
        result.reasons += [why for _, _, _, why in edits]
    try:
        compile_selector(result.expression)
    except CELCompileError as exc:
        result.error = str(exc.reason)
    return result


Edit = tuple[int, int, str, str]  # start, end, replacement, why
# A quantity written bare (``>= 40Gi``): digits then a Kubernetes suffix, not part of a longer word or number.
_BARE_QUANTITY = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))(?![\w.])")
_TRIPLE_QUOTES = ("'''", '"""')


def _quote_bare_quantities(text: str) -> tuple[str, list[str]]:
    """``40Gi`` -> ``quantity("40Gi")`` outside string literals, and the quantities found: a syntax error has no
    tree to work on, so this one rewrite is textual (and what it gives must still parse and compile)."""
    out, found, i = [], [], 0

    def quote(part: str) -> str:
        found.extend(_BARE_QUANTITY.findall(part))
        return _BARE_QUANTITY.sub(r'quantity("\1")', part)

    for start, end in _string_spans(text):
        out += [quote(text[i:start]), text[start:end]]
        i = end
    out.append(quote(text[i:]))
    return "".join(out), found


def _parses(text: str) -> bool:
    try:
        parse_cel(text)
    except CELParseError:
        return False
    return True


def _string_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the quoted literals: single, double and triple quotes, backslash escapes."""
    spans, i = [], 0
    while i < len(text):
        if text[i] not in "'\"":
            i += 1
            continue
        quote = text[i:i + 3] if text[i:i + 3] in _TRIPLE_QUOTES else text[i]
        j = i + len(quote)
        while j < len(text) and not text.startswith(quote, j):
            j += 2 if text[j] == "\\" else 1
        end = min(j + len(quote), len(text))
        spans.append((i, end))
        i = end
    return spans


def _apply(text: str, edits: list[Edit]) -> str:
    for start, end, replacement, _ in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _span(node) -> tuple[int, int]:
    return node.meta.start_pos, node.meta.end_pos


class _Rewriter:
    """One pass over one parse tree: the edits the rules propose, innermost first and never overlapping (an
    outer rule sees the inner result on the next pass)."""

    def __init__(self, text: str, tree: lark.Tree, vocabulary: FleetVocabulary | None, drivers: frozenset[str]):
        self.text, self.tree, self.vocabulary, self.drivers = text, tree, vocabulary, drivers
        self.parents: dict[int, lark.Tree] = {}
        for node in tree.iter_subtrees():
            for child in node.children:
                if isinstance(child, lark.Tree):
                    self.parents[id(child)] = node
        self.unresolved: list[str] = []

    def edits(self) -> list[Edit]:
        proposed: list[Edit] = []
        for node in self.tree.iter_subtrees():
            if node.data == "member_index":
                proposed += self._name_edit(node)
            elif node.data == "member_dot_arg":
                proposed += self._getter_edit(node)
            elif node.data == "member_dot":
                proposed += self._kind_edit(node)
            elif node.data == "relation" and len(node.children) == 2:
                proposed += self._comparison_edit(node)
        taken: list[Edit] = []
        for edit in sorted(proposed, key=lambda e: e[1] - e[0]):
            if all(edit[1] <= t[0] or edit[0] >= t[1] for t in taken):
                taken.append(edit)
        return taken

    def parent(self, node) -> lark.Tree | None:
        """The nearest ancestor that is not a single-child wrapper."""
        parent = self.parents.get(id(node))
        while parent is not None and parent.data in _WRAPPERS and len(parent.children) == 1:
            parent = self.parents.get(id(parent))
        return parent

    def src(self, node) -> str:
        start, end = _span(node)
        return self.text[start:end]

    # --- rule 1: device.attributes["name"] / ["domain/name"] used as a value -----------------------------------

    def _name_edit(self, node: lark.Tree) -> list[Edit]:
        kind = _device_map(node.children[0])
        key = string_literal(node.children[1])
        if kind is None or key is None:
            return []
        parent = self.parent(node)
        getter = method = None
        if parent is not None and parent.data == "member_dot_arg" and unwrap(parent.children[0]) is node:
            method = str(parent.children[1])
            if method in _MAP_METHODS:
                return []  # a macro or function over the domain map: the key is a domain
            if method in _GETTERS and len(parent.children) == 2:
                getter = method
            # else a method of a value (startsWith, matches, isGreaterThan...): the key is a name
        elif parent is not None and parent.data in ("member_dot", "member_index") \
                and unwrap(parent.children[0]) is node:
            return []  # device.attributes["domain"].name: already v1
        domain, sep, name = key.rpartition("/")
        if not sep and (not _is_identifier(key) or (self.vocabulary and key in self.vocabulary.domains)):
            return []
        wants_quantity = getter == "quantity" or method in _QUANTITY_METHODS \
            or self._compared_with_quantity(parent if getter else node)
        target = self._resolve(kind, domain if sep else None, name, wants_quantity)
        if target is None:
            return []
        access = f"device.{target.kind}[{json.dumps(target.domain)}].{name}"
        what = f'{kind}["{key}"]' + (f".{getter}()" if getter else "")
        noun = "capacity" if target.kind == CAPACITY else "attribute"
        if target.type == "?":
            source = f"names without a domain belong to the driver's domain, {target.domain!r} (the driver the " \
                     "selector or its class names)"
        elif target.type:
            source = f"the fleet publishes {name!r} as {'a' if noun == 'capacity' else 'an'} {noun} of domain " \
                     f"{target.domain!r}"
        else:
            source = f"{key!r} is domain/name"
        why = f"device.{what}: v1 keys the {target.kind} map by domain and names the {noun} as a field; {source}"
        if getter is None:
            return [(*_span(node), access, why)]
        if target.kind == ATTRIBUTES and getter == "quantity":
            access = f"quantity({access})"  # a quantity published as a string attribute
        return [(*_span(parent), access, why + f"; v1 values are typed, so .{getter}() goes")]

    def _kind_edit(self, node: lark.Tree) -> list[Edit]:
        """``device.attributes["d"].memory`` where the fleet publishes memory of d only as a capacity (or the other
        way round): it compiles, and selects nothing."""
        kind = _qualified(node)
        if kind is None or self.vocabulary is None:
            return []
        index = unwrap(node.children[0])
        domain, name = string_literal(index.children[1]) or "", str(node.children[1])
        other = CAPACITY if kind == ATTRIBUTES else ATTRIBUTES
        if self.vocabulary.has(kind, domain, name) or not self.vocabulary.has(other, domain, name):
            return []
        start, end = _span(unwrap(index.children[0]))
        published = "a capacity, not an attribute" if other == CAPACITY else "an attribute, not a capacity"
        why = f"device.{kind}[{json.dumps(domain)}].{name}: the fleet publishes {name!r} of {domain!r} as {published}"
        return [(start, end, f"device.{other}", why)]

    def _getter_edit(self, node: lark.Tree) -> list[Edit]:
        """``device.capacity["d"].memory.quantity()``: a typed getter on an already qualified v1 value."""
        if len(node.children) != 2 or str(node.children[1]) not in _GETTERS:
            return []
        inner = unwrap(node.children[0])
        if not (isinstance(inner, lark.Tree) and inner.data == "member_dot" and _qualified(inner) is not None):
            return []
        getter = str(node.children[1])
        kind = _qualified(inner)
        replacement = self.src(inner)
        if kind == ATTRIBUTES and getter == "quantity":
            replacement = f"quantity({replacement})"
        return [(*_span(node), replacement, f"{self.src(inner)}.{getter}(): v1 values are typed; no getter")]

    def _resolve(self, written: str, domain: str | None, name: str, wants_quantity: bool) -> PublishedName | None:
        vocabulary = self.vocabulary
        if domain is not None:  # "domain/name": only the kind may be wrong
            kind = written
            if vocabulary is not None:
                other = CAPACITY if written == ATTRIBUTES else ATTRIBUTES
                if not vocabulary.has(written, domain, name) and vocabulary.has(other, domain, name):
                    kind = other
            known = vocabulary.type_of(kind, domain, name) if vocabulary is not None else None
            return PublishedName(kind, domain, domain, name, known or "")
        candidates = vocabulary.lookup(name) if vocabulary is not None else []
        if not candidates:
            if len(self.drivers) == 1:  # no fleet knowledge: names without a domain are the driver's
                driver = next(iter(self.drivers))
                return PublishedName(CAPACITY if wants_quantity else written, driver, driver, name, "?")
            where = "no driver of the fleet publishes it" if vocabulary is not None else "no fleet to look it up in"
            self.unresolved.append(f"{name!r}: {where}" + ("" if self.drivers else " and the selector names no driver"))
            return None
        preferred = CAPACITY if wants_quantity else written
        candidates = [c for c in candidates if c.kind == preferred] or candidates
        if self.drivers:
            candidates = [c for c in candidates if c.driver in self.drivers] or candidates
        places = sorted({(c.kind, c.domain) for c in candidates})
        if len(places) == 1:
            return candidates[0]
        listed = ", ".join(f'device.{k}["{d}"].{name}' for k, d in places)
        self.unresolved.append(f"{name!r} is published by several domains ({listed}); add "
                               f'device.driver == "<driver>" to the selector or write one of them')
        return None

    def _compared_with_quantity(self, node) -> bool:
        other = self._relation_other_side(node)
        if other is None:
            return False
        literal = string_literal(other)
        return _call_name(other) == "quantity" or (literal is not None and bool(_QUANTITY_TEXT.match(literal)))

    def _relation_other_side(self, node):
        parent = self.parent(node)
        if parent is not None and parent.data in _OPERATORS:
            relation = self.parent(parent)
            return relation.children[1] if relation is not None and relation.data == "relation" else None
        if parent is not None and parent.data == "relation" and len(parent.children) == 2:
            return unwrap(parent.children[0]).children[0] if unwrap(parent.children[1]) is node else None
        return None

    # --- rule 2: ordering (and equality with a literal) on quantities and versions ------------------------------

    def _comparison_edit(self, node: lark.Tree) -> list[Edit]:
        op_node = node.children[0]
        if not isinstance(op_node, lark.Tree) or op_node.data not in _OPERATORS:
            return []
        op = _OPERATORS[op_node.data]
        left, right = unwrap(op_node.children[0]), unwrap(node.children[1])
        kinds = (self._operand(left), self._operand(right))
        typed = {k for k in kinds if k in ("quantity", "semver")}
        if len(typed) != 1:
            return []
        library = typed.pop()
        if op not in _ORDERING and "literal" not in kinds:
            return []  # == between two quantities is defined
        if "literal" in kinds and op not in _ORDERING and library == "semver":
            return []
        left_text, right_text = (self._as(library, n, k) for n, k in ((left, kinds[0]), (right, kinds[1])))
        if left_text is None or right_text is None:
            return []
        replacement = f"{left_text}.compareTo({right_text}) {op} 0"
        why = (f"{self.src(node)}: {op} is not defined on {library} values in Kubernetes CEL; "
               f"compareTo(...) {op} 0 is")
        return [(*_span(node), replacement, why)]

    def _operand(self, node) -> str | None:
        """ "quantity" / "semver" for a typed value, "literal" for a string or number literal, else None."""
        if not isinstance(node, lark.Tree):
            return None
        if _call_name(node) in ("quantity", "semver"):
            return _call_name(node)
        if node.data == "member_dot":
            kind = _qualified(node)
            if kind == CAPACITY:
                return "quantity"
            if kind == ATTRIBUTES and self.vocabulary is not None:
                domain = string_literal(unwrap(node.children[0]).children[1]) or ""
                if self.vocabulary.type_of(ATTRIBUTES, domain, str(node.children[1])) == "version":
                    return "semver"
        if node.data == "literal" and isinstance(node.children[0], lark.Token) \
                and node.children[0].type in ("STRING_LIT", "INT_LIT", "UINT_LIT", "FLOAT_LIT"):
            return "literal"
        return None

    def _as(self, library: str, node, kind: str | None) -> str | None:
        text = self.src(node)
        if kind == library:
            return text if node.data in ("member_dot", "ident_arg", "paren_expr") else f"({text})"
        if kind == "literal":
            value = string_literal(node)
            return f"{library}({json.dumps(value if value is not None else text.rstrip('uU'))})"
        return None


def _device_map(node) -> str | None:
    """ "attributes" / "capacity" when ``node`` is ``device.attributes`` / ``device.capacity``."""
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "member_dot" and ident_name(node.children[0]) == "device":
        name = str(node.children[1])
        return name if name in (ATTRIBUTES, CAPACITY) else None
    return None


def _qualified(node) -> str | None:
    """The kind when ``node`` is ``device.<kind>["domain"].name``."""
    inner = unwrap(node.children[0])
    if isinstance(inner, lark.Tree) and inner.data == "member_index" and string_literal(inner.children[1]):
        return _device_map(inner.children[0])
    return None


def _call_name(node) -> str | None:
    node = unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident_arg":
        return str(node.children[0])
    return None


def _is_identifier(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text))
