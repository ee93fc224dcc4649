"""``?watch=1`` on the workload kinds (``kubectl get pods -w``, ``kubectl rollout status``): their rows are not
in the change log, and most of what changes is their status, which is read from their pods' claims. So the
watch renders the watched objects every second and sends what differs from the last rendering: ADDED,
MODIFIED (a pod got its devices, a Deployment's ready count moved) or DELETED. It holds a watch slot like any
watch; a reconnecting client (a resourceVersion given) gets changes from the current state on."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

from django.db import close_old_connections

from draservice import changes
from kube import watch

POLL_SECONDS = 1.0
MAX_OBJECTS = 2000  # a watch renders this many at most per poll; more is what lists (and paging) are for


class DiffWatch(watch.Watch):
    def _snapshot(self) -> dict[str, dict]:
        objects = list(self.store.scoped(self.request, self.namespace, self.params)[:MAX_OBJECTS])
        return {o["metadata"]["uid"]: o for o in self.store.render_many(objects, self.version)}

    def stream(self, since: int | None) -> Iterator[bytes]:
        try:
            yield b""  # the response headers at once (kube.watch.Watch.stream says why)
            seen = self._snapshot()
            for obj in seen.values():
                # From a resourceVersion (after a list) too: what the client listed may have changed since, and
                # nothing here says what it saw. Its current state once (MODIFIED) is never a missed change.
                yield self._event("ADDED" if since is None else "MODIFIED", obj)
            yield from self._follow_renderings(seen)
        finally:
            watch._slots.release()
            close_old_connections()

    def _follow_renderings(self, seen: dict[str, dict]) -> Iterator[bytes]:
        deadline = time.monotonic() + self.timeout
        last_sent = time.monotonic()
        digests = {uid: _digest(obj) for uid, obj in seen.items()}
        while time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            now = self._snapshot()
            sent = False
            for uid, obj in now.items():
                digest = _digest(obj)
                if digests.get(uid) != digest:
                    yield self._event("MODIFIED" if uid in digests else "ADDED", obj)
                    digests[uid], sent = digest, True
            for uid in [u for u in digests if u not in now]:
                yield self._event("DELETED", seen[uid])
                del digests[uid]
                sent = True
            seen.update(now)
            if sent:
                last_sent = time.monotonic()
            elif self.bookmarks and time.monotonic() - last_sent >= watch.BOOKMARK_SECONDS:
                yield self._bookmark(changes.settled())
                last_sent = time.monotonic()
            close_old_connections()


def _digest(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
