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

Steps 2 and 3 run once per part of the batch (``claims.services.turns``): groups are split by the clusters
whose devices they may take, and each part is decided and committed under those clusters' turns, so workers
decide for different clusters at the same time and never for the same one (deterministic engines would pick
the same devices, and all but one would lose the race at commit).

Claims the engine could not place keep ``phase=Pending`` with a reason and the engine's diagnostics, and are
not retried until ``FleetState.version`` moves past the version they were tried at (devices were released or
the inventory changed) or the claim itself changes: the engine is deterministic, so retrying earlier would
only repeat the "no".
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
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, F, Func, Q, Subquery, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from claims import k8s
from claims.models import FleetState, PendingWake, Phase, ResourceClaim, WakeKey
from claims.placement import clusters_matching, node_pin
from claims.services import commit, external, fleet, holds, locking, queueing, turns, wake
from claims.services.engines import engines
from claims.services.grouping import Group, build_groups
from dra.cel import MAX_SELECTOR_COST, CostBudgetExhausted, CostMeter, metered
from dra.engine import AllocationError, ClaimGroup, GroupOutcome
from dra.engine.plan import claim_ref
from draservice import notify
from draservice.prepared import Prepared
from inventory.services import pool_warnings

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
    queueing.HELD_FOR_QUEUE_HEAD: "HeldForQueueHead",
    holds.HELD_FOR_DEFRAG: "HeldForDefragmentation",
}
# CEL cost units one group's allocation may spend in all (dra.cel's units; one evaluation's own limit is
# dra.cel.MAX_SELECTOR_COST). Deterministic, unlike a timer. Enough for any claim a person writes (a real
# selector costs at most ~200 per evaluation, the memo shares evaluations between identical devices, and even
# a per-device uuid selector over 40,000 GPUs costs about 160,000), and about 0.6 s of one worker at the worst
# (two evaluations at the per-evaluation limit), so a hostile claim cannot hold up the claims behind it.
GROUP_COST_BUDGET = 2 * MAX_SELECTOR_COST
LOST_RACE = "LostRace"
DEFERRED = "deferred"  # an outcome placeholder: not decided this round, retry at once
# How long a worker holds the claims it took while it decides (``taken_until``). A worker that dies (SIGKILL)
# mid-round leaves them taken this long; after that any worker takes them again.
TAKE_SECONDS = 30
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
    parts: int = 0  # parts decided under their own clusters' turns (claims.services.turns)

    def add(self, part: RoundResult) -> None:
        """Count a part's outcomes into the round's."""
        for name in ("allocated", "pending", "failed", "lost_race"):
            setattr(self, name, getattr(self, name) + getattr(part, name))
        self.changed_ids += part.changed_ids

    @property
    def should_retry_soon(self) -> bool:
        return bool(self.lost_race or self.left_out)


def fleet_version() -> int:
    state = FleetState.objects.filter(pk=1).values_list("version", flat=True).first()
    if state is None:
        FleetState.objects.get_or_create(pk=1)
        return 1
    return state


def bump_fleet_version() -> None:
    """The fleet changed in a way that may help any pending claim (inventory, classes, queues): every one
    becomes eligible again. Call inside the writer's txn. A release counts what it freed instead
    (``wake.released``) and wakes only the claims that could use it."""
    wake.bump_version(wake_all=True)


def undecided_pending(version=None):
    """Pending claims a round would decide now, taken ones included. ``version`` is not needed (kept for
    callers that pass the fleet version): a claim is eligible if it was never tried, every pending claim
    was woken since it was tried (``FleetState.wake_all_version``), or a release freed what it waits for."""
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING)
    if connection.vendor == "postgresql":
        # The eligible ids first, each part from an index (never tried / tried before the last wake-all by
        # claims_claim_attempted, woken by the wake rows), then only those rows. Asked as one OR over the
        # pending claims, the planner read and filtered every pending row: 4,000 of them to find the one a
        # release woke (about 30 ms of every round and of every empty round at the soak).
        qs = pending.filter(_InArray(F("id"), RawSQL(_candidates(), [Phase.PENDING, Phase.PENDING])))
    else:
        wake_all = Coalesce(Subquery(FleetState.objects.filter(pk=1).values("wake_all_version")[:1]), Value(1))
        woken = PendingWake.objects.filter(wake_at__lte=F("key__freed")).values("claim_id")
        qs = pending.filter(Q(attempted_version__isnull=True) | Q(attempted_version__lt=wake_all) | Q(id__in=woken))
    for annotation in sorted(external.EXTERNAL_ALLOCATOR_ANNOTATIONS):
        qs = qs.exclude(annotations__has_key=annotation)
    return qs


@functools.cache
def _candidates() -> str:
    """The same three parts as the ORM's OR below, as one fixed text: compiled from querysets (a union of
    three) it cost the worker more CPU than the rest of the take query."""
    table = {name: connection.ops.quote_name(model._meta.db_table) for name, model in (
        ("claim", ResourceClaim), ("fleet", FleetState), ("wake", PendingWake), ("key", WakeKey))}
    return ("SELECT id FROM {claim} WHERE phase = %s AND attempted_version IS NULL UNION ALL "
            "SELECT id FROM {claim} WHERE phase = %s AND attempted_version < "
            "COALESCE((SELECT wake_all_version FROM {fleet} WHERE id = 1), 1) UNION ALL "
            "SELECT w.claim_id FROM {wake} w JOIN {key} k ON k.key = w.key WHERE w.wake_at <= k.freed").format(**table)


class _InArray(Func):
    """``expr = ANY(ARRAY(subquery))`` (PostgreSQL): the subquery runs once, and the outer rows are found by
    index lookups of its values (an ``IN (subquery)`` may be planned as a scan of the outer table)."""

    arg_joiner = " = ANY(ARRAY"
    template = "(%(expressions)s))"
    output_field = BooleanField()


def eligible_pending(version=None):
    """Pending claims not tried since something that may help them changed, and not taken by a worker."""
    return undecided_pending(version).filter(_not_taken())


def allocate_round(batch_size: int = DEFAULT_BATCH, engine_seconds: float | None = None) -> RoundResult:
    """One round: take a batch (short transaction), then per part of it (``claims.services.turns``: its
    groups split by the clusters they may use, each part under those clusters' turns) decide with the engine
    (no transaction) and commit (short transaction). ``engine_seconds``: a part's engine time after which the
    rest of it is deferred."""
    started = time.perf_counter()
    locking.lock_seconds(reset=True)
    claims, version = take(batch_size)
    result = RoundResult(taken=len(claims))
    if not claims:
        return result
    leased = {c.id for c in claims}
    try:
        groups, left_out = build_groups(claims, take_members)
        groups = queueing.order(groups)  # priority, then fair share between queues
        leased |= {c.id for g in groups for c in g.claims}
        result.left_out = len(left_out)
        view = fleet.current_view()
        budget = ENGINE_SECONDS if engine_seconds is None else engine_seconds
        _decide_in_turns(view, groups, version, budget, result, leased)
    except IntegrityError as exc:
        # The unique index refused a row: something slipped past the checks. Nothing of that part was
        # written; its claims are untouched and eligible, so the next round decides them afresh.
        engines.reset()
        fleet.invalidate(hard=True)
        _unlease(leased)
        log.warning("allocation round rolled back by the unique index, retrying: %s", exc)
        return RoundResult(taken=result.taken, lost_race=result.taken, seconds=time.perf_counter() - started)
    except BaseException:
        engines.reset()  # its in-use state may now disagree with the database
        _unlease(leased)
        raise
    engines.settle()  # what the round left alive leaves the collector's generations (dra.engine.memory)
    result.seconds = time.perf_counter() - started
    result.lock_seconds = locking.lock_seconds()
    return result


def _decide_in_turns(view, groups: list[Group], version, budget: float, result: RoundResult,
                     leased: set[int]) -> None:
    """Decide and commit ``groups`` part by part, each under its clusters' turns (one part of all the groups,
    with no turn, on SQLite or with ``CLAIMS_CLUSTER_TURNS = False``)."""
    rows = fleet.rows_in_use()
    result.rows_read = fleet.rows_read_last()
    engine = engines.engine_for(view, rows)
    use_turns = turns.enabled()
    memo: dict[str, list[str]] = {}  # a queue repeats claim shapes: ask the engine once per shape
    parts = (turns.partition(groups, lambda g: _device_clusters(engine, view, g, memo), lambda g: g.by_quota)
             if use_turns else [turns.Part((), list(groups))])
    result.parts = len(parts)
    # Claims taken but in no group (members held elsewhere) are handed back with the first part's commit.
    rest = leased - {c.id for g in groups for c in g.claims}
    # One screen for the round: a queue's head found in one part holds its node for the parts after it.
    screen = holds.round_screen(engine, queueing.round_screen(engine))
    with closing(turns.schedule(parts)) as scheduled:
        for part, held in scheduled:
            if held and use_turns and part.clusters and not engines.poisoned:
                # Under the part's turns: count what other workers committed in its clusters meanwhile.
                rows = fleet.rows_in_use()
                result.rows_read += fleet.rows_read_last()
                engine = engines.engine_for(view, rows)
            mine = {c.id for g in part.groups for c in g.claims} | rest
            rest = set()
            if held:
                outcomes = _run_engine(engine, view, part.groups, time.perf_counter() + budget, screen)
            else:  # its turns stayed busy (turns.TURN_WAIT_SECONDS): hand it back undecided, retried soon
                outcomes = [DEFERRED] * len(part.groups)
            out = RoundResult()
            with transaction.atomic():
                commit.begin()
                _write(engine, view, rows, part.groups, outcomes, version, out, mine)
                changed = out.changed_ids
                # Waiters hear of the outcome; a follow-up round (lost races, deferred groups) is the task's.
                transaction.on_commit(lambda changed=changed: notify.publish(changed))
            result.add(out)
            # Selectors that failed on some device (which then matched nothing): the pool's operator hears once.
            pool_warnings.raise_selector_errors(pool_warnings.selector_errors_of(outcomes), view.cluster_versions)


def _device_clusters(engine, view: fleet.FleetView, group: Group, memo: dict[str, list[str]]) -> list[str]:
    """The clusters whose devices the engine may give ``group`` (every cluster when it cannot tell)."""
    if group.blocked:
        return []
    cg = engine_group(group, view)
    shape = _shape(cg) if len(group.claims) == 1 else None
    if shape is not None and shape in memo:
        return memo[shape]
    try:
        with metered(CostMeter(GROUP_COST_BUDGET)):
            clusters = engine.device_clusters(cg)
    except Exception:  # noqa: BLE001 -- a budget or engine error: the decision reports it; assume any cluster
        clusters = sorted(engine.clusters)
    if shape is not None:
        memo[shape] = clusters
    return clusters


def take(batch_size: int) -> tuple[list[ResourceClaim], int]:
    """The oldest eligible pending claims, marked taken by this worker (one short transaction).

    ``FOR UPDATE SKIP LOCKED`` plus ``taken_until``: concurrent workers get disjoint batches and never wait on
    each other, and no row lock is held while the engine runs. The fleet version comes with the claims, from
    the same statement snapshot: anything freed after it bumps the version past what we record, so nothing
    freed is ever missed.
    """
    with transaction.atomic():
        claims = _take_query(batch_size, frozenset(external.EXTERNAL_ALLOCATOR_ANNOTATIONS)).rows()
        if claims:
            _lease([c.id for c in claims])
    return claims, (claims[0].fleet_version if claims else 0)


@functools.lru_cache(maxsize=8)
def _take_query(batch_size: int, external_annotations: frozenset[str]) -> Prepared:
    """``take``'s statement, compiled once per batch size (and per thread and connection, by ``Prepared``):
    building and compiling this queryset cost every round, also the empty ones, several milliseconds of CPU."""

    def build():
        current = Subquery(FleetState.objects.filter(pk=1).values("version")[:1])
        # diagnostics (the largest column) is rewritten by every outcome and never read here. Labels are read
        # (queue resolution orders the round and admits its units): deferring them cost a second query.
        qs = (eligible_pending(Coalesce(current, Value(1))).select_related("namespace").defer("diagnostics")
              .annotate(fleet_version=Coalesce(current, Value(1))))
        if connection.vendor == "postgresql":
            # _no_flush_wait() without its own statement: evaluated for each row taken, so the transaction
            # commits without the WAL flush whenever it locked something (with no row it writes nothing).
            qs = qs.annotate(no_flush_wait=RawSQL("set_config('synchronous_commit', 'off', true)", []))
        return qs.order_by("id").select_for_update(skip_locked=True, of=("self",))[:batch_size]

    return Prepared(build, ())


def take_members(ids: list[int]) -> set[int]:
    """Mark pending claims outside the batch (members of a batch claim's group) taken; returns those taken.
    A member another worker holds is not returned: its group is left for a later round."""
    if not ids:
        return set()
    with transaction.atomic():
        _no_flush_wait()
        got = list(ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                   .filter(id__in=ids, phase=Phase.PENDING).filter(_not_taken()).values_list("id", flat=True))
        _lease(got)
    return set(got)


def _no_flush_wait() -> None:
    """A ``taken_until`` mark need not survive a crash (lost, the claim is simply not taken): do not wait for
    the WAL flush. Halves the durable commits per round (a few hundred per second is all this disk does)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def not_taken(now=None) -> Q:
    """Not taken by a live worker: never taken, the mark expired, or (PostgreSQL) the database session that
    took it is gone -- a worker killed mid-round frees its claims as soon as PostgreSQL drops its session,
    not only when ``TAKE_SECONDS`` have passed (a reused backend pid only delays that to the expiry)."""
    q = Q(taken_until__isnull=True) | Q(taken_until__lt=now or timezone.now())
    if connection.vendor == "postgresql":
        q |= ~Q(taken_by__in=RawSQL("SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL", []))
    return q


def taken_mark() -> dict:
    """The field values that mark a row taken by this worker's database session."""
    return {"taken_until": timezone.now() + timedelta(seconds=TAKE_SECONDS), "taken_by": _backend_pid()}


def _backend_pid() -> int | None:
    if connection.vendor != "postgresql":
        return None
    connection.ensure_connection()
    return connection.connection.info.backend_pid  # known to the driver: no round trip (one per round before)


def _not_taken() -> Q:
    return not_taken()


def _lease(ids: list[int]) -> None:
    ResourceClaim.objects.filter(id__in=ids).update(**taken_mark())


def _unlease(ids) -> None:
    try:
        ResourceClaim.objects.filter(id__in=list(ids), taken_until__isnull=False).update(taken_until=None)
    except Exception:  # the connection is gone (the caller re-raises): the marks expire by themselves
        log.warning("could not clear taken_until of %d claims; it expires in %ss", len(ids), TAKE_SECONDS)


def claim_object(claim: ResourceClaim) -> dict:
    return {"apiVersion": k8s.V1, "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace.name, "uid": str(claim.uid)},
            "spec": claim.spec}


def engine_group(group: Group, view: fleet.FleetView,
                 avoid: frozenset[tuple[str, str]] = frozenset()) -> ClaimGroup:
    allowed: set[str] | None = None
    for claim in group.claims:
        names = clusters_matching(claim.allowed_cluster_selector, view.cluster_labels)
        if names is not None:
            allowed = set(names) if allowed is None else allowed & set(names)
    if group.pin_cluster:
        allowed = {group.pin_cluster} if allowed is None else allowed & {group.pin_cluster}
    preferred = next((c.preferred_cluster for c in group.claims if c.preferred_cluster), None)
    # Allocated members pin the group first; else a claim's own node pin (its cluster pin comes with it).
    node = group.pin_node or next((pin for c in group.claims if (pin := node_pin(c.annotations))), None)
    return ClaimGroup(claims=[claim_object(c) for c in group.claims],
                      allowed_clusters=sorted(allowed) if allowed is not None else None,
                      preferred_cluster=preferred, node=node, key=group.key, avoid_nodes=avoid)


def _run_engine(engine, view: fleet.FleetView, groups: list[Group], deadline: float, screen=None) -> list:
    """One outcome per group (None for blocked groups), in order.

    A queue often holds many claims with the same spec ("one GPU", over and over). When one of them fails,
    the next with the same spec and hints fails too unless something was allocated in between (the engine is
    deterministic and only successes change its state during a round), so its outcome is reused instead of
    searching again. This is what keeps re-running a long pending queue after every release cheap.
    """
    outcomes = []
    failed: dict[str, tuple[int, object, ResourceClaim]] = {}  # shape -> (successes then, outcome, claim)
    if screen is None:
        screen = holds.round_screen(engine, queueing.round_screen(engine))
    successes = 0
    for group in groups:
        if group.blocked:
            outcomes.append(None)
            continue
        if engines.poisoned or time.perf_counter() > deadline:
            # Decided by a possibly inconsistent engine, or past the round's engine time: next round.
            outcomes.append(DEFERRED)
            continue
        cg = engine_group(group, view, screen.avoid(group))
        shape = _shape(cg) if len(group.claims) == 1 else None
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
            engines.poisoned = True  # its in-use state may be half-updated: rebuild after this round
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


def _shape(cg) -> str:
    return json.dumps([cg.claims[0]["spec"], cg.allowed_clusters, cg.preferred_cluster, cg.node], sort_keys=True)


def _same_failure(outcome, like: ResourceClaim, claim: ResourceClaim):
    """``outcome`` (the failure of ``like``) retold for ``claim``: same account, this claim's name in it."""
    pattern = re.compile(re.escape(f"{like.namespace.name}/{like.name}") + r"(?![A-Za-z0-9.-])")
    mine = f"{claim.namespace.name}/{claim.name}"
    message = pattern.sub(mine, outcome.message or "")
    diagnostics = json.loads(pattern.sub(mine, json.dumps(outcome.diagnostics))) if outcome.diagnostics else {}
    return dataclasses.replace(outcome, key=f"claim:{claim.uid}", message=message, diagnostics=diagnostics)


def _write(engine, view, rows_seen, groups, outcomes, version, result: RoundResult, leased: set[int]) -> None:
    """Commit the round's decisions (``claims.services.commit``) and record the other outcomes."""
    now = timezone.now()
    # Claims released, deleted or edited while the engine ran are left as they are now (and decided afresh).
    stale = commit.changed_claims([c for g in groups for c in g.claims])
    live = [(g, o) for g, o in zip(groups, outcomes, strict=True) if not any(c.id in stale for c in g.claims)]
    # Every claim of a live group is saved below with its outcome (``commit.record`` clears taken_until in the
    # same UPDATE); only the others are handed back here. Clearing all of them first wrote every row twice.
    recorded = {c.id for g, _ in live for c in g.claims}
    ResourceClaim.objects.filter(id__in=sorted(leased - recorded)).update(taken_until=None)
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
    committed = commit.commit(units, view, rows_seen, now)
    # Keep the cached engine in step: lost groups give their devices back; written rows are now counted.
    for i in committed.lost | set(committed.refused):
        engine.release(wins[i][1].devices)
    engines.note_written(committed.written)
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
                     "group": group.key if group.consumers else None})


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
