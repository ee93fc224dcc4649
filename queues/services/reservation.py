"""Head-of-queue reservations: an 8-GPU head is not starved by a stream of 1-GPU claims.

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
Leases are not yet used to let a small claim backfill where it would end before the head starts.
"""
from __future__ import annotations

import dataclasses

from claims.models import PendingWake
from claims.services import queueing
from dra.engine.selectors import MATCH
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices


class RoundReservations(queueing.Screen):
    def __init__(self, engine) -> None:
        self.engine = engine
        self.tree: Tree | None = None
        self.held: dict[tuple[str, str], str] = {}  # (cluster, node) -> queue name of the head holding it
        self.heads: set[str] = set()  # queues whose head has been found (this round or kept from before)
        self.kept: dict[int, tuple[str, tuple[str, str]]] = {}  # head claim id -> (queue, node), from before
        rows = (PendingWake.objects.exclude(head_of="").exclude(hold_node="")
                .values_list("claim_id", "head_of", "hold_cluster", "hold_node").distinct())
        for claim_id, queue, cluster, node in rows:
            if queue in self.heads:
                continue  # one head per queue (``wake.store`` keeps the mark on the oldest only)
            self.kept[claim_id] = (queue, (cluster, node))
            self.held[(cluster, node)] = queue
            self.heads.add(queue)

    def avoid(self, group) -> frozenset[tuple[str, str]]:
        """Every node held so far: the engine tries the others first (a placement on one is undone anyway, and
        a claim undone there would wait for a release while another node had room). A kept head being
        decided again gives its node up first: it may fit there now, or hold another."""
        for claim in group.claims:
            if claim.id in self.kept:
                queue, where = self.kept.pop(claim.id)
                if self.held.get(where) == queue:
                    del self.held[where]
                self.heads.discard(queue)
        return frozenset(self.held)

    def __call__(self, group, outcome):
        if self.tree is None:
            self.tree = Tree.load()
        first = group.claims[0]
        queue = queue_of(first, first.namespace.name, self.tree)
        if not outcome.allocated:
            if outcome.error is None and queue not in self.heads and outcome.reason != queueing.HELD_FOR_QUEUE_HEAD:
                self.heads.add(queue)
                self._reserve(group, queue)
            return outcome
        where = (outcome.cluster or "", outcome.node or "")
        holder = self.held.get(where)
        if holder is None or not outcome.node:
            return outcome
        self.engine.release(outcome.devices)
        return dataclasses.replace(
            outcome, allocated=False, claims=[], devices=[], reason=queueing.HELD_FOR_QUEUE_HEAD,
            message=f"node {where[0]}/{where[1]} is held for the head of queue {holder!r}; waiting for room "
                    "elsewhere", diagnostics={"heldFor": holder, "node": where[1], "cluster": where[0]})

    def _reserve(self, group, queue: str) -> None:
        wanted = [r for c in group.claims for r in requested_devices(c.spec)]
        if sum(n for _, n in wanted) < 2 or not wanted:
            return  # a one-device head needs no node held back: any freed device fits it
        cls = wanted[0][0]
        klass = self.engine.get_class(None, cls)
        if klass is None:
            return
        exprs = tuple(((s or {}).get("cel") or {}).get("expression", "")
                      for s in (klass.get("spec") or {}).get("selectors") or [])
        sel = self.engine.selector_set(cls, exprs, ())
        best: tuple[int, tuple[str, str]] | None = None
        for model in self.engine.clusters.values():
            for name in model.node_order:
                if (model.name, name) in self.held:
                    continue
                devices = [d for d in model.node_candidates(model.nodes[name]) if sel.evaluate(d) is MATCH]
                if len(devices) < sum(n for c, n in wanted if c == cls):
                    continue  # this node can never hold the head
                free = sum(1 for d in devices if self.engine.is_free(d))
                if best is None or free > best[0]:
                    best = (free, (model.name, name))
        if best is not None:
            self.held[best[1]] = queue
            group.holds_node, group.held_at = queue, best[1]  # kept for the next rounds (wake rows)


def round_screen(engine) -> RoundReservations:
    return RoundReservations(engine)

