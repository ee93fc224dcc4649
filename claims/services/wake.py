"""Targeted wake-ups: a release makes eligible only the pending claims the freed devices could serve.

A claim the engine could not place waits (``PendingWake`` rows) for a counter of released devices
(``WakeKey``) to reach a mark. The keys are ``cluster:<name>``, one per cluster where devices matching
the claim's selectors exist (the engine's explanation counts them), and ``*``, which every release moves. The
mark is the counter when the claim was tried plus the devices it is short of in that cluster: ``count`` minus
the most one node of it could use then (its best node's devices plus the cluster's network-attached ones:
a group is placed on one node), for its request hardest to serve (at least 1). A claim that could fit now is
always woken:

* it fits on some node of some cluster C, so every request's devices match in C: each request has a row on C;
* the devices available to a request on that node now are at most those available to it then plus those
  released in C since (a released exclusive device makes at most itself available); so C's counter moved by
  at least the shortfall, and by at least 1 (the engine is deterministic: with nothing freed the answer is
  the same "no").

Where that bound does not hold (devices blocked by shared counters or consumable capacity, where one release
can make several devices available; taints, stale clusters, incomplete pools, which change without a
release) or the explanation is missing (consumers' errors, held groups, quota) or sampled (cut by the engine's
explanation budget: it counted only part of the available devices), the claim waits for ``*``:
any release wakes it, as every release did before. Inventory, class and queue changes wake every pending
claim (``FleetState.wake_all_version``).

The counters only say which claims a release *could* help (``candidates``): a release does not make them
eligible by itself. It leaves one insert-only ``ReleasedDevice`` row per freed device (``offer``), and the
round's wake-up step (``scheduler.services.wakeups``) wakes only the first few candidates in the scheduler's
order that the device can serve (``wake_claims``), so a release costs O(1) decisions, not O(pending).

Nothing a release writes is a row another release writes: it counts what it freed in insert-only
``FreedCount`` rows (``released_sql``), and a counter is its ``WakeKey.freed`` plus those rows; the worker
folds them into ``freed`` now and then (``roll_up``), which leaves every counter as it was. ``FleetState``
is moved only by the changes that wake every pending claim (``bump_version``), never by a release. (On SQLite,
one writer at a time, a release adds to ``WakeKey.freed`` itself: ``released``.)

Race: a round reads ``FleetState.version`` with its claims (a wake-all committed after that moves
``wake_all_version`` past it), and the counters (``Version.freed``) after taking them and before reading the devices
in use, so whatever those counters include, the engine saw. A claim's marks count from the counters read
again in the committing transaction: where one has grown since the take, a release committed that the
engine may not have seen, and the claim is retried at once instead; a release committed after that read
moves the counter past the recorded base, so it counts. (Counters only grow, and a release moves each of its
keys by at least one device: growth is exactly "a release committed since".)
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.db import connection
from django.db.models import F, Subquery

from claims import claims_sql
from claims.models import FleetState, FreedCount, PendingWake, Phase, ReleasedDevice, ResourceClaim, WakeKey
from dra.engine.diagnostics import BEST_NODES_LISTED
from inventory.models import Device

ANY = "*"
ANY_RELEASE = ((ANY, 1),)
ROLL_UP_ROWS = 10_000  # FreedCount rows one roll_up folds (a round's statement stays bounded after a burst)
# A process folds the releases' counts at most this often from its rounds (``roll_up_soon``): the rows left
# meanwhile are a few per release, and reading a counter sums them.
ROLL_UP_SECONDS = 1.0
_rolled_up_at = [float("-inf")]  # when this process last folded (monotonic)


class Version(int):
    """The version pending claims are stamped with (``FleetState.version``) and the wake counters read with it
    (``freed``, by key): what a claim decided at this version waits for counts from them (``store``)."""

    freed: Mapping[str, int]

    def __new__(cls, value: int, freed: Mapping[str, int]) -> Version:
        out = super().__new__(cls, value)
        out.freed = freed
        return out


# Drop-out stages that can change without a release in the claim's clusters (see the module docstring).
VOLATILE = ("cluster_stale", "pool_incomplete", "pool_invalid", "taint", "counters", "capacity",
            "binding_conditions_unsupported", "counters_unsupported")


def cluster_key(cluster: str) -> str:
    return f"cluster:{cluster}"


def wants(outcome) -> tuple[tuple[str, int], ...]:
    """(key, devices short) a failed group waits for, from the engine's explanation; ``ANY_RELEASE`` when
    it does not tell; empty when no device anywhere matches a request (only an inventory change can help)."""
    if getattr(outcome, "reason", None) == "selector_error_on_all_candidates":
        return ()  # nothing but devices its selectors fail on: only an inventory or class change can help
    if outcome is None or getattr(outcome, "reason", None) != "unsatisfiable":
        return ANY_RELEASE
    requests = (outcome.diagnostics or {}).get("requests") or []
    if not requests:
        return ANY_RELEASE
    per_request: dict[tuple, list[tuple[str, int]]] = {}
    for r in requests:
        dropped = r.get("dropped") or {}
        if "clusters_matching" not in r or r.get("sampled") or any(dropped.get(s) for s in VOLATILE):
            return ANY_RELEASE
        count = r.get("count")
        short = 1 if count is None else max(1, count - int(r.get("available") or 0))
        # firstAvailable alternatives ("req/sub") of one request: any of them may be the one that fits.
        rows = per_request.setdefault((r.get("claim"), str(r.get("request", "")).split("/")[0]), [])
        rows.extend((cluster_key(c), short if count is None else max(short, count - _most_on_one_node(r, c)))
                    for c in r["clusters_matching"])
    if any(not rows for rows in per_request.values()):
        return ()  # a request no device matches: only an inventory or class change can help
    # A fit needs every request, so waiting for one of them is enough: the one hardest to serve.
    hardest = max(per_request.values(), key=lambda rows: (min(n for _, n in rows), -len(rows)))
    return tuple(dict.fromkeys(hardest))


def _most_on_one_node(request: dict, cluster: str) -> int:
    """At most how many devices available to ``request`` one node of ``cluster`` can use now: its best node's
    own plus the cluster's network-attached ones. A group is placed on one node, so the cluster must free at
    least ``count`` minus this before the request can fit there: a claim for more devices than any node has
    free (16 asked, 8 per node) is not woken by every single release. ``best_nodes`` lists the top few of
    "cluster/node" and "cluster/(network)" by count, highest first; one not listed has at most the last count
    listed (none, when the list is not full)."""
    listed = request.get("best_nodes") or []
    floor = int(listed[-1]["available"]) if len(listed) >= BEST_NODES_LISTED else 0
    node = network = None
    for entry in listed:
        where, available = str(entry["node"]), int(entry["available"])
        if where == f"{cluster}/(network)":
            network = available
        elif node is None and where.startswith(f"{cluster}/"):
            node = available  # the first of the cluster's nodes listed is its best
    return (floor if node is None else node) + (floor if network is None else network)


def mark(claims, version, keys, head_of: str = "", hold: tuple[str, str] | None = None) -> None:
    """Note on ``claims`` (in memory) what they wait for; written by ``store`` with the claims.

    ``head_of``: the group is its queue's head and held a node this round (scheduler.services.queue_holds).
    The hold lasts only for rounds that decide the head, so the head is woken by any release where it could
    go, however many devices it lacks -- the oldest such head of a queue only: a round that did not take the
    older head made a younger claim its head, which waits by its count again."""
    for claim in claims:
        claim._wake_keys = () if version is None else tuple(keys if keys is not None else ANY_RELEASE)
        claim._wake_head = head_of
        claim._wake_hold = hold if head_of else None


def store(claims) -> None:
    """Replace the ``PendingWake`` rows of ``claims`` (call in the transaction that saves them, before
    the save: a claim a release overtook gets ``attempted_version = None``)."""
    if not claims:
        return
    PendingWake.objects.filter(claim_id__in=[c.id for c in claims]).delete()
    waiting = [c for c in claims if c.phase == Phase.PENDING and c.attempted_version is not None]
    for c in waiting:
        if not hasattr(c, "_wake_keys"):  # pending by another path (a consumer's claim failed): any release
            c._wake_keys = ANY_RELEASE
    keys = sorted({k for c in waiting for k, _ in c._wake_keys})
    if not keys:
        return
    WakeKey.objects.bulk_create([WakeKey(key=k) for k in keys], ignore_conflicts=True)
    now = counters(keys)
    rows: list[PendingWake] = []
    for c in waiting:
        wanted = c._wake_keys
        # The counters read with the version the claim was decided at (a ``Version``, as ``take`` returns it);
        # a bare number read without them: any release since may be unseen.
        then = getattr(c.attempted_version, "freed", None)
        if then is None or any(now.get(k, 0) > then.get(k, 0) for k, _ in wanted):
            c.attempted_version = None  # released after this claim was read: maybe not seen, decide again
            continue
        head = getattr(c, "_wake_head", "")
        cluster, node = getattr(c, "_wake_hold", None) or ("", "")
        rows.extend(PendingWake(claim_id=c.id, key_id=k, wake_at=now.get(k, 0) + (1 if head else short),
                                short=short, head_of=head, hold_cluster=cluster, hold_node=node)
                    for k, short in wanted)
    PendingWake.objects.bulk_create(rows)
    for queue in sorted({r.head_of for r in rows if r.head_of}):
        oldest = PendingWake.objects.filter(head_of=queue).order_by("claim_id").values("claim_id")[:1]
        PendingWake.objects.filter(head_of=queue, claim_id__gt=Subquery(oldest)).update(
            wake_at=F("wake_at") - 1 + F("short"), head_of="", hold_cluster="", hold_node="")


def _counters_sql(where: str) -> str:
    """(key, counter) of the keys ``where`` selects (a condition on ``key``): rolled-up and not yet."""
    keys = connection.ops.quote_name(WakeKey._meta.db_table)
    counts = connection.ops.quote_name(FreedCount._meta.db_table)
    return (f"SELECT key, sum(n) AS freed FROM (SELECT key, freed AS n FROM {keys} WHERE {where} "
            f"UNION ALL SELECT key, freed FROM {counts} WHERE {where}) parts GROUP BY key")


def counters(keys: list[str] | None = None) -> dict[str, int]:
    """The wake counters of ``keys`` (every key when None): devices released under each, ever. One statement:
    read in one snapshot, so a roll-up committing meanwhile is seen whole or not at all."""
    if keys is None:
        where, params = "1 = 1", []
    elif not keys:
        return {}
    else:
        where = "key IN (" + ", ".join(["%s"] * len(keys)) + ")"
        params = list(keys) * 2
    with connection.cursor() as cursor:
        cursor.execute(_counters_sql(where), params)
        return {key: int(n) for key, n in cursor.fetchall()}


def read_version(version: int) -> Version:
    """``version`` (the claims' version, just read with them) with the counters as of now: call it before the
    devices in use are read, so that the engine sees every release they include."""
    return Version(version, counters())


def clock_sql() -> str:
    """A scalar SQL expression that moves with every change that may free devices or wake claims: the claims'
    version plus every device ever released (the ``*`` counter). Both parts only grow, so a release or a
    wake-all committed after one read makes every later read larger (gangs and estimates retry on it)."""
    fleet = connection.ops.quote_name(FleetState._meta.db_table)
    every = _counters_sql(f"key = '{ANY}'")  # a constant: no parameter, so the expression can go anywhere
    return (f"(COALESCE((SELECT version FROM {fleet} WHERE id = 1), 1) "
            f"+ COALESCE((SELECT sum(every.freed) FROM ({every}) every), 0))")


def roll_up_soon() -> int:
    """``roll_up``, unless this process did so less than ``ROLL_UP_SECONDS`` ago (then 0)."""
    now = time.monotonic()
    if now - _rolled_up_at[0] < ROLL_UP_SECONDS:
        return 0
    _rolled_up_at[0] = now
    return roll_up()


def roll_up(limit: int = ROLL_UP_ROWS) -> int:
    """Fold up to ``limit`` ``FreedCount`` rows into their keys' ``freed`` (``claims_sql.fold_freed_counts``:
    every counter stays as it was). The worker runs this, never a release: it updates the shared ``WakeKey``
    rows. Returns the rows folded."""
    return claims_sql.fold_freed_counts(limit)


def forget(claim_ids) -> None:
    PendingWake.objects.filter(claim_id__in=list(claim_ids)).delete()


def forget_sql() -> str:
    """``forget`` as one PostgreSQL statement on ``%(ids)s`` (a list of claim ids), for a caller that runs it
    with its own statements (``claims.services.claims``: a release's deletes in one round trip)."""
    return f"DELETE FROM {connection.ops.quote_name(PendingWake._meta.db_table)} WHERE claim_id = ANY(%(ids)s)"


def bump_version() -> int:
    """Move the claims' version (inside the writer's transaction): every pending claim is eligible again.
    Returns the new version. Not on the release path: only inventory, class and queue changes run it."""
    if connection.vendor == "postgresql":  # one statement (not update + read)
        table = connection.ops.quote_name(FleetState._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET version = version + 1, wake_all_version = version + 1 "
                           "WHERE id = 1 RETURNING version")
            row = cursor.fetchone()
        if row is not None:
            return row[0]
    if not FleetState.objects.filter(pk=1).update(version=F("version") + 1, wake_all_version=F("version") + 1):
        FleetState.objects.get_or_create(pk=1, defaults={"version": 2, "wake_all_version": 2})
    return FleetState.objects.filter(pk=1).values_list("version", flat=True).get()


def released_sql(freed: str) -> str:
    """``released`` as one more WITH query (``counted``) of a PostgreSQL statement whose WITH query ``freed``
    returns the released devices' ``cluster`` (a release deletes its rows and counts them in one round trip:
    ``claims.services.claims``). Parameters ``%(wake_prefix)s`` and ``%(wake_any)s``: ``wake_params()``.
    Nothing freed: nothing counted. Insert-only: no row another release writes or waits on."""
    table = connection.ops.quote_name(FreedCount._meta.db_table)
    return (f"counted AS (INSERT INTO {table} (key, freed) "
            f"SELECT %(wake_prefix)s || cluster, count(*) FROM {freed} GROUP BY cluster "
            f"UNION ALL SELECT %(wake_any)s, count(*) FROM {freed} HAVING count(*) > 0)")


def wake_params() -> dict[str, str]:
    return {"wake_prefix": cluster_key(""), "wake_any": ANY}


def released(clusters: Counter) -> None:
    """Devices were released (``clusters``: how many per cluster): count them (in the releasing
    transaction). The portable way, for SQLite (the embedded demo: one writer at a time, so updating the
    shared ``WakeKey`` rows makes nobody wait); PostgreSQL inserts ``FreedCount`` rows (``released_sql``).
    Keys in sorted order, so two writers never wait on each other in a cycle."""
    if not clusters:
        return
    counts = {cluster_key(c): n for c, n in clusters.items()}
    counts[ANY] = sum(clusters.values())
    table = connection.ops.quote_name(WakeKey._meta.db_table)
    upsert = (f"INSERT INTO {table} (key, freed) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
              f"SET freed = {table}.freed + excluded.freed")
    with connection.cursor() as cursor:
        cursor.executemany(upsert, [(k, counts[k]) for k in sorted(counts)])


def offer_sql(freed: str) -> str:
    """``offer`` as one more WITH query (``offered``) of the release statement whose WITH query ``freed``
    returns the released rows' ``cluster, driver, pool, device, admin_access``. Insert-only: nothing another
    release waits on."""
    table = connection.ops.quote_name(ReleasedDevice._meta.db_table)
    return (f"offered AS (INSERT INTO {table} (cluster, driver, pool, device, woken) "
            f"SELECT DISTINCT cluster, driver, pool, device, '[]'::jsonb FROM {freed} WHERE NOT admin_access)")


def offer(devices) -> None:
    """Leave the freed ``devices`` ((cluster, driver, pool, device)) for the round's wake-up step (the portable
    way; PostgreSQL runs ``offer_sql`` inside the release's statement)."""
    ReleasedDevice.objects.bulk_create([ReleasedDevice(cluster=c, driver=d, pool=p, device=n)
                                        for c, d, p, n in sorted(set(devices))])


def held_nodes(claim_ids: list[int]) -> set[tuple[str, str]]:
    """The (cluster, node) that these claims hold as their queues' heads."""
    return set(PendingWake.objects.filter(claim_id__in=claim_ids).exclude(hold_node="")
               .values_list("hold_cluster", "hold_node"))


def devices_on(nodes) -> list[tuple[str, str, str, str]]:
    """Every device ((cluster, driver, pool, device)) of ``nodes`` ((cluster, node))."""
    wanted = set(nodes)
    if not wanted:
        return []
    return [(c, d, p, n) for c, d, p, n, node in Device.objects.filter(
        cluster__name__in={c for c, _ in wanted}, node_name__in={n for _, n in wanted}).values_list(
        "cluster__name", "driver", "pool_name", "name", "node_name") if (c, node) in wanted]


def offer_again(devices) -> Counter:
    """Those of ``devices`` ((cluster, driver, pool, device)) that no allocation holds, as if released now:
    counted and offered. For a node a queue's head no longer holds (it moved its hold, was placed, lost its turn
    or was released): the claims kept off the node waited for a release (their offer was spent while the hold
    stood), and its free devices would stay idle beside them until one. Returns the devices offered per
    cluster."""
    devices = sorted(set(devices))
    held = claims_sql.allocated_among(devices)
    free = [d for d in devices if d not in held]
    per_cluster = Counter(c for c, _, _, _ in free)
    if free:
        counts = [FreedCount(key=cluster_key(c), freed=n) for c, n in sorted(per_cluster.items())]
        FreedCount.objects.bulk_create([*counts, FreedCount(key=ANY, freed=len(free))])
        offer(free)
    return per_cluster


def candidates_sql() -> str:
    """Pending claims a release in ``%(keys)s`` (wake keys) could help (their counter reached their mark),
    tried before and not taken by a worker, with the keys they wait for: per queue partition (namespace and
    queue label) the first ``%(window)s`` by priority and age, the order the scheduler uses inside a queue.
    Only the window leaves the database: the worker orders, screens and wakes a bounded number, however many
    are pending."""
    t = {name: connection.ops.quote_name(model._meta.db_table) for name, model in (
        ("claim", ResourceClaim), ("wake", PendingWake))}
    queue = "COALESCE(" + ", ".join(f"c.labels->>%(queue_label_{i})s" for i in range(3)) + ", '')"
    prio = ("CASE WHEN c.labels->>%(prio_label)s ~ '^-?[0-9]{1,9}$' THEN (c.labels->>%(prio_label)s)::int "
            "ELSE 0 END")
    return (f"SELECT id, keys FROM (SELECT c.id, m.keys, row_number() OVER (PARTITION BY c.namespace_id, {queue} "
            f"ORDER BY {prio} DESC, c.created_at, c.id) AS rn FROM {t['claim']} c JOIN ("
            f"SELECT w.claim_id, array_agg(w.key) AS keys FROM {t['wake']} w "
            f"JOIN ({_counters_sql('key = ANY(%(keys)s)')}) k ON k.key = w.key "
            "WHERE w.key = ANY(%(keys)s) AND w.wake_at <= k.freed GROUP BY w.claim_id) m ON m.claim_id = c.id "
            "WHERE c.phase = %(pending)s AND c.attempted_version IS NOT NULL "
            "AND (c.taken_until IS NULL OR c.taken_until < now())) ranked WHERE rn <= %(window)s")


def candidates(keys: list[str], window: int, queue_labels: tuple[str, ...],
               prio_label: str) -> dict[int, set[str]]:
    """The claims ``candidates_sql`` selects, with the keys (of ``keys``) each waits for (on SQLite, the
    embedded demo: every candidate)."""
    if connection.vendor != "postgresql":
        out: dict[int, set[str]] = {}
        for claim_id, key in PendingWake.objects.filter(
                key_id__in=keys, wake_at__lte=F("key__freed"), claim__phase=Phase.PENDING,
                claim__attempted_version__isnull=False).values_list("claim_id", "key_id"):
            out.setdefault(claim_id, set()).add(key)
        return out
    params: dict[str, Any] = {"keys": keys, "window": window, "pending": Phase.PENDING, "prio_label": prio_label,
              **{f"queue_label_{i}": label for i, label in enumerate(queue_labels)}}
    with connection.cursor() as cursor:
        cursor.execute(candidates_sql(), params)
        return {claim_id: set(found) for claim_id, found in cursor.fetchall()}


def held_heads(clusters: list[str]) -> list[tuple[int, str, str]]:
    """(claim id, cluster, node) of the queue heads holding a node in ``clusters``, pending and tried."""
    return list(PendingWake.objects.filter(hold_cluster__in=clusters, claim__phase=Phase.PENDING,
                                           claim__attempted_version__isnull=False)
                .exclude(hold_node="").values_list("claim_id", "hold_cluster", "hold_node").distinct())


def wake_claims(ids) -> int:
    """Make these pending claims eligible for the next take (as if never tried); their wake rows stay, so a
    queue head keeps its held node until it is decided again."""
    if not ids:
        return 0
    return ResourceClaim.objects.filter(id__in=sorted(ids), phase=Phase.PENDING,
                                        attempted_version__isnull=False).update(attempted_version=None)


def all_keys() -> list[str]:
    return list(WakeKey.objects.order_by("key").values_list("key", flat=True))


def undecided(ids) -> set[int]:
    """Of these claims, the ones woken and not decided since (pending, ``attempted_version`` cleared)."""
    if not ids:
        return set()
    return set(ResourceClaim.objects.filter(id__in=sorted(set(ids)), phase=Phase.PENDING,
                                            attempted_version__isnull=True).values_list("id", flat=True))
