"""Head-of-queue holds: an 8-GPU head is not starved by a stream of 1-GPU claims.

Within one claims round, the first group of a queue that the engine cannot place for lack of capacity (not
quota: quota is checked at commit) becomes that queue's head: the node of its first device class with the
most free devices the class selects is held for it. A later placement of this round that would use a device
on a held node is undone in the engine and the claims wait (``HeldForQueueHead``) -- so devices freed on
that node accumulate until the head fits, while the other nodes keep serving small claims.

A head's node stays held after its round: the head's wake rows record it (``PendingWake.hold_node``), and
every round -- of any worker -- starts from those holds, so a round that does not decide the head (it waits
for a release, while new claims arrive) still keeps the node from the claims behind it. Without that, new
1-GPU claims took the head's node between releases and an 8-GPU head waited for ever. The hold moves or ends
only when the head is decided again (woken by any release in its cluster), placed, released or deleted.
A claim with a walltime that ends before the plan's starts of what it would take backfills there instead
(``scheduler.services.backfill``).
"""
from __future__ import annotations

import dataclasses

from claims.models import PendingWake
from claims.services import wake
from draservice.prepared import PreparedValues
from queues.services import usage as u
from queues.services.order import Shares
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices
from scheduler.services import gang_holds, holds
from scheduler.services.backfill import Backfill
from scheduler.services.holds import Screen

HELD_FOR_QUEUE_HEAD = "held_for_queue_head"  # an engine outcome reason (the round maps it to HeldForQueueHead)


# Every round reads the heads kept from earlier rounds, twice: compiled once (draservice.prepared).
_KEPT = PreparedValues(lambda: PendingWake.objects.exclude(head_of="").exclude(hold_node="")
                       .values_list("claim_id", "head_of", "hold_cluster", "hold_node").distinct())


class RoundReservations(Screen):
    def __init__(self, engine) -> None:
        self.engine = engine
        self.tree: Tree | None = None
        self.shares: Shares | None = None  # queues' use and nominal, read once a held node is contested
        self.held: dict[tuple[str, str], str] = {}  # (cluster, node) -> queue name of the head holding it
        self.heads: set[str] = set()  # queues whose head has been found (this round or kept from before)
        self.kept: dict[int, tuple[str, tuple[str, str]]] = {}  # head claim id -> (queue, node), from before
        self.given_up: dict[int, tuple[str, str]] = {}  # kept heads decided again -> the node they held
        self.backfill = Backfill()
        self._read_kept()
        # What a holding gang will use once placed, per queue and class: a gang that will borrow is a borrowing
        # head (``_yields``) though its queue uses nothing yet.
        self.coming: dict[tuple[str, str], int] = {}
        for queue, nodes, need in gang_holds.held():  # a gang at its queue's head: every node its members need
            for where in nodes:
                self.held.setdefault(where, queue)
            for cls, n in need.items():
                self.coming[(queue, cls)] = self.coming.get((queue, cls), 0) + n
            self.heads.add(queue)

    def _read_kept(self) -> None:
        for claim_id, queue, cluster, node in _KEPT.rows():
            # One head per queue (``wake.store`` keeps the mark on the oldest only), but every claim of it that
            # preempted keeps the node its victims free (``hold_for_preemptor``).
            self.kept[claim_id] = (queue, (cluster, node))
            self.held[(cluster, node)] = queue
            self.heads.add(queue)

    def refresh(self, engine) -> None:
        """Add the holds other workers committed since this round read them (called under the round's turns,
        with the engine as of then): a head another worker found while this round waited for its turns holds
        its node from then on, and a placement decided from the older holds would take it."""
        self.engine = engine
        self._read_kept()

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        """Every node held so far: the engine tries the others first (a placement on one is undone anyway, and
        a claim undone there would wait for a release while another node had room). A kept head being
        decided again gives its node up first: it may fit there now, or hold another."""
        for claim in group.claims:
            if claim.id in self.kept:
                queue, where = self.kept.pop(claim.id)
                self.given_up[claim.id] = where
                if self.held.get(where) == queue:
                    del self.held[where]
                self.heads.discard(queue)
        return frozenset(self.held) | self.backfill.planned_nodes(group)

    def __call__(self, group, outcome):
        if self.tree is None:
            self.tree = Tree.load()
        first = group.claims[0]
        queue = queue_of(first, first.namespace.name, self.tree)
        if not outcome.allocated:
            if outcome.error is None and queue not in self.heads and outcome.reason != HELD_FOR_QUEUE_HEAD:
                self.heads.add(queue)
                self._reserve(group, queue)
            return outcome
        where = (outcome.cluster or "", outcome.node or "")
        holder = self.held.get(where)
        if holder is None or not outcome.node or self._yields(holder, queue, group):
            # The plan's devices elsewhere (backfill.py); a borrowing queue's planned claims give way.
            kept = self.backfill.keeps(group, outcome, lambda q: q != queue and self._yields(q, queue, group))
            if kept is not None:
                return kept
            self.engine.release(outcome.devices)
            return dataclasses.replace(
                outcome, allocated=False, claims=[], devices=[], reason=HELD_FOR_QUEUE_HEAD,
                message=f"its devices on node {where[0]}/{where[1]} are planned for a claim that starts before "
                        "this one's walltime would end; waiting for room elsewhere",
                diagnostics={"heldFor": "plan", "node": where[1], "cluster": where[0]})
        backfilled = self.backfill.allows(group, outcome, holder)
        if backfilled is not None:
            return backfilled
        self.engine.release(outcome.devices)
        return dataclasses.replace(
            outcome, allocated=False, claims=[], devices=[], reason=HELD_FOR_QUEUE_HEAD,
            message=f"node {where[0]}/{where[1]} is held for the head of queue {holder!r}; waiting for room "
                    "elsewhere", diagnostics={"heldFor": holder, "node": where[1], "cluster": where[0]})

    def _yields(self, holder: str, queue: str, group) -> bool:
        """A head whose queue borrows (uses beyond its nominal of the class, or will once a holding gang of it
        is placed) does not keep its held node from a claim of another queue that stays within its nominal: the
        head's place is among the borrowers only. (Such a claim waited ``HeldForQueueHead`` for ever beside an
        idle GPU.)"""
        tree = self.tree
        if holder == queue or tree is None:
            return False
        if self.shares is None:
            self.shares = Shares(tree, u.load())
        h, q = tree.queues.get(holder), tree.queues.get(queue)
        if h is None or q is None:
            return False
        wants = [r for c in group.claims for r in requested_devices(c.spec)]
        if not any(self.shares.used[(h.id, cls)] + self.coming.get((holder, cls), 0)
                   > self.shares.nominal.get((h.id, cls), 0) for cls, _ in wants):
            return False
        if self.shares.borrows(q.id, wants):
            return False
        for cls, n in wants:
            self.shares.add(q.id, cls, n)
        return True

    def free_on(self, group, where: tuple[str, str]) -> list[tuple[str, str, str, str]]:
        """The devices of ``group``'s first device class on node ``where`` that this round's engine sees free."""
        wanted = [r for c in group.claims for r in requested_devices(c.spec)]
        model = self.engine.clusters.get(where[0]) if wanted else None
        node = model.nodes.get(where[1]) if model is not None else None
        sel = holds.selector_set(self.engine, [], wanted[0][0]) if node is not None else None  # the class's own
        if sel is None:
            return []
        return [(d.cluster, d.driver, d.pool, d.name) for d in self.engine.node_selector_candidates(model, node, sel)
                if self.engine.is_free(d)]

    def _reserve(self, group, queue: str) -> None:
        """Hold the node with the most free devices that the head's first device class (and its requests'
        selectors, where they agree) selects, among the nodes that could ever hold it. The free counts come
        from the engine's per-selector indexes (kept up to date per change, not recounted): only the nodes
        tried in that order have their devices looked at, until one can hold the head, so a round's work
        grows with the nodes it tries, not with the fleet (a full walk of the fleet's devices every round
        would)."""
        wanted = [r for c in group.claims for r in requested_devices(c.spec)]
        if sum(n for _, n in wanted) < 2 or not wanted:
            return  # a one-device head needs no node held back: any freed device fits it
        cls = wanted[0][0]
        need = sum(n for c, n in wanted if c == cls)
        sel = holds.selector_set(self.engine, group.claims, cls)
        if sel is None:
            return
        ranked: list[tuple] = []
        for order, model in enumerate(self.engine.clusters.values()):
            index = self.engine.key_index(sel, model)
            ranked.extend((-index.free_on(name), order, position, model, name)
                          for position, name in enumerate(model.node_order) if (model.name, name) not in self.held)
        for *_, model, name in sorted(ranked, key=lambda r: r[:3]):
            if len(self.engine.node_selector_candidates(model, model.nodes[name], sel)) >= need:
                self.held[(model.name, name)] = queue
                group.holds_node, group.held_at = queue, (model.name, name)  # kept for the next rounds (wake rows)
                return


def offer_given_up(screen: RoundReservations, groups) -> int:
    """After the round's commits: the free devices (of its class) on the nodes its kept heads gave up and do
    not hold again (placed elsewhere, holding another node, deferred) are offered as if released. The claims
    held off such a node were woken by its devices' release while the hold stood and wait for the next
    release; without this a GPU stayed free beside them once the head held another node."""
    if not screen.given_up:
        return 0
    by_claim = {c.id: g for g in groups for c in g.claims}
    devices = []
    for claim_id, where in screen.given_up.items():
        group = by_claim.get(claim_id)
        if group is not None and group.held_at != where:
            devices.extend(screen.free_on(group, where))
    screen.given_up.clear()
    return sum(wake.offer_again(devices).values())


def hold_for_preemptor(claim, queue: str, where: tuple[str, str]) -> None:
    """The node a preemption decision placed ``claim`` on (its victims' devices) is held for it as for its
    queue's head, from round to round until it is decided again: the victims, requeued at their place, and
    later claims of other queues do not take back what was freed for it. (Before, the node its queue's head
    had held earlier, somewhere else, was kept, and the victims took the freed devices back.) A one-device
    claim too: a requeued victim that the round ranks first (an older claim, a tie in the fair-share order)
    took its one freed device back, and the pass preempted it again, pass after pass."""
    if not where[1] or not requested_devices(claim.spec):
        return
    PendingWake.objects.filter(claim_id=claim.id).update(head_of=queue, hold_cluster=where[0], hold_node=where[1])


def round_screen(engine) -> RoundReservations:
    return RoundReservations(engine)

