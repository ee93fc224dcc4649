"""The exact search on one node: upstream's first-fit backtracking, made polynomial in practice.

The shape follows upstream ``allocateOne``: claims in order, requests in order, for a request with
``firstAvailable`` each subrequest in order until one leads to a full solution, and for each required device
the candidates in allocation order, checked for use, capacity, counters, taints and constraints. Within one
request devices are picked in increasing candidate order (combinations, not permutations).

What keeps it from going exponential:

* **count bounds**: a request stops as soon as fewer candidates remain than devices it still needs, and before
  the search starts every request must have enough free candidates on the node at all;
* **symmetry**: at each step a device whose signature (everything any check can see) equals one already tried
  at that step is skipped, because its subtree is the same up to renaming. 32 interchangeable devices in two
  groups collapse to two choices per step;
* **constraint propagation**: before searching, a ``matchAttribute`` constraint must have one attribute value
  that enough free candidates of all its requests share (kubernetes#131730 fails here at once);
* **a step budget** that turns anything pathological into ``SearchBudgetExceeded``.

Upstream bugs not copied: counters and constraints are always rolled back when a candidate is rejected or
backtracked (kubernetes#140436), and a multi-allocatable device is counted against counters once.
"""
from __future__ import annotations

import time

from .capacity import consumption, fits
from .constraints import Constraint, MatchAttribute, attribute_value
from .model import Device, Node
from .plan import ALLOCATION_RESULTS_MAX, Alt, GroupPlan
from .policy import order_candidates
from .selectors import MATCH, SelectorSet
from .types import AllocationError, ErrorCode

SIZE = "size"  # upstream errAllocationResultMaxSizeExceeded: this branch can only overflow the result limit


class SearchBudgetExceeded(Exception):
    pass


class NodeError(Exception):
    """An error that belongs to one node (upstream fails the whole Filter with it); deferred by the engine."""

    def __init__(self, error: AllocationError):
        super().__init__(error.message)
        self.error = error


class Pick:
    __slots__ = ("alt", "device", "amounts", "share")

    def __init__(self, alt: Alt, device: Device, amounts, share: bool):
        self.alt = alt
        self.device = device
        self.amounts = amounts  # consumed capacity of a share (dict name -> Q), else None
        self.share = share


class Budget:
    __slots__ = ("steps", "max_steps", "deadline")

    def __init__(self, max_steps: int, max_seconds: float):
        self.steps = 0
        self.max_steps = max_steps
        self.deadline = time.monotonic() + max_seconds

    def spend(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps or (self.steps & 1023 == 0 and time.monotonic() > self.deadline):
            raise SearchBudgetExceeded()


class NodeSearch:
    """One attempt to place a group on one node. ``run()`` returns picks per claim, or None."""

    def __init__(self, engine, plan: GroupPlan, cluster, node: Node, budget: Budget):
        self.e = engine
        self.f = engine.features
        self.plan = plan
        self.cluster = cluster
        self.node = node
        self.budget = budget
        self._cands: dict[SelectorSet, list[Device]] = {}
        self.loc_excl: dict[int, set[int]] = {}
        self.loc_cap: dict[int, dict] = {}
        self.loc_active: dict[int, int] = {}
        self.loc_counters: dict[tuple, dict] = {}
        self.results: list[list[Pick]] = [[] for _ in plan.claims]
        self.constraints = [[c.fresh() for c in cp.constraints] for cp in plan.claims]
        self.selected: dict[tuple[int, int], int] = {}
        self.all_devices: dict[tuple[int, int, int], list[Device]] = {}
        self.failure: dict | None = None  # why the node failed, for diagnostics

    # ------------------------------------------------------------------------------------------ candidates
    def candidates(self, alt: Alt) -> list[Device]:
        # Requests of a group mostly share selector sets, and the search asks for each several times.
        sel = alt.sel
        cands = self._cands.get(sel)
        if cands is None:
            cands = self._cands[sel] = self.e.node_selector_candidates(self.cluster, self.node, sel)
        return cands

    def is_available(self, d: Device, alt: Alt) -> bool:
        """Could ``alt`` get ``d`` as far as the device alone tells (in use, counters, capacity left)?"""
        return alt.admin or self.e.avail[d.idx]

    # ------------------------------------------------------------------------------------------ preflight
    def preflight(self) -> bool:
        """Cheap necessary conditions; False with ``self.failure`` set when the node cannot work."""
        for cp in self.plan.claims:
            # Without "All" requests the bound is the plan's, which ``build_plan`` checked already.
            min_devices = 0
            for rp in cp.requests if cp.has_all else ():
                best = None
                for alt in rp.alts:
                    need = self._need(alt)
                    best = need if best is None else min(best, need)
                min_devices += best or 0
            if min_devices > ALLOCATION_RESULTS_MAX:
                raise NodeError(AllocationError(ErrorCode.LIMIT, f"{cp.ref}: number of requested devices "
                                                f"{min_devices} exceeds the claim limit of {ALLOCATION_RESULTS_MAX}",
                                                claim=cp.ref))
            for rp in cp.requests:
                ok = False
                for alt in rp.alts:
                    cands = self.candidates(alt)
                    need = self._need(alt)
                    if alt.all_mode:
                        ok = ok or need > 0
                        continue
                    if alt.admin:
                        free = len(cands)
                    else:  # counted until there are enough
                        avail = self.e.avail
                        free = 0
                        for d in cands:
                            if avail[d.idx]:
                                free += 1
                                if free >= need:
                                    break
                    if free >= need:
                        ok = True
                        break
                if not ok:
                    alt = rp.alts[0]
                    self.failure = {"reason": "not_enough_devices", "claim": cp.ref, "request": rp.name,
                                    "need": self._need(alt),
                                    "free": sum(1 for d in self.candidates(alt) if self.is_available(d, alt))}
                    return False
            for c in cp.constraints:
                if isinstance(c, MatchAttribute) and not self._match_bound(cp, c):
                    self.failure = {"reason": "constraint", "claim": cp.ref, "constraint": c.index,
                                    "matchAttribute": c.attr}
                    return False
        return True

    def _need(self, alt: Alt) -> int:
        if not alt.all_mode:
            return alt.count
        key = (alt.claim_idx, alt.request_idx, alt.sub_idx)
        devices = self.all_devices.get(key)
        if devices is None:
            devices = self.all_devices[key] = self._all_devices(alt)
        return len(devices)

    def _all_devices(self, alt: Alt) -> list[Device]:
        """The devices an ``All`` request must get: every matching device on the node (in use or not).

        An incomplete or invalid pool that could hold matching devices makes "all" unknowable: an error.
        Devices whose capacity can never hold the request are left out; devices whose capacity is merely used
        up stay in, so the request fails (kubernetes#140769).
        """
        ref = self.plan.claims[alt.claim_idx].ref
        for pool in self.cluster.node_pools(self.node):
            if alt.sel.drivers is not None and pool.driver not in alt.sel.drivers:
                continue
            if pool.incomplete:
                raise NodeError(AllocationError(ErrorCode.POOL_UPDATING, f"{ref}, request {alt.name}: asks for all "
                                                f"devices, but resource pool {pool.pool_id} is currently being "
                                                "updated", claim=ref))
            if pool.invalid:
                raise NodeError(AllocationError(ErrorCode.POOL_UPDATING, f"{ref}, request {alt.name}: asks for all "
                                                f"devices, but resource pool {pool.pool_id} is currently invalid",
                                                claim=ref))
        out = []
        # Candidates are the devices the selectors match: one whose selector fails at run time does not match
        # (``selectors``), so it is not one of "all" either.
        for d in self.candidates(alt):
            if self.f.consumable_capacity:
                amounts = consumption(alt.cap_requests, d)
                if amounts is None or fits(amounts, d) is not None:
                    continue
            out.append(d)
        return out

    def _match_bound(self, cp, c: MatchAttribute) -> bool:
        """Is there an attribute value that enough free candidates of every constrained request share?

        Only requests with a single alternative, a fixed count and exclusive devices take part: for them a
        device serves one request at most, so the union of their candidates with value v must hold the sum of
        their counts.
        """
        involved = [rp.alts[0] for rp in cp.requests
                    if not rp.has_sub and not rp.alts[0].all_mode and c.applies(rp.name, None)]
        if not involved:
            return True
        total_need = sum(a.count for a in involved)
        lists: dict[int, tuple[list[Device], bool]] = {}  # id of a candidate list -> (list, admin)
        for alt in involved:
            cands = self.candidates(alt)
            lists.setdefault(id(cands), (cands, alt.admin))
        avail = self.e.avail
        if len(lists) == 1:  # the common case: all constrained requests select from the same devices
            ((cands, admin),) = lists.values()
            counts: dict = {}  # value -> free devices with it, until one value has enough
            for d in cands:
                if d.allow_multiple:
                    return True  # shared devices can serve several requests: no simple bound
                if not admin and not avail[d.idx]:
                    continue
                v = attribute_value(d, c.attr)
                if v is None or not isinstance(v, tuple):
                    continue
                n = counts[v] = counts.get(v, 0) + 1
                if n >= total_need:
                    return True
            return False
        per_list = []  # per candidate list: value -> free devices with that value
        for cands, admin in lists.values():
            values: dict = {}
            for d in cands:
                if d.allow_multiple:
                    return True  # shared devices can serve several requests: no simple bound
                if not admin and not avail[d.idx]:
                    continue
                v = attribute_value(d, c.attr)
                if v is None or not isinstance(v, tuple):
                    continue
                values.setdefault(v, []).append(d.idx)
            per_list.append(values)
        position = {key: i for i, key in enumerate(lists)}
        for v in set().union(*per_list):
            union = set()
            ok = True
            for alt in involved:
                devs = per_list[position[id(self.candidates(alt))]].get(v, ())
                if len(devs) < alt.count:
                    ok = False
                    break
                union.update(devs)
            if ok and len(union) >= total_need:
                return True
        return False

    # ------------------------------------------------------------------------------------------ the search
    def run(self):
        if not self.preflight():
            return None
        return self.results if self.solve() else None

    def solve(self) -> bool:
        """The search proper, after ``preflight``: True when every claim got its devices (``self.results``)."""
        return self._claim(0) is True

    def _claim(self, ci: int):
        if ci == len(self.plan.claims):
            return True
        r = self._request(ci, 0)
        return r is True  # the result limit is per claim: an overflow here says nothing about earlier claims

    def _request(self, ci: int, ri: int):
        cp = self.plan.claims[ci]
        if ri == len(cp.requests):
            return self._claim(ci + 1)
        rp = cp.requests[ri]
        if not rp.has_sub:
            return self._alt(ci, ri, rp.alts[0])
        all_exceeded = True
        for si, alt in enumerate(rp.alts):
            r = self._alt(ci, ri, alt)
            if r == SIZE:
                continue
            all_exceeded = False
            if r is True:
                self.selected[(ci, ri)] = si
                return True
        return SIZE if all_exceeded else False

    def _alt(self, ci: int, ri: int, alt: Alt):
        need = self._need(alt)
        if alt.all_mode and need == 0:
            return False
        if len(self.results[ci]) + need > ALLOCATION_RESULTS_MAX:
            return SIZE
        if alt.all_mode:
            return self._all(ci, ri, alt, self.all_devices[(ci, ri, alt.sub_idx)], 0)
        cands = order_candidates(self, alt, self.candidates(alt), need)
        return self._slot(ci, ri, alt, cands, 0, need)

    def _all(self, ci, ri, alt, devices, i):
        if i == len(devices):
            return self._request(ci, ri + 1)
        self.budget.spend()
        taken = self._take(ci, alt, devices[i], must=True)
        if taken is None:
            return False
        r = self._all(ci, ri, alt, devices, i + 1)
        if r is not True:
            self._untake(taken)
        return r

    def _slot(self, ci, ri, alt, cands, start, need):
        if need == 0:
            return self._request(ci, ri + 1)
        tried = set()
        n = len(cands)
        excl, avail = self.e.excl, self.e.avail
        loc_excl = self.loc_excl
        for pos in range(start, n):
            if n - pos < need:
                break
            d = cands[pos]
            idx = d.idx
            # "In use" is cheap and comes first, as upstream (``avail`` also folds in counters and capacity that
            # are used up fleet-wide); the signature includes the global in-use state because admin access may
            # pick a device that is in use and another that is not.
            if alt.admin:
                if not d.allow_multiple and ci in loc_excl.get(idx, ()):
                    continue
            elif not avail[idx] or idx in loc_excl:
                continue
            sig = (d.sig, excl[idx])
            if sig in tried:
                continue
            tried.add(sig)
            if alt.sel.evaluate(d) is not MATCH:  # no match, or a selector failed on it (no match either)
                continue
            self.budget.spend()
            taken = self._take(ci, alt, d, must=False)
            if taken is None:
                continue
            r = self._slot(ci, ri, alt, cands, pos + 1, need - 1)
            if r is True:
                return True
            self._untake(taken)
            if r == SIZE:
                return SIZE
        return False

    def _take(self, ci: int, alt: Alt, d: Device, must: bool):
        """Try to add ``d`` for ``alt``; returns what ``_untake`` needs to take it back, or None if it cannot be
        added."""
        e, f, idx = self.e, self.f, d.idx
        multi = d.allow_multiple
        if alt.admin:
            if not multi and ci in self.loc_excl.get(idx, ()):
                return None
        elif e.excl[idx] or self.loc_excl.get(idx) or (not multi and e.active.get(idx)):
            return None
        amounts = None
        if multi:  # (only with the consumable capacity feature)
            amounts = consumption(alt.cap_requests, d)
            if amounts is None or fits(amounts, d, e.cap_used.get(idx), self.loc_cap.get(idx)) is not None:
                return None
        elif f.consumable_capacity and (d.capacity or alt.cap_requests) and \
                not e.capacity_admits(alt, d):
            return None
        if d.consumes and not f.partitionable_devices:
            return None
        charge_counters = bool(d.consumes) and not (multi and (e.active.get(idx) or self.loc_active.get(idx)))
        if charge_counters and not self._counters_fit(d):
            return None
        if f.device_taints and d.taints and taint_blocks(d.taints, alt.tolerations):
            return None
        added: list[Constraint] = []
        for c in self.constraints[ci]:
            if not c.applies(alt.base, alt.sub):
                continue
            if not c.add(d):
                for a in added:
                    a.remove(d)
                if must:
                    ref = self.plan.claims[ci].ref
                    raise AllocationError(ErrorCode.INVALID, f"{ref}, request {alt.name}: cannot add device "
                                          f"{d.id_str} because a claim constraint would not be satisfied", claim=ref)
                return None
            added.append(c)
        # Commit.
        if charge_counters:
            self._charge(d, 1)
        share = multi
        if multi:
            assert amounts is not None  # consumption() above
            loc = self.loc_cap.setdefault(idx, {})
            for name, q in amounts.items():
                loc[name] = loc.get(name, 0) + q.value
            self.loc_active[idx] = self.loc_active.get(idx, 0) + 1
        else:
            self.loc_excl.setdefault(idx, set()).add(ci)
        self.results[ci].append(Pick(alt, d, amounts if multi else None, share))
        return ci, d, amounts if multi else None, charge_counters, added

    def _untake(self, taken: tuple) -> None:
        """Take back what ``_take`` added."""
        ci, d, amounts, charge_counters, added = taken
        idx = d.idx
        self.results[ci].pop()
        if amounts is not None:  # a share of a multi-allocatable device
            loc = self.loc_cap[idx]
            for name, q in amounts.items():
                loc[name] -= q.value
            self.loc_active[idx] -= 1
            if not self.loc_active[idx]:
                del self.loc_active[idx]
                del self.loc_cap[idx]
        else:
            s = self.loc_excl[idx]
            s.discard(ci)
            if not s:
                del self.loc_excl[idx]
        if charge_counters:
            self._charge(d, -1)
        for a in added:
            a.remove(d)

    def _counters_fit(self, d: Device) -> bool:
        pool = d.pool_ref
        for set_name, counters in d.consumes:
            total = pool.counter_sets.get(set_name, {})
            used = self.e.counters_used.get((pool.uid, set_name))
            local = self.loc_counters.get((pool.uid, set_name))
            for cname, amount in counters.items():
                have = total.get(cname, 0)
                if used:
                    have -= used.get(cname, 0)
                if local:
                    have -= local.get(cname, 0)
                if amount > have:
                    return False
        return True

    def _charge(self, d: Device, sign: int) -> None:
        pool = d.pool_ref
        for set_name, counters in d.consumes:
            local = self.loc_counters.setdefault((pool.uid, set_name), {})
            for cname, amount in counters.items():
                local[cname] = local.get(cname, 0) + sign * amount


def taint_blocks(taints: list[dict], tolerations: list[dict]) -> bool:
    """A ``NoSchedule``/``NoExecute`` taint that no toleration tolerates (``resourceclaim.ToleratesTaint``)."""
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return True
    return False


def tolerates(tol: dict, taint: dict) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("key") and tol["key"] != taint.get("key"):
        return False
    op = tol.get("operator") or "Equal"
    if op == "Equal":
        return (tol.get("value") or "") == (taint.get("value") or "")
    return op == "Exists"
