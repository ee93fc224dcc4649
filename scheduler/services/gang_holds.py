"""Head-of-line holds for gangs: a 2x8 gang at the head of its queue is not passed by a stream of 1-GPU claims.

A single claim at its queue's head holds one node (``queue_holds``); a gang needs room for all its members at
once, so its hold covers every node its members need. When the gang worker finds a pending gang short of room
(``NoDomainFits``, ``MembersDoNotFit``) and it is the oldest such gang of its queue, the nodes of the domain
that came closest are packed with its members, the nodes with the most free devices of the members' class
first, each member on a node whose devices that class selects can ever hold it; the nodes used are held
(``Gang.hold_queue``, ``Gang.held_nodes``). Every claims round reads the holds of pending gangs with the
single heads' (``queue_holds.RoundReservations``): a claim of another queue placed on a held node is undone
and waits (``HeldForQueueHead``) unless the holding queue borrows and the claim stays within its own nominal
(a head that borrows does not block within-nominal claims). So devices freed there accumulate for the gang.
A later gang is a later claim: the gang worker gives back its placement on an older gang's held nodes
(``held_from``), with the same exception.

The hold moves with each new attempt of the gang (the fleet changed), ends when it is placed, released,
failed or deleted (only pending gangs are read), and passes to an older gang of its queue that becomes short
of room. A round that starts while a gang holds asks for a gang pass when the fleet moved since the gang was
last tried: the release that freed its last device places it within that round's time, not the next
periodic pass.
"""
from __future__ import annotations

from claims.models import PendingWake
from claims.services import taking
from draservice.prepared import PreparedValues
from gangs import dispatch as gang_dispatch
from gangs.models import Gang, GangPhase
from queues.services import usage as u
from queues.services.order import Shares
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices
from scheduler.services import holds

HOLDING_REASONS = ("NoDomainFits", "MembersDoNotFit")


# Read by every claims round: compiled once (compiling the queryset cost more than running it).
_HELD = PreparedValues(lambda: Gang.objects.filter(phase=GangPhase.PENDING).exclude(hold_queue="")
                       .values_list("hold_queue", "held_nodes", "hold_need"))
_TRIED = PreparedValues(lambda: Gang.objects.filter(phase=GangPhase.PENDING).exclude(hold_queue="")
                        .values_list("attempted_version", flat=True)[:50], flat=True)


def held() -> list[tuple[str, list[tuple[str, str]], dict[str, int]]]:
    """(queue, [(cluster, node), ...], {class: devices needed}) of every pending gang that holds."""
    return [(queue, [(c, n) for c, n in nodes or []], dict(need or {})) for queue, nodes, need in _HELD.rows()]


def kick_stale() -> bool:
    """Ask for a gang pass when a gang that holds was last tried before the fleet last changed (called as a
    claims round starts, which every release asks for): the release that freed a holding gang's last device
    places it within moments, not at the next periodic pass. One query when no gang holds."""
    tried = _TRIED.rows()
    if not tried:
        return False
    version = taking.fleet_version()
    if not any(v is None or v < version for v in tried):
        return False
    gang_dispatch.request_placement()
    return True


def hold_for_gang(gang: Gang, claims_by_member: list[list], engine, outcome) -> list[tuple[str, str]]:
    """Hold (or release) nodes for pending ``gang`` after an attempt that did not place it (``outcome``, on
    ``engine`` as the attempt left it); ``claims_by_member``: each pending member's claims. Saved on the gang
    row (locked by the caller); returns the nodes held."""
    nodes: list[tuple[str, str]] = []
    queue = ""
    claims = [c for member in claims_by_member for c in member]
    if outcome.reason in HOLDING_REASONS and claims:
        tree = Tree.load()
        queue = queue_of(claims[0], claims[0].namespace.name, tree)
        older = (Gang.objects.filter(phase=GangPhase.PENDING, hold_queue=queue, created_at__lt=gang.created_at)
                 .exclude(pk=gang.pk).exists())
        if not older:
            nodes = pack(engine, claims_by_member, outcome.closest)
            # One gang head per queue: a younger one that held gives way to this one.
            (Gang.objects.filter(phase=GangPhase.PENDING, hold_queue=queue, created_at__gt=gang.created_at)
             .exclude(pk=gang.pk).update(hold_queue="", held_nodes=[]))
    need: dict[str, int] = {}
    if nodes:
        for cls, n in (r for c in claims for r in requested_devices(c.spec)):
            need[cls] = need.get(cls, 0) + n
    else:
        queue = ""
    if (gang.hold_queue, [tuple(n) for n in gang.held_nodes or []], gang.hold_need or {}) != (queue, nodes, need):
        gang.hold_queue, gang.held_nodes, gang.hold_need = queue, [list(n) for n in nodes], need
        Gang.objects.filter(pk=gang.pk).update(hold_queue=queue, held_nodes=gang.held_nodes, hold_need=need)
    return nodes


def pack(engine, claims_by_member: list[list], closest) -> list[tuple[str, str]]:
    """The nodes the members would use if they were empty: members (largest first) each on the first node of
    the closest domain, most free devices first, whose selected devices can still take it; [] when they cannot
    all be packed (the gang never fits there: holding would only starve others)."""
    wants = [[r for c in member for r in requested_devices(c.spec)] for member in claims_by_member]
    first = next((cls for member in wants for cls, _ in member), None)
    if first is None:
        return []
    needs = sorted((sum(n for cls, n in member if cls == first) for member in wants), reverse=True)
    sel = holds.selector_set(engine, [c for member in claims_by_member for c in member], first)
    if sel is None:
        return []
    ranked = []
    for order, model in enumerate(engine.clusters.values()):
        if closest is not None and model.name != closest.cluster:
            continue
        index = engine.key_index(sel, model)
        for position, name in enumerate(model.node_order):
            node = model.nodes[name]
            if closest is not None and any(node.labels.get(k) != v for k, v in (closest.domain or {}).items()):
                continue
            room = len(engine.node_selector_candidates(model, node, sel))
            ranked.append([-index.free_on(name), order, position, model.name, name, room])
    ranked.sort(key=lambda r: r[:3])
    used: list[tuple[str, str]] = []
    for need in needs:
        if need <= 0:
            continue
        spot = next((r for r in ranked if r[5] >= need), None)
        if spot is None:
            return []
        spot[5] -= need
        if (spot[3], spot[4]) not in used:
            used.append((spot[3], spot[4]))
    return used


def held_from(gang: Gang, claims: list, outcome) -> str:
    """Why ``outcome`` (a placement of pending ``gang``, whose member ``claims`` these are) may not be written:
    it uses a node an older gang holds at its queue's head, or a node held for a single claim (its queue's head,
    or a preemptor on the devices its victims free: ``queue_holds``), and does not fall under the exception (the
    holder borrows and this gang stays within its own queue's nominal); "" when it may. A later gang is a later
    claim: it takes its turn behind the head, as single claims do in the claims round. A single claim's hold
    binds every gang, older ones too, as it binds every claim in the claims round: a gang requeued by a
    preemption otherwise took back, at its original place, the devices freed for its preemptor, and was
    preempted a second time."""
    if not outcome.placed or not claims:
        return ""
    rows = (Gang.objects.filter(phase=GangPhase.PENDING, created_at__lt=gang.created_at).exclude(hold_queue="")
            .exclude(pk=gang.pk).values_list("hold_queue", "held_nodes", "hold_need"))
    held: dict[tuple[str, str], tuple[str, dict]] = {}
    for queue, nodes, need in rows:
        for c, n in nodes or []:
            held.setdefault((c, n), (queue, need or {}))
    for queue, cluster, node in (PendingWake.objects.exclude(head_of="").exclude(hold_node="")
                                 .values_list("head_of", "hold_cluster", "hold_node").distinct()):
        held.setdefault((cluster, node), (queue, {}))
    where = [(outcome.cluster or "", p.node) for p in outcome.placements]
    hits = [held[w] for w in where if w in held]
    if not hits:
        return ""
    tree = Tree.load()
    mine = queue_of(claims[0], claims[0].namespace.name, tree)
    shares = Shares(tree, u.load())
    wants = [r for c in claims for r in requested_devices(c.spec)]
    for holder, need in hits:
        h, q = tree.queues.get(holder), tree.queues.get(mine)
        if h is None or q is None:
            continue
        borrows = any(shares.used[(h.id, cls)] + need.get(cls, 0) > shares.nominal.get((h.id, cls), 0)
                      for cls, _ in wants)
        if holder == mine or not borrows or shares.borrows(q.id, wants):
            return f"nodes are held for the head of queue {holder!r} (a gang); waiting for room elsewhere"
    return ""
