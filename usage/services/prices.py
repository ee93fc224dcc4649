"""The price table: a price per device-hour of a product, on one cluster or on all (admins set it).

A cluster-specific price beats the product-wide one (``price_for``). Prices apply to a report when it is read:
changing a price re-prices past usage too, which is what a finance person comparing tariffs wants; an invoice
that must not change is exported (CSV) when it is issued.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import F

from draservice import audit
from draservice.errors import AlreadyExists, Invalid
from draservice.etag import check_if_match
from usage.models import Price

API_VERSION = "draservice.io/v1alpha1"
KIND = "Price"  # in the audit trail
CURRENCY = re.compile(r"^[A-Z]{3}$")  # ISO 4217 alphabetic code
MAX_PRICE = Decimal("1e12")


def table() -> dict[tuple[str, str], Price]:
    """Every price by (product, cluster); a handful of rows, read once per report."""
    return {(p.product, p.cluster): p for p in Price.objects.all()}


def price_for(prices: dict[tuple[str, str], Price], product: str, cluster: str) -> Price | None:
    return prices.get((product, cluster)) or prices.get((product, ""))


def parse(body) -> dict:
    """The fields of a price from a request body; Invalid naming each bad field."""
    if not isinstance(body, dict):
        raise Invalid([("", "must be an object")])
    errors: list[tuple[str, str]] = []
    product, cluster = body.get("product"), body.get("cluster") or ""
    if not isinstance(product, str) or not product.strip() or len(product) > 253:
        errors.append(("product", "Required value: a product name of at most 253 characters"))
    if not isinstance(cluster, str) or len(cluster) > 63:
        errors.append(("cluster", "must be a cluster name of at most 63 characters, or absent for every cluster"))
    currency = body.get("currency")
    if not isinstance(currency, str) or not CURRENCY.match(currency):
        errors.append(("currency", "Required value: an ISO 4217 code of three capital letters (EUR, USD)"))
    amount = _amount(body.get("pricePerDeviceHour"))
    if amount is None:
        errors.append(("pricePerDeviceHour", "Required value: a non-negative decimal number with at most 6 "
                                             "decimal places (a string or a number)"))
    if errors:
        raise Invalid(errors)
    return {"product": str(product).strip(), "cluster": cluster, "currency": currency, "per_device_hour": amount}


def _amount(raw) -> Decimal | None:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        value = Decimal(str(raw).strip())
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 0 or value >= MAX_PRICE or -value.as_tuple().exponent > 6:  # type: ignore[operator]
        return None
    return value


def create(body) -> Price:
    fields = parse(body)
    try:
        with transaction.atomic():
            price = Price.objects.create(**fields)
            audit.record(KIND, audit_name(price), audit.CREATE, None, audited(price))
            return price
    except IntegrityError:
        raise _exists(fields) from None


def replace(price_id: int, body, if_match: list[str] | None) -> Price:
    fields = parse(body)
    try:
        with transaction.atomic():
            price = Price.objects.select_for_update().get(pk=price_id)
            check_if_match(if_match, price.resource_version)
            before, old_name = audited(price), audit_name(price)
            for name, value in fields.items():
                setattr(price, name, value)
            price.resource_version = F("resource_version") + 1
            price.save()
            if audit_name(price) != old_name:  # another product or cluster: the old price is gone
                audit.record(KIND, old_name, audit.DELETE, before, None)
                audit.record(KIND, audit_name(price), audit.CREATE, None, audited(price))
            else:
                audit.record(KIND, old_name, audit.UPDATE, before, audited(price))
    except IntegrityError:
        raise _exists(fields) from None
    price.refresh_from_db()
    return price


def delete(price_id: int, if_match: list[str] | None) -> None:
    with transaction.atomic():
        price = Price.objects.select_for_update().get(pk=price_id)
        check_if_match(if_match, price.resource_version)
        audit.record(KIND, audit_name(price), audit.DELETE, audited(price), None)
        price.delete()


def audit_name(price: Price) -> str:
    """A price's name in the audit trail: its product, and ``@cluster`` for a cluster-specific one."""
    return f"{price.product}@{price.cluster}" if price.cluster else price.product


def audited(price: Price) -> dict:
    return {"spec": {"product": price.product, "cluster": price.cluster or None, "currency": price.currency,
                     "pricePerDeviceHour": format(Decimal(price.per_device_hour).normalize(), "f")}}


def _exists(fields: dict) -> AlreadyExists:
    where = f'cluster "{fields["cluster"]}"' if fields["cluster"] else "every cluster"
    return AlreadyExists([("product", f'a price for product "{fields["product"]}" on {where} already exists; '
                                   "replace it (PUT)")])


def render(price: Price) -> dict:
    return {"id": price.id, "product": price.product, "cluster": price.cluster or None, "currency": price.currency,
            "pricePerDeviceHour": format(price.per_device_hour.normalize(), "f"),
            "resourceVersion": str(price.resource_version),
            "createdAt": price.created_at.isoformat().replace("+00:00", "Z"),
            "updatedAt": price.updated_at.isoformat().replace("+00:00", "Z")}
