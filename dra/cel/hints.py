"""Plain-English hints for the mistakes people make when porting or writing selectors."""
from __future__ import annotations

_ORDERING_OPS = {"_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
_COMPARE_SUFFIX = {"<": "< 0", "<=": "<= 0", ">": "> 0", ">=": ">= 0"}


def ordering_on_library_type(op: str, type_name: str, left_text: str | None = None,
                             right_text: str | None = None) -> str:
    """`q >= quantity("40Gi")` is not defined for quantities or versions in Kubernetes CEL."""
    symbol = _ORDERING_OPS.get(op, op)
    left = left_text or (
        "device.capacity[...].memory" if type_name == "Quantity" else "device.attributes[...].driverVersion")
    right = right_text or ('quantity("40Gi")' if type_name == "Quantity" else 'semver("1.2.3")')
    method = "isGreaterThan" if symbol in (">", ">=") else "isLessThan"
    return (
        f"comparison operators such as {symbol} are not defined on {type_name} values in Kubernetes CEL; "
        f"write `{left}.compareTo({right}) {_COMPARE_SUFFIX.get(symbol, '>= 0')}` "
        f"or `{left}.{method}({right})`"
        + (" (isGreaterThan/isLessThan are strict)" if symbol in (">=", "<=") else "")
    )


def runtime_hint(info: dict | None) -> str | None:
    """Hint for a failed lookup, from what the evaluator knew at the point of failure."""
    if not info:
        return None
    if "missing_domain" in info:
        kind = info["kind"]
        available = info["available"]
        listed = ", ".join(f'"{d}"' for d in available) if available else "none"
        example = available[0] if available else "<domain>"
        return (
            f'the device has no {kind} domain "{info["missing_domain"]}"; its {kind} domains are: {listed}. '
            f'Write device.{kind}["<domain>"].<name>, e.g. device.{kind}["{example}"].{info["name"]}; '
            "names published without a domain belong to the driver's domain"
        )
    if "domain" in info:
        names = ", ".join(info["names"]) or "none"
        return (
            f'domain "{info["domain"]}" of this device has no '
            f'{"attribute" if info["kind"] == "attributes" else "capacity"} '
            f'"{info["name"]}" (it has: {names}); guard optional ones with '
            f'has(device.{info["kind"]}["{info["domain"]}"].{info["name"]})'
        )
    if "operator" in info and any(t in ("Quantity", "Semver") for t in info["types"]):
        t = "Quantity" if "Quantity" in info["types"] else "Semver"
        if info["operator"] in _ORDERING_OPS:
            return ordering_on_library_type(info["operator"], t)
    return None
