"""Global search (the header's box): claims, nodes, devices and namespaces by name, a device also by its UUID.

Every lookup is an indexed equality or a prefix match on a small table, and each kind is cut at ``LIMIT``
rows, so a search costs a handful of short index scans whatever the fleet's size:

* claims: ``namespace/name`` (the (namespace, name) unique index; a name prefix within that namespace), or a
  bare name in every readable namespace (``namespace IN (...) AND name = ...``, the same index);
* namespaces and nodes: prefix of the name (a few thousand rows at most);
* devices: exact name (``inventory_device_name``) or the ``<driver>/uuid`` attribute (the GIN index on
  ``attribute_index``, one containment test per driver).

Tenancy: ``namespaces`` is the caller's readable set, from the same rule the API applies
(``draservice.permissions.readable_namespaces``); None means every namespace. Claims and namespaces outside it
are never looked up. Nodes and devices are inventory, which every signed-in caller may read.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Q

from claims.models import Namespace, ResourceClaim
from claims.services.figures.sql import is_postgres
from inventory.models import Device, Node, Pool

LIMIT = 20
MAX_QUERY = 200


@dataclass
class Results:
    q: str
    claims: list = field(default_factory=list)
    namespaces: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    devices: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.claims) + len(self.namespaces) + len(self.nodes) + len(self.devices)


def _claims(q: str, readable_ns: Q) -> list:
    qs = ResourceClaim.objects.select_related("namespace").only(
        "name", "phase", "cluster", "node", "namespace__name").order_by("namespace__name", "name")
    if "/" in q:
        ns, _, name = q.partition("/")
        qs = qs.filter(readable_ns, namespace__name=ns)
        return list(qs.filter(name__startswith=name)[:LIMIT]) if name else list(qs[:LIMIT])
    return list(qs.filter(readable_ns, name=q)[:LIMIT])


def _devices(q: str) -> list:
    drivers = sorted(set(Pool.objects.values_list("driver", flat=True).distinct()))
    by_uuid = Q()
    for driver in drivers:
        # PostgreSQL: containment, which the GIN index serves. SQLite has no JSON containment: a key lookup.
        key = f"{driver}/uuid"
        by_uuid |= Q(attribute_index__contains={key: q}) if is_postgres() else Q(**{f"attribute_index__{key}": q})
    match = Q(name=q) | by_uuid if drivers else Q(name=q)
    rows = (Device.objects.filter(match).select_related("cluster")
            .only("name", "driver", "pool_name", "node_name", "attribute_index", "cluster__name")
            .order_by("cluster__name", "driver", "pool_name", "name")[:LIMIT])
    out = []
    for d in rows:
        uuid = next((v for k, v in (d.attribute_index or {}).items() if k.endswith("/uuid")), "")
        out.append({"device": d, "uuid": uuid, "by_uuid": d.name != q})
    return out


def search(q: str, namespaces: frozenset[str] | None) -> Results:
    """``namespaces``: the names the caller may read, or None for all (see the module docstring)."""
    q = (q or "").strip()[:MAX_QUERY]
    res = Results(q=q)
    if not q:
        return res
    readable_ns = Q() if namespaces is None else Q(namespace__name__in=sorted(namespaces))
    res.claims = _claims(q, readable_ns)
    ns_qs = Namespace.objects.filter(name__startswith=q.split("/")[0]).order_by("name")
    if namespaces is not None:
        ns_qs = ns_qs.filter(name__in=sorted(namespaces))
    res.namespaces = list(ns_qs[:LIMIT])
    res.nodes = list(Node.objects.filter(name__startswith=q).select_related("cluster")
                     .only("name", "cluster__name").order_by("name", "cluster__name")[:LIMIT])
    res.devices = _devices(q)
    return res
