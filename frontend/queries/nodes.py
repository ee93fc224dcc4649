"""One node (or one device) in full: its devices, who holds them, and how partitioned GPUs are cut up.

A node has at most a few hundred devices (an 8-GPU MIG node publishes 200 partition placements), so here we
do load rows into Python and lay them out; fleet-wide pages never call this.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

from django.db.models import Q
from django.urls import reverse

from claims.models import DeviceAllocation, Reservation
from claims.services.figures.accelerators import accelerator_sql
from claims.services.figures.units import BLOCKING_EFFECTS
from dra.engine.quantity import Amount, QuantityError, parse_quantity
from frontend.templatetags.dash import attribute_value, format_quantity
from inventory.models import Cluster, Device, DeviceTaintRule, Pool, ResourceSlice
from inventory.services.selectors import BASE_FROM
from inventory.sql import fetch_dicts

# NVIDIA's partitionable GPUs publish one counter per memory slice (KEP-4815); the layout is drawn from them.
MEMORY_SLICE = re.compile(r"^memory-slice-(\d+)$")


def qty(value) -> Amount:
    if isinstance(value, dict):
        value = value.get("value")
    try:
        return parse_quantity(str(value))
    except (QuantityError, TypeError, ValueError):
        return Fraction(0)


@dataclass
class Holder:
    """One claim holding a device (or one share of it)."""

    claim_id: int
    namespace: str
    name: str
    phase: str
    request: str = ""
    share_id: str = ""
    consumed: dict = field(default_factory=dict)
    consumers: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return reverse("frontend:claim", args=[self.namespace, self.name])

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class DeviceView:
    device: Device
    cluster: str
    state: str = "free"  # free | allocated | shared | tainted | stale
    holders: list[Holder] = field(default_factory=list)
    taints: list[dict] = field(default_factory=list)  # own taints and those from DeviceTaintRules
    pool_state: str = "complete"

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def attrs(self) -> dict:
        return {k: attribute_value(v) for k, v in (self.device.attributes or {}).items()}

    @property
    def product(self) -> str:
        a = self.device.attributes or {}
        return attribute_value(a.get("productName")) or attribute_value(a.get("model")) or ""

    @property
    def profile(self) -> str:
        return attribute_value((self.device.attributes or {}).get("profile")) or ""

    @property
    def memory(self) -> str:
        mem = (self.device.capacity or {}).get("memory")
        return format_quantity(mem.get("value")) if isinstance(mem, dict) else ""

    @property
    def claims(self) -> list[Holder]:
        seen, out = set(), []
        for h in self.holders:
            if h.claim_id not in seen:
                seen.add(h.claim_id)
                out.append(h)
        return out

    @property
    def url(self) -> str:
        d = self.device
        return reverse("frontend:device", args=[self.cluster, d.driver, d.pool_name, d.name])

    def consumption(self, counter_set: str) -> dict[str, Fraction]:
        out: dict[str, Fraction] = {}
        for entry in self.device.consumes_counters or []:
            if entry.get("counterSet") == counter_set:
                for name, value in (entry.get("counters") or {}).items():
                    out[name] = out.get(name, Fraction(0)) + qty(value)
        return out


@dataclass
class Block:
    """A run of memory slices in a partition layout: one allocated partition, or one free slice."""

    start: int
    span: int
    state: str
    label: str = ""
    title: str = ""
    url: str = ""


@dataclass
class CounterSetView:
    """A partitionable GPU: its counter set, the partitions in use laid out over its memory slices."""

    driver: str
    pool: str
    name: str
    totals: dict[str, Amount]
    members: list[DeviceView] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    used: dict[str, Fraction] = field(default_factory=dict)
    fits: list[tuple[str, int]] = field(default_factory=list)  # (profile, placements still possible)
    whole: DeviceView | None = None  # the whole-GPU device (Hopper and newer), if published

    @property
    def slice_count(self) -> int:
        return sum(1 for n in self.totals if MEMORY_SLICE.match(n))

    @property
    def in_use(self) -> list[DeviceView]:
        return [m for m in self.members if m.holders]

    @property
    def product(self) -> str:
        return next((m.product for m in self.members if m.product), "")

    @property
    def counter_rows(self) -> list[dict]:
        rows = []
        for name, total in self.totals.items():
            if MEMORY_SLICE.match(name):
                continue
            used = self.used.get(name, Fraction(0))
            shown_total = format_quantity(_fmt(total, name))
            rows.append({"name": name, "used": format_quantity(_fmt(used, name)), "total": shown_total,
                         "pct": int(100 * used / total) if total else 0})
        return rows

    @property
    def state(self) -> str:
        if not self.in_use:
            return "free"
        return "shared" if len({h.claim_id for m in self.in_use for h in m.holders}) > 1 else "allocated"


def _fmt(value: Amount, name: str) -> str:
    if name == "memory" and value and value.denominator == 1 and value % (1024 * 1024) == 0:
        return f"{int(value // (1024 * 1024))}Mi"
    return str(int(value)) if value.denominator == 1 else f"{float(value):.2f}"


@dataclass
class CapacityView:
    """One capacity of a multi-allocatable device, split into the shares that consume it."""

    name: str
    total: Amount
    shares: list[tuple[Holder, Amount, float]]  # (holder, amount, percent of total)

    @property
    def free_pct(self) -> float:
        return max(0.0, 100.0 - sum(p for _, _, p in self.shares))

    @property
    def total_text(self) -> str:
        return format_quantity(_fmt(self.total, self.name))


def _rule_taints(rule: DeviceTaintRule) -> dict:
    taint = dict(((rule.object or {}).get("spec") or {}).get("taint") or {})
    taint.setdefault("effect", rule.effect)
    taint["rule"] = rule.name
    return taint


def _rule_matches(rule: DeviceTaintRule, d: Device) -> bool:
    if ((rule.object or {}).get("spec") or {}).get("deviceSelector") is None:
        return False  # no selector selects nothing (upstream)
    return ((rule.cluster_id is None or rule.cluster_id == d.cluster_id)
            and (not rule.driver or rule.driver == d.driver) and (not rule.pool_name or rule.pool_name == d.pool_name)
            and (not rule.device_name or rule.device_name == d.name))


def build_views(cluster: Cluster, devices: list[Device]) -> list[DeviceView]:
    """Attach holders, taints and a state to each device (current pool generation only)."""
    pools = {(p.driver, p.name): p for p in Pool.objects.filter(
        cluster=cluster, driver__in={d.driver for d in devices}, name__in={d.pool_name for d in devices})}
    devices = [d for d in devices if (p := pools.get((d.driver, d.pool_name))) and p.generation == d.pool_generation]
    keys = {(d.driver, d.pool_name, d.name) for d in devices}
    allocs = [a for a in DeviceAllocation.objects.filter(
        cluster=cluster.name, pool__in={k[1] for k in keys}, device__in={k[2] for k in keys}, admin_access=False,
    ).select_related("claim", "claim__namespace").order_by("id") if (a.driver, a.pool, a.device) in keys]
    consumers: dict[int, list[str]] = defaultdict(list)
    for r in Reservation.objects.filter(claim_id__in={a.claim_id for a in allocs}).select_related("consumer"):
        consumers[r.claim_id].append(r.consumer.name)
    by_key: dict[tuple, list[Holder]] = defaultdict(list)
    for a in allocs:
        by_key[(a.driver, a.pool, a.device)].append(Holder(
            claim_id=a.claim_id, namespace=a.claim.namespace.name, name=a.claim.name, phase=a.claim.phase,
            request=a.request, share_id=a.share_id, consumed=a.consumed_capacity or {},
            consumers=consumers.get(a.claim_id, [])))
    rules = [r for r in DeviceTaintRule.objects.filter(Q(cluster=cluster) | Q(cluster__isnull=True))
             if r.effect in BLOCKING_EFFECTS]
    stale = cluster.is_stale()
    views = []
    for d in devices:
        v = DeviceView(d, cluster.name, holders=by_key.get((d.driver, d.pool_name, d.name), []),
                       pool_state=pools[(d.driver, d.pool_name)].state)
        v.taints = list(d.taints or []) + [_rule_taints(r) for r in rules if _rule_matches(r, d)]
        if v.holders:
            many_claims = len({h.claim_id for h in v.holders}) > 1
            v.state = "shared" if many_claims or any(len(h.consumers) > 1 for h in v.holders) else "allocated"
        elif v.taints:
            v.state = "tainted"
        elif stale or v.pool_state == Pool.INVALID:
            v.state = "stale"
        views.append(v)
    return views


def counter_totals(cluster: Cluster, pools: set[tuple[str, str]]) -> dict[tuple[str, str, str], dict[str, Amount]]:
    """(driver, pool, counter set) -> counter totals, from the pools' ``sharedCounters`` slices."""
    out: dict[tuple[str, str, str], dict[str, Amount]] = {}
    q = Q()
    for driver, pool in pools:
        q |= Q(driver=driver, pool_name=pool)
    if not pools:
        return out
    for s in ResourceSlice.objects.filter(q, cluster=cluster).only("driver", "pool_name", "object"):
        for cs in ((s.object or {}).get("spec") or {}).get("sharedCounters") or []:
            out[(s.driver, s.pool_name, cs.get("name"))] = {
                name: qty(c) for name, c in (cs.get("counters") or {}).items()}
    return out


def layout_counter_set(cs: CounterSetView) -> None:
    """Fill blocks (which memory slices are taken, by what), used counters, and what still fits."""
    slice_names = {int(found.group(1)): n for n in cs.totals if (found := MEMORY_SLICE.match(n))}
    taken: set[int] = set()
    used: dict[str, Fraction] = defaultdict(Fraction)
    for m in cs.members:
        consumption = m.consumption(cs.name)
        # The whole-GPU device (Hopper+) consumes every slice; so does the largest partition (7g), told apart
        # by its type attribute.
        if (slice_names and m.attrs.get("type") != "mig"
                and len([n for n in consumption if MEMORY_SLICE.match(n)]) == len(slice_names)):
            cs.whole = m
        if not m.holders:
            continue
        for name, value in consumption.items():
            used[name] += value
        idx = sorted(int(mm.group(1)) for n in consumption if (mm := MEMORY_SLICE.match(n)))
        if idx:
            taken.update(idx)
            who = ", ".join(h.label for h in m.claims)
            cs.blocks.append(Block(idx[0], idx[-1] - idx[0] + 1, m.state, m.profile or m.name,
                                   f"{m.name} ({m.profile or 'partition'}) held by {who}", m.url))
    for i in sorted(slice_names):
        if i not in taken:
            cs.blocks.append(Block(i, 1, "free", "free", f"memory slice {i} free"))
    cs.blocks.sort(key=lambda b: b.start)
    cs.used = dict(used)
    # A free placement is still possible when every counter it consumes is left over.
    fits: dict[str, int] = defaultdict(int)
    for m in cs.members:
        if m.holders or m.state in ("tainted", "stale"):
            continue
        need = m.consumption(cs.name)
        if all(cs.totals.get(n, Fraction(0)) - used.get(n, Fraction(0)) >= v for n, v in need.items()):
            fits[m.profile or m.name] += 1
    cs.fits = sorted(fits.items(), key=lambda kv: (-_profile_size(kv[0]), kv[0]))


def _profile_size(profile: str) -> int:
    m = re.match(r"^(\d+)g\.", profile or "")
    return int(m.group(1)) if m else 0


def capacity_views(v: DeviceView) -> list[CapacityView]:
    """Per-capacity split of a multi-allocatable device among its shares."""
    out = []
    for name, cap in (v.device.capacity or {}).items():
        total = qty(cap)
        shares = []
        for h in v.holders:
            amount = qty(h.consumed.get(name)) if h.consumed.get(name) is not None else Fraction(0)
            if amount:
                shares.append((h, amount, float(100 * amount / total) if total else 0.0))
        out.append(CapacityView(name, total, shares))
    return out


@dataclass
class NodeLayout:
    whole: list[DeviceView]  # devices that consume no counters and have no parent
    counter_sets: list[CounterSetView]
    parents: list[tuple[str, list[DeviceView]]]  # partitions without counters grouped by parent id (AMD)
    shared_capacity: list[tuple[DeviceView, list[CapacityView]]]
    counts: dict[str, int]


# Attributes that name a partition's parent for drivers that publish partitions without counters.
PARENT_ATTRIBUTES = ("parentDeviceID", "parentUUID")


def layout(cluster: Cluster, views: list[DeviceView]) -> NodeLayout:
    partitions = [v for v in views if v.device.consumes_counters]
    sets: dict[tuple, CounterSetView] = {}
    totals = counter_totals(cluster, {(v.device.driver, v.device.pool_name) for v in partitions})
    for v in partitions:
        cs_name = (v.device.consumes_counters[0] or {}).get("counterSet", "")
        key = (v.device.driver, v.device.pool_name, cs_name)
        if key not in sets:
            sets[key] = CounterSetView(key[0], key[1], cs_name, totals.get(key, {}))
        sets[key].members.append(v)
    for cs in sets.values():
        layout_counter_set(cs)
    whole, parents = [], defaultdict(list)
    for v in views:
        if v.device.consumes_counters:
            continue
        parent = next((v.attrs.get(a) for a in PARENT_ATTRIBUTES if v.attrs.get(a)), None)
        if parent and v.attrs.get("type", "").endswith("partition"):
            parents[str(parent)].append(v)
        else:
            whole.append(v)
    counts: defaultdict[str, int] = defaultdict(int)
    for v in whole + [p for ps in parents.values() for p in ps]:
        counts[v.state] += 1
    for cs in sets.values():
        counts[cs.state] += 1
    shared_capacity = [(v, capacity_views(v)) for v in views if v.device.allow_multiple_allocations]
    return NodeLayout(whole, sorted(sets.values(), key=lambda c: _natural(c.name)), sorted(parents.items()),
                      shared_capacity, dict(counts))


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text or "")]


def node_detail(cluster: Cluster, node_name: str) -> NodeLayout:
    devices = sorted(Device.objects.filter(cluster=cluster, node_name=node_name),
                     key=lambda d: (d.driver, _natural(d.pool_name), _natural(d.name)))
    return layout(cluster, build_views(cluster, devices))


def device_detail(cluster: Cluster, driver: str, pool: str,
                  name: str) -> tuple[DeviceView | None, CounterSetView | None]:
    """One device, and for a partition the whole layout of the GPU it is cut from."""
    device = (Device.objects.filter(cluster=cluster, driver=driver, pool_name=pool, name=name)
              .order_by("-pool_generation").first())
    if device is None:
        return None, None
    if not device.consumes_counters:
        views = build_views(cluster, [device])
        return (views[0] if views else None), None
    cs_name = device.consumes_counters[0].get("counterSet")
    siblings = [d for d in Device.objects.filter(cluster=cluster, driver=driver, pool_name=pool)
                if d.consumes_counters and d.consumes_counters[0].get("counterSet") == cs_name]
    views = build_views(cluster, siblings)
    lay = layout(cluster, views)
    this = next((v for v in views if v.device.pk == device.pk), None)
    return this, (lay.counter_sets[0] if lay.counter_sets else None)


def helper_devices(cluster: Cluster, node_name: str) -> int:
    """Devices of the node's current pools that are no accelerator (``claims.services.figures.accelerators``)."""
    where, params = "d.cluster_id = %s AND d.node_name = %s", [cluster.id, node_name]
    predicate, predicate_params = accelerator_sql(where, params)
    rows = fetch_dicts(f"SELECT COUNT(*) AS n {BASE_FROM} WHERE {where} AND NOT {predicate}",
                       params + predicate_params)
    return rows[0]["n"]
