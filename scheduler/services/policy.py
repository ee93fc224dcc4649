"""Which running claims a pending claim may preempt, in Kueue's terms (``Queue.spec.preemption`` and
``spec.fairSharing.preemptionStrategies``; queues/README.md, "Preemption").

- Its own queue's claims, ``withinQueue``: ``LowerPriority`` (lower priority only), ``LowerOrNewerEqualPriority``
  (also equal priority created after it), ``Never``.
- Claims of other queues that borrow (use beyond their nominal of the contested unit), when the claim stays
  within its own nominal: ``reclaimWithinCohort``: ``Any`` (any priority), ``LowerPriority``, ``Never``.
- When the claim must borrow itself: with ``fairSharing.preemptionStrategies``, claims of borrowing queues whose
  share stays at least the preemptor's (below); otherwise ``borrowWithinCohort: {policy: LowerPriority,
  maxPriorityThreshold}``: lower-priority claims of borrowing queues, up to the threshold.

Fair-share strategies compare shares where the two queues meet: the preemptor's queue and the victim's, or
their ancestors directly under their lowest common ancestor (siblings at that level). A node's share is what
its subtree uses beyond the node's nominal, over the contested unit's total, over its weight; a queue with a
half-life mixes in its subtree's decayed past use measured against the order's capacity, as the fair-share
order does. ``LessThanOrEqualToFinalShare``: the preemptor's share with the claim admitted is
at most the victim queue's share without the victim; ``LessThanInitialShare``: strictly less than the victim
queue's share before. Strategies are tried in order: the victims are found with the first alone, and only if
that finds no set, with the first or the second. Each is checked as victims are taken (the victim queue's
share falls with each), so a queue is never taken below the preemptor's share: with weights 1:1 the two
queues meet at an equal split and stay there (the requeued victims cannot take it back).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction

from queues import fair_share
from queues import spec as queue_spec
from queues.models import Queue
from queues.services.resolve import Tree

LESS_OR_EQUAL_FINAL = "LessThanOrEqualToFinalShare"
LESS_INITIAL = "LessThanInitialShare"


def reclaim_within_cohort(policy: dict) -> str:
    """``reclaimWithinCohort``, or the old ``reclaimBorrowed`` of a spec stored before it (Always: Any)."""
    if "reclaimWithinCohort" in policy:
        return policy["reclaimWithinCohort"]
    return queue_spec.RECLAIM_BORROWED.get(policy.get("reclaimBorrowed", "Always"), "Any")


class Policy:
    """What ``queue``'s pending claim (priority ``mine``, created ``created_at``) may preempt, for one decision:
    ``within`` says whether it stays within its nominal of the contested unit."""

    def __init__(self, queue: Queue, mine: int, created_at, within: bool) -> None:
        policy = queue.spec.get("preemption") or {}
        self.queue, self.mine, self.created_at, self.within = queue, mine, created_at, within
        self.within_queue = policy.get("withinQueue", "LowerPriority")
        self.reclaim = reclaim_within_cohort(policy) if within else "Never"
        self.strategies = [] if within else queue_spec.preemption_strategies(queue.spec)
        borrow = policy.get("borrowWithinCohort") or {}
        self.borrow = borrow.get("policy", "Never") if not within and not self.strategies else "Never"
        self.threshold = borrow.get("maxPriorityThreshold")

    @property
    def other_queues(self) -> bool:
        """Whether claims of other (borrowing) queues are candidates at all."""
        return self.reclaim != "Never" or bool(self.strategies) or self.borrow != "Never"

    @property
    def own_queue(self) -> bool:
        return self.within_queue != "Never"

    def admits(self, victim, victim_queue: Queue, prio: int) -> bool:
        """The checks that do not change as victims are taken: priorities and ages."""
        if victim_queue.id == self.queue.id:
            if self.within_queue == "LowerPriority":
                return prio < self.mine
            newer = self.created_at is not None and victim.created_at is not None and victim.created_at > \
                self.created_at
            return self.within_queue == "LowerOrNewerEqualPriority" and (prio < self.mine or (prio == self.mine
                                                                                               and newer))
        if self.reclaim == "LowerPriority" or self.borrow == "LowerPriority":
            return prio < self.mine and (self.borrow == "Never" or self.threshold is None or prio <= self.threshold)
        return True


class FairShares:
    """Shares of one contested unit over the queue tree: ``used`` is the leaf queues' use (queue id -> amount,
    as the greedy choice leaves it), ``nominal`` each queue's nominal of the unit, ``total`` what a share is a
    part of (the unit's use and nominal summed over the queues, as the fair-share order takes it). A queue that
    remembers its past use (``fairSharing.halfLifeSeconds``) is weighed by the effective share the order uses
    (``queues.fair_share``), its subtree's decayed usage ``decayed`` (queue name -> device-seconds) mixed in;
    the others by what they borrow now, over the same total. ``capacity``: what past use is measured against,
    the order's (``queues.services.order.Shares.capacity``) so that both weigh a queue's history alike."""

    def __init__(self, tree: Tree, nominal: dict[int, Fraction], total: Fraction = Fraction(1),
                 decayed: dict[str, float] | None = None, capacity: float = 1.0) -> None:
        self.by_id = {q.id: q for q in tree.queues.values()}
        self.nominal = nominal
        self.total = max(total, Fraction(1))
        self.decayed = decayed or {}
        self.capacity = capacity
        self.children: dict[int | None, list[int]] = defaultdict(list)
        for q in tree.queues.values():
            self.children[q.parent_id].append(q.id)

    def ancestors(self, qid: int) -> list[int]:
        """``qid`` and its ancestors, leaf first."""
        out: list[int] = []
        at: int | None = qid
        while at is not None and at not in out and at in self.by_id:
            out.append(at)
            at = self.by_id[at].parent_id
        return out

    def meet(self, a: int, b: int) -> tuple[int, int]:
        """The nodes where ``a`` and ``b`` are compared: themselves, or their ancestors just under their lowest
        common ancestor."""
        up_a, up_b = self.ancestors(a), self.ancestors(b)
        common = set(up_a) & set(up_b)
        below_a = [q for q in up_a if q not in common]
        below_b = [q for q in up_b if q not in common]
        return (below_a[-1] if below_a else a), (below_b[-1] if below_b else b)

    def subtree_used(self, node: int, used: dict[int, Fraction]) -> Fraction:
        total, stack = Fraction(0), [node]
        while stack:
            at = stack.pop()
            total += used.get(at, Fraction(0))
            stack.extend(self.children.get(at, []))
        return total

    def share(self, node: int, used: dict[int, Fraction], extra: Fraction = Fraction(0)) -> Fraction | float:
        borrowed = self.subtree_used(node, used) + extra - self.nominal.get(node, Fraction(0))
        weight = Fraction(self.by_id[node].weight).limit_denominator(1000)
        now = max(borrowed, Fraction(0)) / self.total
        queue = self.by_id[node]
        if not queue_spec.half_life(queue.spec):
            return now / weight
        remembered = [(self.decayed.get(self.by_id[q].name, 0.0), float(queue_spec.half_life(self.by_id[q].spec)))
                      for q in self._subtree(node)]
        history = fair_share.history_share(remembered, self.capacity)
        return fair_share.effective_share(float(now), history, float(weight))

    def _subtree(self, node: int) -> list[int]:
        out, stack = [], [node]
        while stack:
            at = stack.pop()
            out.append(at)
            stack.extend(self.children.get(at, []))
        return out


def strategy_checks(shares: FairShares, own: int, incoming: Fraction,
                    strategies: list[str]) -> list[Callable]:
    """One predicate per round of the greedy choice: the first strategy alone, then the first or the second.
    A predicate takes (victim queue id, victim amount, use as the choice leaves it) and says whether that
    victim may be taken next. ``incoming``: what the preemptor (and what is being reclaimed for its queue) adds
    to its queue's use."""
    def check(names: list[str]) -> Callable:
        def allowed(vqid: int, amount: Fraction, used: dict[int, Fraction]) -> bool:
            if used.get(vqid, Fraction(0)) <= shares.nominal.get(vqid, Fraction(0)):
                return False  # that queue no longer borrows: what it holds is its own
            a, b = shares.meet(own, vqid)
            mine = shares.share(a, used, incoming)
            before = shares.share(b, used)
            after = shares.share(b, used, -amount)
            return any((mine <= after) if name == LESS_OR_EQUAL_FINAL else (mine < before) for name in names)
        return allowed
    return [check(strategies[:i]) for i in range(1, len(strategies) + 1)]
