"""The watch server: ``GET /k8s/...?watch=1`` (or ``watch=true``) in a process of its own, on asyncio.

In gunicorn a watch holds a web thread while it lasts, so one tenant's watches could take every thread and
leave other tenants' plain requests waiting. Here a watch is a coroutine and a queue: it costs a few KB
while idle, and database work (the initial list, rendering changed objects) runs on a small pool of threads
(``KUBE_WATCH_SERVER_DB_THREADS``), one connection each. One reader of the change log feeds every watch
(``kube.watch_hub``). Everything before the stream (authentication, permissions, selectors, building the
``Watch``) is the /k8s door's own code, run in that pool (``kube.watch_urls``), so a refused watch gets the
same ``Status`` as from gunicorn, and the events are rendered by the same ``Watch`` methods.

Caps: ``KUBE_MAX_WATCHES_PER_TOKEN`` open watches per token (or session user) and
``KUBE_WATCH_SERVER_MAX_WATCHES`` per process; beyond either, 429 ``TooManyRequests`` with Retry-After, as
kube-apiserver's max-in-flight filter answers (client-go waits and retries).

Requests that are not watches go to ``upstream`` when there is one (``kube.watch_proxy``: ``manage.py
serve`` puts this server on its public port in front of gunicorn), else they get a 404 naming the right
server (production routes only watches here: README, "Watches").
"""
from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.urls import Resolver404, resolve

from draservice import changes
from kube import watch as kube_watch
from kube import workload_watch
from kube.status import status_body
from kube.watch_hub import Hub, Subscriber, in_namespaces
from kube.watch_urls import WatchStart

log = logging.getLogger(__name__)
WATCH_PARAM_VALUES = ("1", "true", "True")
RETRY_AFTER_SECONDS = 5
WATCHED_RESOURCES = {"resourceclaims", "resourceclaimtemplates", "consumers"}
RENDER_SHARED_SECONDS = 10.0  # a rendering is reused by watches that get the same changes this soon
JSON_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-cache")]


def is_watch(scope) -> bool:
    if scope["method"] != "GET" or not scope["path"].startswith("/k8s/"):
        return False
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("watch") or []
    return bool(values) and values[-1] in WATCH_PARAM_VALUES


def _db_job(fn, *args):
    """Run ``fn`` on a pool thread. Its connection stays open for the next job (no request cycle closes
    it); one that failed is closed, so the next job reconnects."""
    try:
        return fn(*args)
    except Exception:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        raise


def _start(scope, body: bytes):
    """What the door answers this watch request: a ``WatchStart``, or a response to send (an error)."""
    request = ASGIRequest(scope, io.BytesIO(body))
    try:
        match = resolve(request.path_info, urlconf="kube.watch_urls")
    except Resolver404:
        return 404, status_body(404, "the server could not find the requested resource")
    response = match.func(request, *match.args, **match.kwargs)
    if isinstance(response, WatchStart):
        return response
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response


def _initial_events(w: kube_watch.Watch) -> tuple[int, bytes]:
    """The objects as they are, as ADDED, and the seq the follow-up starts from (as ``Watch.stream``)."""
    since = changes.settled()
    objects = list(w.store.scoped(w.request, w.namespace, w.params)[:10_000])
    return since, b"".join(w._event("ADDED", obj) for obj in w.store.render_many(objects, w.version))


def _render(w: kube_watch.Watch, batch: list) -> bytes:
    return b"".join(w._rendered(batch))


class Stream:
    """One response being streamed: sends body chunks, knows when the client went away."""

    def __init__(self, send, receive):
        self.send, self.receive = send, receive
        self.closed = asyncio.Event()
        self.last_sent = time.monotonic()

    async def open(self) -> None:
        # Headers at once: a client waits for them before it reads any event (kubectl wait, client-go).
        await self.send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        await self.send({"type": "http.response.body", "body": b"", "more_body": True})

    async def write(self, chunk: bytes) -> None:
        if chunk:
            await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.last_sent = time.monotonic()

    async def end(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def listen(self, wake: Subscriber | None) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.closed.set()
                if wake is not None:
                    wake.queue.put_nowait(None)
                return


class WatchServer:
    """The ASGI application."""

    def __init__(self, upstream: str | None = None, max_watches: int | None = None,
                 per_token: int | None = None, threads: int | None = None):
        self.max_watches = max_watches or settings.KUBE_WATCH_SERVER_MAX_WATCHES
        self.per_token = per_token or settings.KUBE_MAX_WATCHES_PER_TOKEN
        self.pool = ThreadPoolExecutor(threads or settings.KUBE_WATCH_SERVER_DB_THREADS,
                                       thread_name_prefix="watch-db")
        self.hub = Hub(self.run, WATCHED_RESOURCES)
        self.holders: Counter[str] = Counter()
        self.renders: dict[tuple, asyncio.Future] = {}  # (who sees what, which changes) -> their events
        self.active = self.served = self.refused = 0
        self.proxy = None
        if upstream:
            from kube.watch_proxy import Proxy

            self.proxy = Proxy(upstream)

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(_db_job, fn, *args))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif is_watch(scope):
            await self._watch(scope, receive, send)
        elif scope["path"] == "/watchz":
            await self._answer(send, 200, {"watches": self.active, "holders": len(self.holders),
                                           "served": self.served, "refused": self.refused,
                                           "changeLogSeq": self.hub.seq})
        elif self.proxy is not None:
            await self.proxy(scope, receive, send)
        elif scope["path"] == "/livez":
            await self._answer(send, 200, {"status": "ok"})
        else:
            await self._answer(send, 404, status_body(
                404, "this is the watch server: it answers GET /k8s/...?watch=1 only; send other requests to "
                     "the web server"))

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.hub.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.hub.stop()
                if self.proxy is not None:
                    await self.proxy.close()
                self.pool.shutdown(wait=False, cancel_futures=True)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, send, code: int, body: dict, headers: list | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode()), *(headers or [])]})
        await send({"type": "http.response.body", "body": data})

    async def _send_response(self, send, response) -> None:
        if isinstance(response, tuple):
            await self._answer(send, *response)
            return
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})

    def _refusal(self, holder: str) -> str | None:
        if self.active >= self.max_watches:
            return f"too many watches on this watch server process ({self.max_watches}); retry shortly"
        if self.holders[holder] >= self.per_token:
            return (f"too many watches for this token ({self.per_token} open, KUBE_MAX_WATCHES_PER_TOKEN); "
                    f"close some or retry later")
        return None

    async def _watch(self, scope, receive, send) -> None:
        start = await self.run(_start, scope, b"")
        if not isinstance(start, WatchStart):
            await self._send_response(send, start)
            return
        refusal = self._refusal(start.holder)
        if refusal:
            self.refused += 1
            await self._answer(send, 429, status_body(429, refusal, "TooManyRequests",
                                                      {"retryAfterSeconds": RETRY_AFTER_SECONDS}),
                               [(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
            return
        self.active += 1
        self.served += 1
        self.holders[start.holder] += 1
        try:
            await self._stream(start, send, receive)
        finally:
            self.active -= 1
            self.holders[start.holder] -= 1
            if self.holders[start.holder] <= 0:
                del self.holders[start.holder]

    async def _stream(self, start: WatchStart, send, receive) -> None:
        w = start.watch
        stream = Stream(send, receive)
        sub = None
        if not isinstance(w, workload_watch.DiffWatch):
            sub = self.hub.subscribe(w.store.change_resource or "", w.namespace, start.namespaces)
        listener = asyncio.create_task(stream.listen(sub))
        try:
            await stream.open()
            # A last line of defence: a client that stopped reading blocks its sends; none outlives its timeout.
            async with asyncio.timeout(w.timeout + 30):
                if sub is None:
                    await self._follow_renderings(w, start.since, stream)
                else:
                    await self._follow_log(w, start, sub, stream)
            await stream.end()
        except TimeoutError:
            log.info("a watch outlived its timeout (a client not reading); closed")
        finally:
            listener.cancel()
            if sub is not None:
                self.hub.unsubscribe(sub)

    async def _follow_log(self, w: kube_watch.Watch, start: WatchStart, sub: Subscriber, stream: Stream) -> None:
        deadline = time.monotonic() + w.timeout
        since = start.since
        try:
            if since is None:
                since, initial = await self.run(_initial_events, w)
                await stream.write(initial)
            else:
                await self.run(changes.check_not_expired, since)
            last = await self._catch_up(w, start, since, sub, stream, deadline)
            await self._from_hub(w, last, sub, stream, deadline)
        except changes.Expired as exc:
            await stream.write(json.dumps({"type": "ERROR", "object": status_body(410, str(exc), "Expired")})
                               .encode() + b"\n")

    async def _catch_up(self, w, start: WatchStart, since: int, sub: Subscriber, stream: Stream,
                        deadline: float) -> int:
        """From ``since`` up to where the hub was when this watch joined, with a cursor of its own."""
        cursor = changes.Cursor(since)
        while cursor.seq < sub.joined_at and time.monotonic() < deadline and not stream.closed.is_set():
            batch = await self.run(cursor.read, {sub.resource}, w.namespace)
            batch = [c for c in batch if in_namespaces(c.namespace, w.namespace, start.namespaces)]
            if batch:
                await stream.write(await self.run(_render, w, batch))
            elif cursor.seq < sub.joined_at:
                await asyncio.sleep(changes_poll_seconds())  # a gap: its writer has not ended yet
        return cursor.seq

    async def _from_hub(self, w, last: int, sub: Subscriber, stream: Stream, deadline: float) -> None:
        namespaces = sub.readable
        while not stream.closed.is_set() and not sub.dropped:
            now = time.monotonic()
            wait = deadline - now
            if wait <= 0:
                return
            if w.bookmarks:
                wait = min(wait, max(0.0, stream.last_sent + kube_watch.BOOKMARK_SECONDS - now))
            try:
                async with asyncio.timeout(wait):
                    batch = await sub.queue.get()
            except TimeoutError:
                if w.bookmarks and time.monotonic() - stream.last_sent >= kube_watch.BOOKMARK_SECONDS:
                    # Nothing of this watch's is waiting: every change up to the hub's position was delivered.
                    await stream.write(w._bookmark(max(last, self.hub.delivered)))
                continue
            if batch is None:
                return
            fresh = [c for c in batch if c.seq > last]
            if fresh:
                await stream.write(await self._render_shared(w, namespaces, fresh))
                last = fresh[-1].seq

    async def _render_shared(self, w, namespaces: frozenset[str] | None, batch: list) -> bytes:
        """The events of ``batch`` for ``w``, rendered once for every watch that would render them the same
        (a thousand watches of one namespace cost one query per change, not a thousand)."""
        if w.as_table and w.first_table:  # its first Table carries the column definitions: its own
            return await self.run(_render, w, batch)
        params = w.params
        key = (w.store.resource.plural, w.namespace, namespaces, w.version, w.as_table, w.include,
               params.get("fieldSelector"), params.get("labelSelector"), tuple(c.seq for c in batch))
        future = self.renders.get(key)
        if future is None:
            future = self.renders[key] = asyncio.ensure_future(self.run(_render, w, batch))
            asyncio.get_running_loop().call_later(RENDER_SHARED_SECONDS, self.renders.pop, key, None)
        return await asyncio.shield(future)

    async def _follow_renderings(self, w, since: int | None, stream: Stream) -> None:
        """The workload kinds (``kube.workload_watch``): their renderings compared every second."""
        deadline = time.monotonic() + w.timeout
        state: dict = {}
        await stream.write(await self.run(_diff_first, w, since, state))
        while time.monotonic() < deadline and not stream.closed.is_set():
            try:
                async with asyncio.timeout(workload_watch.POLL_SECONDS):
                    await stream.closed.wait()
                return
            except TimeoutError:
                pass
            chunk = await self.run(_diff_next, w, state)
            if chunk:
                await stream.write(chunk)
            elif w.bookmarks and time.monotonic() - stream.last_sent >= kube_watch.BOOKMARK_SECONDS:
                await stream.write(w._bookmark(await self.run(changes.settled)))


def changes_poll_seconds() -> float:
    return kube_watch.POLL_SECONDS


def _diff_first(w, since: int | None, state: dict) -> bytes:
    state["seen"] = w._snapshot()
    state["digests"] = {uid: workload_watch._digest(obj) for uid, obj in state["seen"].items()}
    # From a resourceVersion too: the client's list may be older than this rendering (``DiffWatch.stream``).
    return b"".join(w._event("ADDED" if since is None else "MODIFIED", obj) for obj in state["seen"].values())


def _diff_next(w, state: dict) -> bytes:
    seen, digests = state["seen"], state["digests"]
    now = w._snapshot()
    out = []
    for uid, obj in now.items():
        digest = workload_watch._digest(obj)
        if digests.get(uid) != digest:
            out.append(w._event("MODIFIED" if uid in digests else "ADDED", obj))
            digests[uid] = digest
    for uid in [u for u in digests if u not in now]:
        out.append(w._event("DELETED", seen[uid]))
        del digests[uid]
    seen.update(now)
    return b"".join(out)
