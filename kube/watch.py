"""``?watch=1``: a stream of ``{"type": ..., "object": ...}`` lines read from the change log.

Each watch holds one web thread while it lasts, so a process allows ``KUBE_MAX_WATCHES`` at once (more get
429 with Retry-After, which client-go retries) and none outlives ``KUBE_WATCH_MAX_SECONDS`` (the client
reconnects from the last resourceVersion it saw, as against any API server). A watch polls the log twice a
second: one indexed query, whatever the fleet's size; between changes it costs nothing else.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import close_old_connections

from draservice import changes
from draservice.permissions import readable_namespaces
from kube import tables
from kube.selectors import labels_match, parse_fields
from kube.status import KubeError, status_body
from kube.stores import Store

POLL_SECONDS = 0.5
BOOKMARK_SECONDS = 10.0
_slots = threading.BoundedSemaphore(max(1, settings.KUBE_MAX_WATCHES))


def parse_resource_version(raw: str | None) -> int | None:
    """None for "from now, with the current objects as ADDED first" (missing or "0", as upstream)."""
    if raw in (None, "", "0"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise KubeError(400, f"invalid resourceVersion: {raw!r}") from None
    if value < 0:
        raise KubeError(400, f"invalid resourceVersion: {raw!r}")
    return value


def acquire_slot() -> None:
    if not _slots.acquire(blocking=False):
        raise KubeError(429, "too many watches on this server process; retry shortly",
                        headers={"Retry-After": "1"})


class Watch:
    def __init__(self, store: Store, request, namespace: str | None, version: str, params, as_table: bool):
        self.store, self.request, self.namespace, self.version = store, request, namespace, version
        self.params, self.as_table = params, as_table
        self.include = params.get("includeObject") or "Metadata"
        self.bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        asked = params.get("timeoutSeconds")
        limit = settings.KUBE_WATCH_MAX_SECONDS
        try:
            self.timeout = min(int(asked), limit) if asked else limit
        except ValueError:
            raise KubeError(400, f"invalid timeoutSeconds: {asked!r}") from None
        if self.timeout < 0:
            raise KubeError(400, f"timeoutSeconds: Invalid value: {asked}: must be greater than or equal to 0")
        self.first_table = True
        # What a list of this request would filter on, applied to deleted objects too (``_visible``).
        self.readable = readable_namespaces(request) if store.resource.namespaced and not namespace else None
        # Name and namespace are the change's own columns; a cluster-scoped store may map names (``filter_by_name``).
        fields = parse_fields(params.get("fieldSelector"), tuple(store.field_columns))
        self.fields = {f: v for f, v in fields.items()
                       if store.resource.namespaced and f in ("metadata.name", "metadata.namespace")}

    def _event(self, kind: str, obj: dict) -> bytes:
        if self.as_table and kind != "BOOKMARK":
            obj = tables.table(self.store.resource.plural, [obj], self.include, with_columns=self.first_table)
            self.first_table = False
        return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"

    def _bookmark(self, seq: int) -> bytes:
        obj = {"kind": self.store.resource.kind, "apiVersion": self.store.resource.api_version(self.version),
               "metadata": {"resourceVersion": str(seq), "annotations": {"k8s.io/initial-events-end": "true"}}}
        return self._event("BOOKMARK", obj)

    def _rendered(self, batch: list) -> Iterator[bytes]:
        live_ids = {c.row_id for c in batch if c.type != "DELETED"}
        scoped = self.store.scoped(self.request, self.namespace, self.params)
        objects = {o.pk: o for o in scoped.filter(pk__in=live_ids)} if live_ids else {}
        rendered = dict(zip(objects, self.store.render_many(list(objects.values()), self.version), strict=True))
        seen: set[int] = set()
        for change in batch:
            if change.type == "DELETED":
                if self._visible(change):
                    yield self._event("DELETED", self.store.tombstone(change.tombstone or {}, change.namespace,
                                                                      self.version))
            elif change.row_id in rendered and change.row_id not in seen:
                # The object as it is now (a later change of it in this batch is the same rendering).
                seen.add(change.row_id)
                obj = rendered[change.row_id]
                obj["metadata"]["resourceVersion"] = str(max(change.seq, int(obj["metadata"]["resourceVersion"]
                                                                             or 0)))
                yield self._event(change.type, obj)

    def _visible(self, change) -> bool:
        """Would a list have shown the deleted object? The row is gone, so the filters the list applies in SQL
        (``Store.scoped``) are applied to the change and its tombstone: the caller's namespaces first (an
        all-namespaces watch must not tell one tenant of another's deletions), then the field and label
        selectors."""
        if self.readable is not None and change.namespace not in self.readable:
            return False
        for field, (op, value) in self.fields.items():
            actual = change.name if field == "metadata.name" else change.namespace
            if (actual == value) != (op == "="):
                return False
        return labels_match((change.tombstone or {}).get("labels") or {}, self.params.get("labelSelector"))

    def stream(self, since: int | None) -> Iterator[bytes]:
        try:
            # The response headers at once, as kube-apiserver sends them: a client (kubectl wait, an informer)
            # may wait for them before it acts on what its list already showed. An empty chunk is sent as
            # the headers alone (the WSGI server writes no body for it).
            yield b""
            if since is None:
                since = changes.settled()
                objects = list(self.store.scoped(self.request, self.namespace, self.params)[:10_000])
                for obj in self.store.render_many(objects, self.version):
                    yield self._event("ADDED", obj)
            else:
                changes.check_not_expired(since)
            yield from self._follow(changes.Cursor(since))
        except changes.Expired as exc:
            yield json.dumps({"type": "ERROR", "object": status_body(410, str(exc), "Expired")}).encode() + b"\n"
        finally:
            _slots.release()
            close_old_connections()

    def _follow(self, cursor: changes.Cursor) -> Iterator[bytes]:
        deadline = time.monotonic() + self.timeout
        last_sent = time.monotonic()
        while time.monotonic() < deadline:
            batch = cursor.read({self.store.change_resource or ""}, self.namespace)
            if batch:
                yield from self._rendered(batch)
                last_sent = time.monotonic()
                continue
            if self.bookmarks and time.monotonic() - last_sent >= BOOKMARK_SECONDS:
                yield self._bookmark(cursor.seq)
                last_sent = time.monotonic()
            time.sleep(POLL_SECONDS)
