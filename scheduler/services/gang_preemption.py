"""Preemption for a whole gang: free whole nodes, confirmed by the gang placer.

A pending gang that no domain has room for (``NoDomainFits``, ``MembersDoNotFit``) and whose queue is within
its nominal for the gang's whole request reclaims like a claim does (``preemption.candidates``: borrowers, or
lower priority within its queue), but node by node: the nodes whose candidates are fewest are emptied first (a
gang needs whole nodes far more often than scattered devices), and the gang placer, in what-if mode on the
round's engine with the chosen victims' devices given back, confirms that the gang fits. The engine is left as
it was. A placed gang among the candidates is one unit (``gang_victims``), counted on its first member's node.
"""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from claims.services import fleet
from claims.services.engines import engines
from dra.gang import GangSpecError
from gangs.models import Gang, GangPhase
from gangs.services.gangs import member_claims
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices
from scheduler.services.gang_placement import library_gang
from scheduler.services.preemption import candidates, victim_devices

GANG_CAPACITY_REASONS = ("NoDomainFits", "MembersDoNotFit")


def choose_for_waiting_gangs(tree: Tree, waiting: set, coming: dict, limit: int = 5):
    """(gang, its first pending claim, victims) for waiting gangs that may reclaim."""
    gangs = Gang.objects.filter(phase=GangPhase.PENDING, reason__in=GANG_CAPACITY_REASONS).select_related(
        "namespace").order_by("created_at")[:limit]
    for gang in gangs:
        mcs, _ = member_claims(gang)
        pending = [mc for mc in mcs if mc.state == "pending"]
        claims = [c for mc in pending for c in mc.claims]
        if not claims or any(c.id in waiting for c in claims):
            continue
        wanted = [r for c in claims for r in requested_devices(c.spec)]
        cls = wanted[0][0]
        need = sum(n for c, n in wanted if c == cls)
        found = candidates(claims[0], need, cls, tree, coming)
        if found is None:
            continue
        pool, held, used, nominal, own = found.pool, found.held, found.used, found.nominal, found.own
        view = fleet.current_view()
        placer = engines.placer_for(view, fleet.rows_in_use())
        lib = library_gang(gang, pending, view.cluster_labels, gang.min_member)
        victims = confirm_gang(placer, lib, pool, need, held, used, nominal, own, victim_devices(pool),
                               found.checks[-1])
        if victims:
            coming[(queue_of(claims[0], claims[0].namespace.name, tree), cls)] += need
            yield gang, claims[0], victims


def confirm_gang(placer, lib_gang, pool, need, held, used, nominal, own, devices, check=None) -> list:
    """Empty nodes of ``pool``'s candidates, fewest victims first (a queue's only while it still borrows, or
    ``check`` allows it: a fair-share strategy, ``policy.strategy_checks``), until ``placer`` places
    ``lib_gang`` (what-if); [] when it never does. A node is emptied only when all its candidates may go, so
    borrowed room is not spent on half-empty nodes. The engine is left as it was."""
    engine = placer.engine
    by_node: dict[tuple, list] = defaultdict(list)
    for v in pool:
        by_node[(v.cluster, v.node)].append(v)
    order = sorted(by_node, key=lambda n: (len(by_node[n]), n))
    left = dict(used)
    chosen: list = []
    freed = Fraction(0)
    check_at = Fraction(need)
    try:
        for node in order:
            trial = dict(left)
            for v in by_node[node]:
                qid, amount = held[v.id]
                if qid != own and (not check(qid, amount, trial) if check is not None
                                   else trial[qid] <= nominal.get(qid, 0)):
                    break
                trial[qid] -= amount
            else:  # every claim on the node may go: empty it (a node half emptied helps no 8-device member)
                for v in by_node[node]:
                    engine.release(devices[v.id])
                    chosen.append(v)
                    freed += held[v.id][1]
                left = trial
            if freed < check_at:
                continue
            try:
                outcome = placer.place(lib_gang, commit=False)
            except GangSpecError:
                return []
            if outcome.placed:
                return chosen
            check_at = freed + max(1, need // 16)  # not yet: look again after a few more nodes
        return []
    finally:
        for v in chosen:
            engine.commit(devices[v.id])
