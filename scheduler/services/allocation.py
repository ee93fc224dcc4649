"""The allocation round: take pending claims, decide with the engine, commit the answers.

A round (``allocate_round``) has three steps, and only the last holds locks:

1. ``take``: up to ``batch_size`` eligible pending claims, oldest first, ``FOR UPDATE SKIP LOCKED`` and marked
   ``taken_until`` in one short transaction (concurrent workers get disjoint batches and never wait on each
   other; a worker that dies leaves its marks to expire);
2. group them by consumer (``grouping``), read the fleet view (cached snapshot) and the devices in use, and let
   one ``Engine`` decide the groups one after the other (each success is seen by the next group) -- with no
   transaction open and no lock held, so a slow decision (bounded by the CEL cost budgets and
   ``ENGINE_SECONDS``) never stalls another worker, an inventory push or an API write;
3. one short transaction: ``claims.services.commit`` checks that the claims and everything the decisions rely
   on are unchanged, writes the allocations, and the other outcomes are recorded.

Steps 2 and 3 run once per part of the batch (``scheduler.services.turns``): groups are split by the clusters
whose devices they may take, and each part is decided and committed under those clusters' turns, so workers
decide for different clusters at the same time and never for the same one (deterministic engines would pick
the same devices, and all but one would lose the race at commit).

Claims the engine could not place keep ``phase=Pending`` with a reason and the engine's diagnostics, and are
not retried until devices they could use were released (``claims.services.wake``: the round's wake-up step
wakes them), ``FleetState.version`` moves past the version they were tried at (the inventory, classes or
queues changed) or the claim itself changes: the engine is deterministic, so retrying earlier would only
repeat the "no".
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time
from contextlib import closing
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.utils import timezone

from claims.models import ResourceClaim
from claims.placement import claim_group, node_pin
from claims.services import commit, fleet, locking, taking, wake
from claims.services.engines import EngineSession
from claims.services.engines import session as engine_session

# The claims app's side of taking claims, used here and by the tests through this module.
from claims.services.taking import (  # noqa: F401
    TAKE_SECONDS,
    bump_fleet_version,
    claims_version,
    eligible_pending,
    fleet_version,
    not_taken,
    read_version,
    take,
    take_members,
    taken_mark,
    undecided_pending,
)
from dra.cel import MAX_SELECTOR_COST, CostBudgetExhausted, CostMeter, metered
from dra.engine import AllocationError, ClaimGroup, GroupOutcome
from dra.engine.plan import claim_ref
from draservice import notify
from inventory.services import pool_warnings
from queues.services import order as queue_order
from scheduler.services import admit, gang_holds, holds, queue_holds, turns, wakeups
from scheduler.services import reservations as booked
from scheduler.services.grouping import Group, build_groups

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500

# Engine input errors that are the claim's own fault: the claim fails for good. The others (a class not
# known yet, a pool being updated) can heal when the fleet changes, so the claim stays pending.
CEL_BUDGET = "cel_budget_exhausted"
TERMINAL_ERRORS = {"cel_error", "limit_exceeded", "feature_disabled", "invalid_claim", CEL_BUDGET}
REASONS = {
    "unsatisfiable": "Unsatisfiable",
    "search_budget_exceeded": "SearchBudgetExceeded",
    "no_eligible_cluster": "NoEligibleCluster",
    "invalid_pools": "InvalidPools",
    "selector_error_on_all_candidates": "SelectorErrorOnAllCandidates",
    "unknown_device_class": "UnknownDeviceClass",
    "cel_error": "CELError",
    "limit_exceeded": "LimitExceeded",
    "pool_being_updated": "PoolBeingUpdated",
    "feature_disabled": "FeatureDisabled",
    "invalid_claim": "InvalidClaim",
    "engine_error": "EngineError",
    CEL_BUDGET: "CELBudgetExceeded",
    queue_holds.HELD_FOR_QUEUE_HEAD: "HeldForQueueHead",
    holds.HELD_FOR_DEFRAG: "HeldForDefragmentation",
    booked.HELD_FOR_RESERVATION: "HeldForReservation",
    booked.WAITING_FOR_RESERVATION: "WaitingForReservation",
}
# CEL cost units one group's allocation may spend in all (dra.cel's units; one evaluation's own limit is
# dra.cel.MAX_SELECTOR_COST). Deterministic, unlike a timer. Enough for any claim a person writes (real
# selectors are far below the per-evaluation limit, and the memo shares evaluations between identical devices,
# so even a per-device selector over a large fleet fits), and bounded at two evaluations at the per-evaluation
# limit, so a hostile claim cannot hold up the claims behind it.
GROUP_COST_BUDGET = 2 * MAX_SELECTOR_COST
LOST_RACE = "LostRace"
DEFERRED = "deferred"  # an outcome placeholder: not decided this round, retry at once
# Engine time per round; groups not reached by then are deferred to the next round (decided at once, in
# order), so a batch of slow claims never holds up the commit of the ones already decided.
ENGINE_SECONDS = 1.0


@dataclass
class RoundResult:
    taken: int = 0
    allocated: int = 0
    pending: int = 0
    failed: int = 0
    lost_race: int = 0
    left_out: int = 0
    seconds: float = 0.0
    rows_read: int = 0  # database rows read to bring the devices in use up to date (change log + rows)
    lock_seconds: float = 0.0  # in statements that take locks other workers may hold (claims, clusters, devices)
    changed_ids: list[int] = field(default_factory=list)
    parts: int = 0  # parts decided under their own clusters' turns (scheduler.services.turns)

    def add(self, part: RoundResult) -> None:
        """Count a part's outcomes into the round's."""
        for name in ("allocated", "pending", "failed", "lost_race"):
            setattr(self, name, getattr(self, name) + getattr(part, name))
        self.changed_ids += part.changed_ids

    @property
    def should_retry_soon(self) -> bool:
        return bool(self.lost_race or self.left_out)


def allocate_round(batch_size: int = DEFAULT_BATCH, engine_seconds: float | None = None) -> RoundResult:
    """One round: take a batch (short transaction), then per part of it (``scheduler.services.turns``: its
    groups split by the clusters they may use, each part under those clusters' turns) decide with the engine
    (no transaction) and commit (short transaction). ``engine_seconds``: a part's engine time after which the
    rest of it is deferred."""
    started = time.perf_counter()
    locking.lock_seconds(reset=True)
    # Freed devices wake the first claims they can serve (a release alone wakes nobody); taken just below.
    wakeups.wake_for_released()
    gang_holds.kick_stale()  # a gang holding nodes at its queue's head is tried again once devices were freed
    claims, version = take(batch_size)
    result = RoundResult(taken=len(claims))
    if not claims:
        return result
    leased = {c.id for c in claims}
    # The session resets the engine if the round raises, and settles it when the round ends.
    with engine_session() as session:
        try:
            groups, left_out = build_groups(claims, take_members)
            if len(groups) > 1:
                groups = queue_order.order(groups)  # priority, then fair share between queues
            leased |= {c.id for g in groups for c in g.claims}
            result.left_out = len(left_out)
            view = fleet.current_view()
            budget = ENGINE_SECONDS if engine_seconds is None else engine_seconds
            _decide_in_turns(session, view, groups, version, budget, result, leased)
        except IntegrityError as exc:
            # The unique index refused a row: something slipped past the checks. Nothing of that part was
            # written; its claims are untouched and eligible, so the next round decides them afresh.
            session.invalidate()
            taking.clear_taken(leased)
            log.warning("allocation round rolled back by the unique index, retrying: %s", exc)
            return RoundResult(taken=result.taken, lost_race=result.taken, seconds=time.perf_counter() - started)
        except BaseException:
            taking.clear_taken(leased)
            raise
    result.seconds = time.perf_counter() - started
    result.lock_seconds = locking.lock_seconds()
    return result


def _decide_in_turns(session: EngineSession, view, groups: list[Group], version, budget: float,
                     result: RoundResult, leased: set[int]) -> None:
    """Decide and commit ``groups`` part by part, each under its clusters' turns (one part of all the groups,
    with no turn, on SQLite or with ``CLAIMS_CLUSTER_TURNS = False``)."""
    rows = fleet.rows_in_use()
    result.rows_read = fleet.rows_read_last()
    engine = session.engine_for(view, rows)
    use_turns = turns.enabled()
    memo = _clusters_memo(engine)  # a queue repeats claim shapes: ask the engine once per shape
    parts = (turns.partition(groups, lambda g: _device_clusters(engine, view, g, memo), lambda g: g.by_quota)
             if use_turns else [turns.Part((), list(groups))])
    result.parts = len(parts)
    # Claims taken but in no group (members held elsewhere) are handed back with the first part's commit.
    rest = leased - {c.id for g in groups for c in g.claims}
    # One screen for the round: a queue's head found in one part holds its node for the parts after it.
    reservations = queue_holds.round_screen(engine)
    screen = holds.round_screen(engine, reservations)
    screen = booked.round_screen(engine, screen)  # capacity held for reservations (scheduler.services.reservations)
    with closing(turns.schedule(parts)) as scheduled:
        for part, held in scheduled:
            if held and use_turns and part.clusters and not session.poisoned:
                # Under the part's turns: count what other workers committed in its clusters meanwhile.
                rows = fleet.rows_in_use()
                result.rows_read += fleet.rows_read_last()
                engine = session.engine_for(view, rows)
                reservations.refresh(engine)  # and the heads' holds they committed: see ``refresh``
            mine = {c.id for g in part.groups for c in g.claims} | rest
            rest = set()
            if held:
                outcomes = _run_engine(session, engine, view, part.groups, time.perf_counter() + budget, screen)
            else:  # its turns stayed busy (turns.TURN_WAIT_SECONDS): hand it back undecided, retried soon
                outcomes = [DEFERRED] * len(part.groups)
            out = RoundResult()
            with transaction.atomic():
                commit.begin()
                _write(session, engine, view, rows, part.groups, outcomes, version, out, mine)
                changed = out.changed_ids
                # Waiters hear of the outcome; a follow-up round (lost races, deferred groups) is the task's.
                transaction.on_commit(functools.partial(notify.publish, changed))
            result.add(out)
            # Selectors that failed on some device (which then matched nothing): the pool's operator hears once.
            pool_warnings.raise_selector_errors(pool_warnings.selector_errors_of(outcomes), view.cluster_versions)
    queue_holds.offer_given_up(reservations, groups)


CLUSTERS_MEMO_MAX = 10_000


def _clusters_memo(engine) -> dict[str, list[str]]:
    """``_device_clusters``' answers, kept on the engine: they come from static facts only (the engine's
    ``device_clusters``), and a fleet view that changes any of them (an inventory, a staleness, a label, the
    classes) gets a new engine. Asking again for every shape in every round cost more than the rest of the
    partition."""
    memo = getattr(engine, "_clusters_memo", None)
    if memo is None or len(memo) > CLUSTERS_MEMO_MAX:
        memo = engine._clusters_memo = {}
    return memo


def _device_clusters(engine, view: fleet.FleetView, group: Group, memo: dict[str, list[str]]) -> list[str]:
    """The clusters whose devices the engine may give ``group`` (every cluster when it cannot tell)."""
    if group.blocked:
        return []
    # Which clusters: what the engine's question is made of (the walltime does not matter), the question itself
    # built only for a shape not seen yet in the round.
    shape = _inputs(group) if len(group.claims) == 1 else None
    if shape is not None and shape in memo:
        return memo[shape]
    cg = engine_group(group, view)
    try:
        with metered(CostMeter(GROUP_COST_BUDGET)):
            clusters = engine.device_clusters(cg)
    except Exception:  # noqa: BLE001 -- a budget or engine error: the decision reports it; assume any cluster
        clusters = sorted(engine.clusters)
    if shape is not None:
        memo[shape] = clusters
    return clusters


def engine_group(group: Group, view: fleet.FleetView,
                 avoid: frozenset[tuple[str, str]] = frozenset()) -> ClaimGroup:
    return claim_group(group.claims, view.cluster_labels, key=group.key, pin_cluster=group.pin_cluster,
                       pin_node=group.pin_node, avoid=avoid)


def _run_engine(session: EngineSession, engine, view: fleet.FleetView, groups: list[Group], deadline: float,
                screen=None) -> list:
    """One outcome per group (None for blocked groups), in order.

    A queue often holds many claims with the same spec ("one GPU", over and over). When one of them fails,
    the next with the same spec and hints fails too unless something was allocated in between (the engine is
    deterministic and only successes change its state during a round), so its outcome is reused instead of
    searching again. This is what keeps re-running a long pending queue after every release cheap.
    """
    outcomes: list = []
    failed: dict[str, tuple[int, object, ResourceClaim]] = {}  # shape -> (successes then, outcome, claim)
    if screen is None:
        screen = booked.round_screen(engine, holds.round_screen(engine, queue_holds.round_screen(engine)))
    successes = 0
    for group in groups:
        if group.blocked:
            outcomes.append(None)
            continue
        if session.poisoned or time.perf_counter() > deadline:
            # Decided by a possibly inconsistent engine, or past the round's engine time: next round.
            outcomes.append(DEFERRED)
            continue
        cg = engine_group(group, view, screen.avoid(group))
        shape = _shape(group.claims[0], cg, group.claims[0].lease_seconds) if len(group.claims) == 1 else None
        hit = failed.get(shape) if shape else None
        if hit is not None and hit[0] == successes:
            outcomes.append(_same_failure(hit[1], hit[2], group.claims[0]))
            continue
        try:
            # Every CEL evaluation of this group's search shares one budget (each also has its own): a claim
            # whose selector is cheap per device but read over thousands of devices is stopped too.
            with metered(CostMeter(GROUP_COST_BUDGET)):
                outcome = engine.allocate(cg, raise_errors=False)
                if cg.avoid_nodes and not outcome.allocated and outcome.error is None:
                    # Nowhere but on held nodes, maybe: ask again with them, and the screen below reports the
                    # group held (it waits for the holder) rather than merely unsatisfiable.
                    outcome = engine.allocate(dataclasses.replace(cg, avoid_nodes=frozenset()), raise_errors=False)
        except CostBudgetExhausted as exc:
            # The engine's in-use state is untouched: a search works on its own local picks and commits only
            # on success, and an exhausted budget is never memoised. So the groups after it go on as usual.
            outcome = _over_budget(cg, exc)
        except Exception as exc:  # an engine bug must not wedge the queue: park this group, go on
            log.exception("engine failed on group %s", cg.key)
            outcome = GroupOutcome(allocated=False, key=cg.key, reason="engine_error",
                                   message=f"internal error in the allocation engine: {exc!r}")
            session.poison()  # its in-use state may be half-updated: rebuild after this round
        outcome = screen(group, outcome)  # a queue head's reserved node is not given to a claim behind it
        if outcome.allocated:
            successes += 1
        elif shape and outcome.error is None:
            failed[shape] = (successes, outcome, group.claims[0])
        outcomes.append(outcome)
    return outcomes


def _over_budget(cg: ClaimGroup, exc: CostBudgetExhausted) -> GroupOutcome:
    """The group's CEL work ran out of its budget: deterministic, so a final failure, not a retry."""
    message = (f"allocation stopped: {exc.reason}; the selectors cost too much to evaluate over the fleet "
               "(simplify them or narrow them with a cheaper first condition)")
    error = AllocationError(CEL_BUDGET, message, claim=claim_ref(cg.claims[0]))
    return GroupOutcome(allocated=False, key=cg.key, reason=CEL_BUDGET, message=message, error=error)


def _shape(claim: ResourceClaim, cg, walltime: int | None) -> str:
    # The nodes it avoids are part of it: a queue head decided again gives its held node up (queue_holds), so an
    # alike claim's failure before it (held off that node) is not its answer. So is its walltime: the screens
    # let a claim onto held capacity by when it ends (backfill, reservations), so an alike claim that ends
    # later (or never) being held off is not the answer of one that ends sooner.
    return _spec_key(claim) + json.dumps([cg.allowed_clusters, cg.preferred_cluster, cg.node,
                                          sorted(cg.avoid_nodes), walltime])


def _inputs(group: Group) -> str:
    """What ``engine_group`` makes the question of a one-claim group from, as one string (the fleet view's
    cluster labels are the round's)."""
    claim = group.claims[0]
    return _spec_key(claim) + json.dumps([claim.allowed_cluster_selector, claim.preferred_cluster,
                                          node_pin(claim.annotations), group.pin_cluster, group.pin_node],
                                         sort_keys=True)


def _spec_key(claim: ResourceClaim) -> str:
    """The claim's spec as canonical JSON, kept on the claim for its round: a group's shape is asked for twice
    (its clusters, its decision)."""
    key = getattr(claim, "_spec_key", None)
    if key is None:
        key = claim._spec_key = json.dumps(claim.spec, sort_keys=True)  # type: ignore[attr-defined]
    return key


def _same_failure(outcome, like: ResourceClaim, claim: ResourceClaim):
    """``outcome`` (the failure of ``like``) retold for ``claim``: same account, this claim's name in it."""
    pattern = re.compile(re.escape(f"{like.namespace.name}/{like.name}") + r"(?![A-Za-z0-9.-])")
    mine = f"{claim.namespace.name}/{claim.name}"
    message = pattern.sub(mine, outcome.message or "")
    diagnostics = json.loads(pattern.sub(mine, json.dumps(outcome.diagnostics))) if outcome.diagnostics else {}
    return dataclasses.replace(outcome, key=f"claim:{claim.uid}", message=message, diagnostics=diagnostics)


def _write(session: EngineSession, engine, view, rows_seen, groups, outcomes, version, result: RoundResult,
           leased: set[int]) -> None:
    """Commit the round's decisions (``claims.services.commit``) and record the other outcomes."""
    now = timezone.now()
    # Claims released, deleted or edited while the engine ran are left as they are now (and decided afresh).
    stale = commit.changed_claims([c for g in groups for c in g.claims])
    live = [(g, o) for g, o in zip(groups, outcomes, strict=True) if not any(c.id in stale for c in g.claims)]
    # Every claim of a live group is saved below with its outcome (``commit.record`` clears taken_until in the
    # same UPDATE); only the others are handed back here. Clearing all of them first wrote every row twice.
    recorded = {c.id for g, _ in live for c in g.claims}
    taking.hand_back(leased - recorded)
    unwritten = False  # devices the engine handed out this round but that are not written
    for g, o in zip(groups, outcomes, strict=True):
        # Decided for claims released or edited meanwhile, so not written: give the devices back to the cached
        # engine, which would otherwise count them in use until it is rebuilt (found by benchmarks/soak_bench).
        if o is not None and o is not DEFERRED and o.allocated and any(c.id in stale for c in g.claims):
            engine.release(o.devices)
            unwritten = True
    result.lost_race += sum(len(g.claims) for g, _ in zip(groups, outcomes, strict=True)
                            if any(c.id in stale for c in g.claims))
    wins = [(g, o) for g, o in live if o is not None and o is not DEFERRED and o.allocated]
    units = [commit.Unit([_placement(g, o)]) for g, o in wins]
    for group, _ in live:
        for claim in group.claims:
            commit.touch_attempt(claim, now)
    committed = admit.commit(units, view, rows_seen, now)
    # Keep the cached engine in step: lost groups give their devices back; written rows are now counted.
    for i in committed.lost | set(committed.refused):
        engine.release(wins[i][1].devices)
    session.note_written(committed.written)
    lost_groups = {id(wins[i][0]) for i in committed.lost}
    refused = {id(wins[i][0]): v for i, v in committed.refused.items()}
    won_groups = {id(g) for g, _ in wins} - lost_groups - set(refused)
    events: list = []
    updated: list[ResourceClaim] = []
    for group, outcome in live:
        if id(group) in refused:
            commit.set_waiting_for_quota(group.claims, refused[id(group)], version, now, events)
            result.pending += len(group.claims)
            updated.extend(group.claims)
        elif id(group) not in won_groups:
            # Devices a refused unit held in this round's engine were not there for the groups after it: they
            # are decided again next round rather than waiting for the fleet to change (no queue blocks another).
            # Likewise devices of lost or stale units: no release will announce them (claims.services.wake).
            retry = refused or lost_groups or unwritten
            _record_outcome(group, outcome, id(group) in lost_groups, None if retry else version, now, result,
                            events)
            updated.extend(group.claims)
        else:
            result.allocated += len(group.claims)
    commit.record(updated, events)
    result.changed_ids = [c.id for c in updated] + [c.id for c in committed.allocated]


def _placement(group: Group, outcome) -> commit.Placement:
    where = f"{outcome.cluster}/{outcome.node}" if outcome.node else outcome.cluster
    return commit.Placement(
        claims=group.claims, allocations=[co.allocation if co else None for co in outcome.claims],
        cluster=outcome.cluster or "", node=outcome.node or "", message=f"allocated on {where}",
        diagnostics={"allocated": True, "cluster": outcome.cluster, "node": outcome.node or None,
                     "group": group.key if group.consumers else None,
                     # A backfill into a held node (scheduler.services.backfill): the renewal guard reads it.
                     **({"backfill": outcome.diagnostics["backfill"]} if "backfill" in outcome.diagnostics else {}),
                     # Placed through a reservation (scheduler.services.reservations): admitted by it, not the queue.
                     **({k: outcome.diagnostics[k] for k in ("reservation",) if k in outcome.diagnostics})})


def _record_outcome(group: Group, outcome, lost: bool, version, now, result: RoundResult, events: list) -> None:
    if group.blocked:
        commit.set_pending(group.claims, group.blocked, group.blocked_message, None, version, now, events)
        result.pending += len(group.claims)
    elif outcome is DEFERRED:
        commit.set_pending(group.claims, "Deferred", "not decided in this round; retrying", None, None, now, events)
        result.lost_race += len(group.claims)
    elif lost:
        commit.set_pending(group.claims, LOST_RACE, "another allocation took a device first; retrying", None,
                           None, now, events)
        result.lost_race += len(group.claims)
    elif outcome.error is not None:
        code = outcome.error.code
        reason = REASONS.get(code, "AllocationError")
        if code in TERMINAL_ERRORS:
            commit.set_failed(group.claims, outcome.error, reason, version, now, events)
            result.failed += len(group.claims)
        else:
            commit.set_pending(group.claims, reason, outcome.error.message, {"error": outcome.error.to_dict()},
                               version, now, events)
            result.pending += len(group.claims)
    else:
        diag = {"reason": outcome.reason, "message": outcome.message, "diagnostics": outcome.diagnostics}
        # Woken only by a release that frees what it lacks (or by a change to the fleet itself).
        commit.set_pending(group.claims, REASONS.get(outcome.reason, "Unsatisfiable"), outcome.message, diag,
                           version, now, events, wake_keys=wake.wants(outcome), head_of=group.holds_node,
                           hold=group.held_at)
        result.pending += len(group.claims)
