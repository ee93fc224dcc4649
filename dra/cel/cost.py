"""The cost model of DRA selectors: cel-go's cost units, for the estimate and for the run.

Kubernetes refuses to store a DRA selector whose estimated cost exceeds
`CELSelectorExpressionMaxCost` (1,000,000): k8s.io/dynamic-resource-allocation/cel estimates it
with cel-go's `checker.Cost` over the declared maximum sizes of a device (a driver name has at
most 63 characters, a device at most 32 attributes, an attribute string at most 64 characters)
and the Kubernetes libraries' call costs (apiserver/pkg/cel/library/cost.go), and stops an
evaluation whose actual cost exceeds the same number. `estimator.py` ports the estimator to
cel-python's parse tree unit for unit (the 37 upstream table tests give the same numbers); this
module holds the units, the declared sizes, and what each operation costs at run time
(interpreter/runtimecost.go), which the evaluator charges before doing the work.

The units, as in cel-go: reading a variable or a field costs 1, a constant 0, a call 1 unless
it traverses strings (0.1 per character) or runs a regular expression (0.25 per pattern
character per 10 text characters), building a list 10 and a map 30; a comprehension costs its
range's maximum size times the cost of one step, so nested comprehensions multiply.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from .quantity import Quantity
from .semver import Semver

# Upstream's resourceapi.CELSelectorExpressionMaxCost: the API server refuses a selector whose
# estimate exceeds it and stops an evaluation whose actual cost does.
UPSTREAM_MAX_SELECTOR_COST = 1_000_000
# Ours, for both, is a tenth of that. cel-go spends 50-100 ns per unit, so upstream's limit is
# about 0.1 s of work; cel-python spends 2-5 us per unit (measured on upstream's "expensive" case,
# issue 12's selector, regex, quantity and semver loops), so 1,000,000 units would hold a worker
# for 2-5 s per evaluation. At 100,000 an evaluation stops after 0.2-0.5 s, and real selectors
# (the 59 of the fixture and upstream's table: at most 196) keep a 500x margin.
# Objects a cluster pushes are held to upstream's own test instead (compiler.compile_selector).
MAX_SELECTOR_COST = 100_000
# What all evaluations of one request (a cel/match, a simulation, an explain?refresh) may cost
# together: ten evaluations at the limit, 2-5 s of cel-python at worst. Real requests use a few
# thousand units: devices that look alike to an expression share one evaluation.
REQUEST_COST_BUDGET = 10 * MAX_SELECTOR_COST
UNBOUNDED = 2**64 - 1  # cel-go saturates at math.MaxUint64: "unknown", in practice
STRING_TRAVERSAL = 0.1  # common.StringTraversalCostFactor
REGEX_LENGTH = 0.25  # common.RegexStringLengthCostFactor
LIST_CREATE = 10  # common.ListCreateBaseCost
MAP_CREATE = 30  # common.MapCreateBaseCost

# Declared maximum sizes of what `device` holds (k8s.io/api/resource/v1).
DRIVER_NAME_MAX = 63
DOMAIN_MAX = 63
ID_MAX = 32
ATTRIBUTE_VALUE_MAX = 64
ATTRIBUTES_PER_DEVICE = 32



def add(a: int, b: int) -> int:
    return min(a + b, UNBOUNDED)


def mul(a: int, b: int) -> int:
    return min(a * b, UNBOUNDED)


def factor(size: int, per_unit: float) -> int:
    """cel-go's MultiplyByCostFactor: the product rounded up, saturating."""
    return min(math.ceil(float(size) * per_unit), UNBOUNDED)


# --- declared sizes of the `device` variable ----------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Decl:
    max: int
    fields: tuple = ()  # (name, _Decl) pairs of an object type
    key: _Decl | None = None
    elem: _Decl | None = None


_ATTRIBUTE = _Decl(ATTRIBUTE_VALUE_MAX)
_ATTRIBUTES = _Decl(ATTRIBUTES_PER_DEVICE, key=_Decl(DOMAIN_MAX),
                    elem=_Decl(ATTRIBUTES_PER_DEVICE, key=_Decl(ID_MAX), elem=_ATTRIBUTE))
# Quantities are a simple type without a declared size (MaxElements 0).
_CAPACITY = _Decl(ATTRIBUTES_PER_DEVICE, key=_Decl(DOMAIN_MAX),
                  elem=_Decl(ATTRIBUTES_PER_DEVICE, key=_Decl(ID_MAX), elem=_Decl(0)))
# allowMultipleAllocations is a bool "with a known cost" of size 1 upstream.
_DEVICE = _Decl(0, fields=(("driver", _Decl(DRIVER_NAME_MAX)), ("allowMultipleAllocations", _Decl(1)),
                           ("attributes", _ATTRIBUTES), ("capacity", _CAPACITY)))


def declared_size(path: tuple) -> int | None:
    """Upstream's sizeEstimator: the declared maximum size at a field path below `device`."""
    if not path or path[0] != "device":
        return None
    node = _DEVICE
    for name in path[1:]:
        step: _Decl | None
        if name in ("@items", "@values"):
            step = node.elem
        elif name == "@keys":
            step = node.key
        else:
            step = dict(node.fields).get(name)
            if step is None and node.elem is _ATTRIBUTE:
                # Every value of an attribute map has the attribute's maximum size, whatever its name.
                step = _ATTRIBUTE
        if step is None:
            return None
        node = step
    return node.max


COST_HINT = ("nested comprehensions multiply their cost (a list of n items inside another costs n*n steps): "
             "iterate over fewer or smaller lists, or compare attributes directly")


def budget_reason(max_cost: int, limit: int = MAX_SELECTOR_COST) -> str:
    """Upstream's Forbidden reason ("too complex, exceeds cost limit"), with the estimate and the
    budget worded as CRD validation rules word it."""
    ratio = max_cost / limit
    times = f"{ratio:.1f}x" if ratio < 1000 else f"more than {int(ratio):,}x"
    # cel-go's "unknown size" is 2**64-1, scaled by cost factors; nothing real comes near 2**60.
    estimate_text = "unbounded: a size it depends on is unknown" if max_cost >= 2**60 else f"{max_cost:,}"
    return (f"too complex, exceeds cost limit: estimated rule cost exceeds budget by factor of {times} "
            f"(estimated cost {estimate_text}, budget {limit:,})")




# --- run time: the cost of one operation on actual values -----------------------------------------
# Charged *before* the work, so a single oversized operation cannot run (or allocate) first. Where
# cel-python does more work than cel-go for the same operation (copying on concatenation, walking
# nested containers to compare them, growing strings with replace) that work is charged too, so a
# run can cost somewhat more than cel-go would; it never escapes the budget.

def actual_size(value: Any) -> int:
    """cel-go's actualSize: length of strings, bytes, lists and maps; 1 for anything else."""
    if isinstance(value, (str, bytes, list, dict)):
        return len(value)
    return 1


def _text(value: Any) -> TypeGuard[str | bytes]:
    return isinstance(value, (str, bytes))


def _deep_size(value: Any, cap: int) -> int:
    """Elements of a nested list/map (keys and values), counting at most `cap`."""
    total, stack = 0, [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, list):
            total += len(v)
            stack.extend(x for x in v if isinstance(x, (list, dict)))
        elif isinstance(v, dict):
            total += 2 * len(v)
            stack.extend(x for x in v.values() if isinstance(x, (list, dict)))
    return total


def equality_cost(a: Any, b: Any, cap: int = UNBOUNDED) -> int:
    if isinstance(a, (Quantity, Semver)):
        return 1
    if isinstance(a, (list, dict)) and isinstance(b, (list, dict)):
        return factor(min(_deep_size(a, cap), _deep_size(b, cap)), STRING_TRAVERSAL)
    return factor(min(actual_size(a), actual_size(b)), STRING_TRAVERSAL)


def ordering_cost(a: Any, b: Any) -> int:
    if _text(a) and _text(b):
        return factor(min(len(a), len(b)), STRING_TRAVERSAL)
    return 1


def in_cost(item: Any, container: Any, cap: int = UNBOUNDED) -> int:
    if isinstance(container, list):
        if isinstance(item, (list, dict)):
            return mul(len(container), factor(_deep_size(item, cap), STRING_TRAVERSAL))
        return len(container)
    return 1


def concat_cost(a: Any, b: Any) -> int:
    """`+`: strings and bytes as cel-go; lists too, since cel-python copies both operands."""
    if (_text(a) and _text(b)) or (isinstance(a, list) and isinstance(b, list)):
        return max(1, factor(len(a) + len(b), STRING_TRAVERSAL))
    return 1


def _traversal(value: Any) -> int:
    """Kubernetes' traversalCost for the list functions (isSorted, sum, min, max, indexOf)."""
    if _text(value):
        return int(len(value) * STRING_TRAVERSAL)
    if isinstance(value, list):
        return sum(_traversal(v) for v in value)
    if isinstance(value, dict):
        return sum(_traversal(k) + _traversal(v) for k, v in value.items())
    return 1


def _replace_cost(s: Any, old: Any, new: Any) -> int:
    if not (_text(s) and _text(old) and _text(new)):
        return 1
    grows = max(0, len(new) - len(old))
    count = len(s) + 1 if not old else len(s) // len(old)
    return add(factor(len(s), 2 * STRING_TRAVERSAL), factor(count * grows, STRING_TRAVERSAL))


def _join_cost(items: Any, sep: Any) -> int:
    if not isinstance(items, list):
        return 1
    total = sum(len(x) for x in items if _text(x))
    if _text(sep) and items:
        total += len(sep) * (len(items) - 1)
    return factor(total, STRING_TRAVERSAL)


_BY_FIRST_ARGUMENT = {  # name -> cost per character of the first argument (the receiver of a method)
    "lowerAscii": STRING_TRAVERSAL, "upperAscii": STRING_TRAVERSAL, "substring": STRING_TRAVERSAL,
    "trim": STRING_TRAVERSAL, "split": 2 * STRING_TRAVERSAL, "quantity": STRING_TRAVERSAL,
    "isQuantity": STRING_TRAVERSAL, "semver": STRING_TRAVERSAL, "isSemver": STRING_TRAVERSAL,
    "strings_quote": STRING_TRAVERSAL,
}


def call_cost(name: str, args: list) -> int:
    """The run-time cost of one call; `args` has the receiver first for a method."""
    first = args[0] if args else None
    if name in _BY_FIRST_ARGUMENT:
        return factor(len(first), _BY_FIRST_ARGUMENT[name]) if _text(first) else 1
    if (name == "bytes" and isinstance(first, str)) or (name == "string" and isinstance(first, bytes)):
        return factor(len(first), STRING_TRAVERSAL)
    if name == "join":
        return _join_cost(first, args[1] if len(args) > 1 else None)
    if len(args) < 2:
        return _traversal(first) if name in ("isSorted", "sum", "min", "max") else 1
    second = args[1]
    if name == "contains" and _text(first) and _text(second):
        return mul(factor(len(first), STRING_TRAVERSAL), factor(len(second), STRING_TRAVERSAL))
    if name in ("startsWith", "endsWith") and _text(second):
        return factor(len(second), STRING_TRAVERSAL)
    if name in ("matches", "find", "findAll") and _text(first) and _text(second):
        return mul(factor(len(first) + 1, STRING_TRAVERSAL), factor(len(second), REGEX_LENGTH))
    if name in ("indexOf", "lastIndexOf"):
        return _traversal(first)
    if name == "replace" and len(args) >= 3:
        return _replace_cost(first, second, args[2])
    if name in ("sets_contains", "sets_intersects", "sets_equivalent"):
        pairs = mul(actual_size(first), actual_size(second))
        return add(mul(pairs, 2 if name == "sets_equivalent" else 1), 1)
    return 1
