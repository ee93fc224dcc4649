"""What agents write: a cluster's full inventory, or one slice or node at a time.

Every write is one transaction holding the cluster's row lock, so two pushes for the same cluster never
interleave and a rejected push leaves nothing behind. Objects are validated and normalized (pure CPU, in
``dra.k8s.inventory`` and ``dra.k8s.slices``) before the transaction starts; a single bad object fails the
whole push with a 422 that names its field path. Writes are bulk: unchanged slices are recognised by a
content hash and skipped, devices go in with PostgreSQL COPY (``draservice.bulk``; bulk_create elsewhere),
and nothing is written per device.
"""
from __future__ import annotations

import functools
import hashlib

import orjson
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from dra.cel import compile_selector
from dra.k8s.fields import Errors, ObjectInvalid
from dra.k8s.inventory import Inventory, normalize_node
from dra.k8s.inventory import parse_inventory as parse_inventory_body
from dra.k8s.slices import normalize_resource_slice
from draservice.bulk import bulk_insert, copy_rows
from draservice.errors import Invalid, PreconditionFailed
from draservice.etag import check_if_match
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node, Pool, PoolEvent, ResourceSlice
from inventory.services.pools import compute_pool_states, device_rows, generation_regressions, mixed_generations
from inventory.signals import send_after_commit

MAX_REPORTED_ERRORS = 100


# ------------------------------------------------------------------------------------------------ parsing

def content_hash(obj: dict) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


def cel_compiler(*, pushed: bool = True):
    """``dra.cel.compile_selector``: compiles, and refuses a selector whose estimated cost exceeds the budget.

    A cluster's push (``pushed``) is held to the API server's own test, which that cluster has already
    applied: refusing what it accepted would stop the cluster's inventory from syncing. Fleet-wide classes
    created here are held to this service's tighter budget (``dra.cel.cost`` says why)."""
    return functools.partial(compile_selector, upstream=pushed)


def _raise(errors: Errors) -> None:
    shown = errors[:MAX_REPORTED_ERRORS]
    detail = None
    if len(errors) > len(shown):
        detail = (f"{len(errors)} problems; the first {len(shown)}: "
                  + "; ".join(f"{p}: {r}" for p, r in shown[:5]) + "; ...")
    raise Invalid(shown, detail=detail, title="Invalid inventory")


def parse_inventory(body) -> Inventory:
    """The push body -> normalized v1 objects (``dra.k8s.inventory``), or Invalid listing every problem
    with its path, including slices below their pool's newest generation in this push."""
    try:
        inventory, errors = parse_inventory_body(body, cel_compiler())
    except ObjectInvalid as exc:
        raise Invalid(exc.errors) from None
    errors += mixed_generations(inventory.slice_paths)
    if errors:
        _raise(errors)
    return inventory


def _normalize_one(normalize, obj, url_name: str, name_path: str = "metadata.name"):
    """Incremental PUTs: the URL names the object; a body without a name takes it, a different one is an error."""
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        if isinstance(meta, dict) and not meta.get("name"):
            obj = {**obj, "metadata": {**meta, "name": url_name}}
    try:
        result = normalize(obj)
    except ObjectInvalid as exc:
        _raise(exc.errors)
    name = result["name"] if "name" in result else result["metadata"]["name"]
    if name != url_name:
        _raise([(name_path, f"Invalid value: {name!r}: must match the name in the URL ({url_name!r})")])
    return result


# ------------------------------------------------------------------------------------------------ writing

def _lock_cluster(name: str) -> Cluster:
    return Cluster.objects.select_for_update().get(name=name)


DEVICE_COLUMNS = ["cluster_id", "resource_slice_id", "node_id", "node_name", "driver", "pool_name", "pool_generation",
                  "name", "attributes", "capacity", "consumes_counters", "taints", "allow_multiple_allocations",
                  "binds_to_node", "binding_conditions", "binding_failure_conditions", "all_nodes", "node_selector",
                  "attribute_index"]
DEVICE_JSON = {"attributes", "capacity", "consumes_counters", "taints", "binding_conditions",
               "binding_failure_conditions", "node_selector", "attribute_index"}
SLICE_COLUMNS = ["cluster_id", "name", "driver", "pool_name", "pool_generation", "resource_slice_count", "node_name",
                 "node_selector", "all_nodes", "per_device_node_selection", "device_count", "object", "content_hash",
                 "updated_at"]


def _insert_slices(cluster: Cluster, objs: list[tuple[dict, dict]]) -> list[tuple[int, dict]]:
    """Insert (normalized slice, its columns) pairs; returns (id, slice) pairs for the device insert."""
    if not objs:
        return []
    if connection.vendor == "postgresql":
        now = timezone.now()
        copy_rows(ResourceSlice, SLICE_COLUMNS,
                   ({**fields, "cluster_id": cluster.pk, "name": obj["metadata"]["name"], "updated_at": now}
                    for obj, fields in objs), {"object", "node_selector"})
        ids = dict(ResourceSlice.objects.filter(cluster=cluster, name__in=[o["metadata"]["name"] for o, _ in objs])
                   .values_list("name", "pk"))
        return [(ids[obj["metadata"]["name"]], obj) for obj, _ in objs]
    rows = ResourceSlice.objects.bulk_create(
        [ResourceSlice(cluster=cluster, name=obj["metadata"]["name"], **fields) for obj, fields in objs],
        batch_size=500)
    return [(row.pk, obj) for row, (obj, _) in zip(rows, objs, strict=True)]


def _insert_devices(cluster: Cluster, slice_rows: list[tuple[int, dict]], node_ids: dict[str, int]) -> int:
    """Insert the devices of (slice id, normalized slice) pairs; COPY on PostgreSQL."""
    rows = []
    for slice_id, obj in slice_rows:
        for row in device_rows(obj):
            row.update(cluster_id=cluster.pk, resource_slice_id=slice_id, node_id=node_ids.get(row["node_name"]))
            rows.append(row)
    if connection.vendor == "postgresql":
        copy_rows(Device, DEVICE_COLUMNS, rows, DEVICE_JSON)
    else:
        Device.objects.bulk_create([Device(**row) for row in rows], batch_size=2000)
    return len(rows)


def _slice_fields(obj: dict) -> dict:
    spec = obj["spec"]
    return {
        "driver": spec["driver"], "pool_name": spec["pool"]["name"],
        "pool_generation": spec["pool"].get("generation", 0),
        "resource_slice_count": spec["pool"]["resourceSliceCount"],
        "node_name": spec.get("nodeName", ""), "node_selector": spec.get("nodeSelector"),
        "all_nodes": bool(spec.get("allNodes")), "per_device_node_selection": bool(spec.get("perDeviceNodeSelection")),
        "device_count": len(spec.get("devices") or ()), "object": obj, "content_hash": content_hash(obj),
    }


def _write_pools(cluster: Cluster, states: dict, scope: set | None) -> dict[str, int]:
    """Make the Pool rows match ``states``; ``scope`` limits deletions to those keys (None: the whole cluster)."""
    existing = {(p.driver, p.name): p for p in Pool.objects.filter(cluster=cluster)}
    _record_regressions(cluster, {key: p.generation for key, p in existing.items()}, states)
    create, update = [], []
    for key, st in states.items():
        values = {"generation": st.generation, "resource_slice_count": st.resource_slice_count,
                  "slice_count": st.slice_count, "device_count": st.device_count, "state": st.state,
                  "reason": st.reason}
        pool = existing.get(key)
        if pool is None:
            create.append(Pool(cluster=cluster, driver=key[0], name=key[1], **values))
        elif any(getattr(pool, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(pool, k, v)
            pool.updated_at = timezone.now()
            update.append(pool)
    gone = [p.pk for key, p in existing.items() if key not in states and (scope is None or key in scope)]
    bulk_insert(Pool, ["cluster_id", "driver", "name", "generation", "resource_slice_count", "slice_count",
                        "device_count", "state", "reason", "updated_at"], create, set())
    Pool.objects.bulk_update(update, ["generation", "resource_slice_count", "slice_count", "device_count", "state",
                                      "reason", "updated_at"], batch_size=2000)
    if gone:
        Pool.objects.filter(pk__in=gone).delete()
    summary = {"complete": 0, "incomplete": 0, "invalid": 0}
    for st in states.values():
        summary[st.state] += 1
    return summary


def _record_regressions(cluster: Cluster, previous: dict, states: dict) -> None:
    """A pool whose generation goes backwards is stored as pushed (the cluster's truth: a driver reinstall
    restarts generations), and a ``GenerationRegressed`` pool event says so."""
    events = [PoolEvent(cluster=cluster, driver=key[0], pool=key[1], type=PoolEvent.GENERATION_REGRESSED,
                        message=f"generation went back from {old} to {new}; accepted as the cluster's inventory "
                                f"(a driver reinstall restarts generations)",
                        data={"previousGeneration": old, "generation": new})
              for key, old, new in generation_regressions(previous, states)]
    if events:
        PoolEvent.objects.bulk_create(events)


def _replace_scoped(model, cluster: Cluster, objects: list[dict], extra=lambda obj: {}) -> dict[str, int]:
    """Cluster-scoped DeviceClasses / DeviceTaintRules: make the stored set equal ``objects``."""
    existing = {row.name: row for row in model.objects.filter(cluster=cluster)}
    stats = {"created": 0, "updated": 0, "deleted": 0, "unchanged": 0}
    for obj in objects:
        name = obj["metadata"]["name"]
        row = existing.pop(name, None)
        if row is None:
            model.objects.create(cluster=cluster, name=name, object=obj, **extra(obj))
            stats["created"] += 1
        elif row.object != obj:
            row.object = obj
            for k, v in extra(obj).items():
                setattr(row, k, v)
            row.resource_version += 1
            row.save()
            stats["updated"] += 1
        else:
            stats["unchanged"] += 1
    if existing:
        model.objects.filter(pk__in=[r.pk for r in existing.values()]).delete()
        stats["deleted"] = len(existing)
    return stats


def taint_rule_columns(obj: dict) -> dict:
    selector = obj["spec"].get("deviceSelector") or {}
    return {"driver": selector.get("driver", ""), "pool_name": selector.get("pool", ""),
            "device_name": selector.get("device", ""), "effect": obj["spec"]["taint"]["effect"]}


def _sync_nodes(cluster: Cluster, nodes: list[dict], referenced: set[str], replace: bool) -> tuple[dict, dict]:
    """Upsert nodes (and bare rows for nodes that slices name but the push did not list)."""
    wanted = {n["name"]: n["labels"] for n in nodes}
    for name in referenced - wanted.keys():
        wanted[name] = None  # keep existing labels if known, {} otherwise
    existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    stats = {"created": 0, "updated": 0, "deleted": 0, "unchanged": 0}
    create, update = [], []
    for name, labels in wanted.items():
        node = existing.get(name)
        if node is None:
            create.append(Node(cluster=cluster, name=name, labels=labels or {}))
        elif labels is not None and node.labels != labels:
            node.labels = labels
            node.updated_at = timezone.now()
            update.append(node)
        else:
            stats["unchanged"] += 1
    bulk_insert(Node, ["cluster_id", "name", "labels", "updated_at"], create, {"labels"})
    Node.objects.bulk_update(update, ["labels", "updated_at"], batch_size=2000)
    stats["created"], stats["updated"] = len(create), len(update)
    if replace:
        gone = [n.pk for name, n in existing.items() if name not in wanted]
        if gone:
            Node.objects.filter(pk__in=gone).delete()
        stats["deleted"] = len(gone)
    ids = dict(Node.objects.filter(cluster=cluster).values_list("name", "pk"))
    if create:
        # Devices stored before their node existed get linked now, in one statement.
        Device.objects.filter(cluster=cluster, node__isnull=True, node_name__in=[n.name for n in create]).update(
            node_id=Subquery(Node.objects.filter(cluster=cluster, name=OuterRef("node_name")).values("pk")[:1]))
    return stats, ids


def _touch(cluster: Cluster, changed: bool, reason: str) -> Cluster:
    now = timezone.now()
    was_stale = cluster.is_stale(now) or cluster.stale_since is not None
    cluster.last_sync_at = now
    cluster.stale_since = None
    if changed:
        cluster.inventory_version += 1
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_at=now, stale_since=None,
                                                 inventory_version=cluster.inventory_version)
    if changed or was_stale:
        send_after_commit(cluster=cluster.name, cluster_id=cluster.pk, inventory_version=cluster.inventory_version,
                          reason=reason if changed else "heartbeat-fresh")
    return cluster


def push_inventory(cluster_name: str, body) -> dict:
    """Replace a cluster's whole inventory with ``body`` (see ``parse_inventory``). Atomic."""
    inventory = parse_inventory(body)
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # A full push is derived state that the agent re-sends (periodically and on restart), so it need
            # not wait for its tens of megabytes of WAL to reach disk: a crash in the next few hundred
            # milliseconds loses at most this push, never consistency. Scoped to this transaction.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
        cluster = _lock_cluster(cluster_name)
        referenced = {s["spec"]["nodeName"] for s in inventory.slices if s["spec"].get("nodeName")}
        referenced |= {d["nodeName"] for s in inventory.slices for d in s["spec"].get("devices") or ()
                       if d.get("nodeName")}
        node_stats, node_ids = _sync_nodes(cluster, inventory.nodes, referenced, replace=True)
        slice_stats, device_count = _replace_slices(cluster, inventory.slices, node_ids)
        pool_stats = _write_pools(cluster, compute_pool_states(inventory.slices), scope=None)
        class_stats = _replace_scoped(DeviceClass, cluster, inventory.classes)
        rule_stats = _replace_scoped(DeviceTaintRule, cluster, inventory.rules, taint_rule_columns)
        changed = any(stats[k] for stats in (node_stats, slice_stats, class_stats, rule_stats)
                      for k in ("created", "updated", "deleted"))
        _touch(cluster, changed, "sync")
    return {
        "cluster": cluster.name, "inventoryVersion": cluster.inventory_version, "changed": changed,
        "resourceSlices": slice_stats, "nodes": node_stats, "deviceClasses": class_stats,
        "deviceTaintRules": rule_stats, "devices": sum(len(o["spec"].get("devices") or ()) for o in inventory.slices),
        "pools": pool_stats, "devicesWritten": device_count,
    }


def _replace_slices(cluster: Cluster, slices: list[dict], node_ids: dict[str, int]) -> tuple[dict[str, int], int]:
    """Make the cluster's stored slices (and their devices) equal ``slices``; returns (stats, devices written)."""
    existing = {name: (pk, digest) for name, pk, digest in
                ResourceSlice.objects.filter(cluster=cluster).values_list("name", "pk", "content_hash")}
    stats = {"created": 0, "updated": 0, "deleted": 0, "unchanged": 0}
    fresh, replaced = [], []
    for obj in slices:
        fields = _slice_fields(obj)
        current = existing.pop(obj["metadata"]["name"], None)
        if current is None:
            fresh.append((obj, fields))
            stats["created"] += 1
        elif current[1] != fields["content_hash"]:
            # A changed slice is replaced whole (row and devices): simpler and faster than a bulk UPDATE
            # of large JSON. Its identity is (cluster, name), not the row id.
            fresh.append((obj, fields))
            replaced.append(current[0])
            stats["updated"] += 1
        else:
            stats["unchanged"] += 1
    gone = [pk for pk, _ in existing.values()] + replaced
    if gone:
        Device.objects.filter(resource_slice_id__in=gone).delete()
        ResourceSlice.objects.filter(pk__in=gone).delete()
    stats["deleted"] = len(existing)
    return stats, _insert_devices(cluster, _insert_slices(cluster, fresh), node_ids)


def _recompute_pools(cluster: Cluster, keys: set[tuple[str, str]]) -> None:
    objs: list[dict] = []
    for driver, pool in keys:
        objs += ResourceSlice.objects.filter(cluster=cluster, driver=driver, pool_name=pool).values_list(
            "object", flat=True)
    _write_pools(cluster, compute_pool_states(objs), scope=keys)


def put_resource_slice(cluster_name: str, name: str, body, if_match: list[str] | None = None
                       ) -> tuple[ResourceSlice, bool]:
    """Create or replace one slice. Returns (slice, created)."""
    obj = _normalize_one(normalize_resource_slice, body, name)
    fields = _slice_fields(obj)
    with transaction.atomic():
        cluster = _lock_cluster(cluster_name)
        row = ResourceSlice.objects.filter(cluster=cluster, name=name).first()
        if row is not None:
            check_if_match(if_match, row.content_hash[:16])
            if row.content_hash == fields["content_hash"]:
                _touch(cluster, False, "slice")
                return row, False
        elif if_match is not None:
            raise PreconditionFailed(f"ResourceSlice {name!r} does not exist, so If-Match cannot match.")
        keys = {(fields["driver"], fields["pool_name"])}
        referenced = {fields["node_name"]} | {d["nodeName"] for d in obj["spec"].get("devices") or ()
                                              if d.get("nodeName")}
        _, node_ids = _sync_nodes(cluster, [], referenced - {""}, replace=False)
        created = row is None
        if row is None:
            row = ResourceSlice.objects.create(cluster=cluster, name=name, **fields)
        else:
            keys.add((row.driver, row.pool_name))
            Device.objects.filter(resource_slice=row).delete()
            for key, value in fields.items():
                setattr(row, key, value)
            row.save()
        _insert_devices(cluster, [(row.pk, obj)], node_ids)
        _recompute_pools(cluster, keys)
        _touch(cluster, True, "slice")
    return row, created


def delete_resource_slice(cluster_name: str, name: str, if_match: list[str] | None = None) -> None:
    with transaction.atomic():
        cluster = _lock_cluster(cluster_name)
        row = ResourceSlice.objects.get(cluster=cluster, name=name)
        check_if_match(if_match, row.content_hash[:16])
        key = (row.driver, row.pool_name)
        row.delete()
        _recompute_pools(cluster, {key})
        _touch(cluster, True, "slice")


def put_node(cluster_name: str, name: str, body) -> tuple[Node, bool]:
    node = _normalize_one(normalize_node, body if not isinstance(body, dict) or body.get("name") or "metadata" in body
                          else {**body, "name": name}, name, name_path="name")
    with transaction.atomic():
        cluster = _lock_cluster(cluster_name)
        stats, _ = _sync_nodes(cluster, [node], set(), replace=False)
        _touch(cluster, bool(stats["created"] or stats["updated"]), "node")
        return Node.objects.get(cluster=cluster, name=name), bool(stats["created"])


def delete_node(cluster_name: str, name: str) -> None:
    """Forget a node. Its devices stay (their slices say they exist) but lose the node link and labels."""
    with transaction.atomic():
        cluster = _lock_cluster(cluster_name)
        Node.objects.get(cluster=cluster, name=name).delete()
        _touch(cluster, True, "node")
