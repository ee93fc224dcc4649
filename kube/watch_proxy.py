"""``manage.py serve``'s front: the watch server answers watches and passes every other request to gunicorn.

Why a front and not a redirect: a watch must work on the URL kubectl was given. client-go follows a 307 on a
GET, but the Python client (urllib3) drops the Authorization header on a redirect to another port, and
kubeconfigs, TLS names and proxies all point at the one public address. The front terminates TLS (the same
certificate gunicorn would serve) and forwards plain HTTP to gunicorn on a loopback port, so it can see the
query string. In production a reverse proxy (nginx, Envoy) does this routing instead (README, "Watches").

Bodies are read whole before forwarding (gunicorn's views do too), responses are streamed as they come (the
``?wait=`` long polls). Hop-by-hop headers are dropped; X-Forwarded-For and X-Forwarded-Proto are set here
(gunicorn trusts them from 127.0.0.1 only, its default), never passed on from the client.
"""
from __future__ import annotations

import json

import httpx

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
              b"transfer-encoding", b"upgrade", b"expect", b"x-forwarded-for", b"x-forwarded-proto",
              b"x-forwarded-host", b"x-forwarded-protocol", b"x-forwarded-ssl", b"forwarded"}
# Longer than the longest long poll (draservice.requests.MAX_WAIT) and gunicorn's own timeout.
READ_TIMEOUT = 200.0


class Proxy:
    def __init__(self, upstream: str):
        self.upstream = httpx.URL(upstream)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=5.0, read=READ_TIMEOUT, write=60.0, pool=30.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=30.0),
            follow_redirects=False, trust_env=False)

    async def close(self) -> None:
        await self.client.aclose()

    async def __call__(self, scope, receive, send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw_path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            raw_path += b"?" + scope["query_string"]
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        client = scope.get("client")
        if client:
            headers.append((b"x-forwarded-for", client[0].encode()))
        headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
        request = self.client.build_request(scope["method"], self.upstream.copy_with(raw_path=raw_path),
                                            headers=headers, content=bytes(body))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _bad_gateway(send, f"the web server did not answer: {type(exc).__name__}")
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError:
            pass  # the web server went away mid-response: the client sees the connection end
        finally:
            await response.aclose()


async def _bad_gateway(send, message: str) -> None:
    body = json.dumps({"type": "about:blank", "title": "Bad Gateway", "status": 502, "detail": message}).encode()
    await send({"type": "http.response.start", "status": 502,
                "headers": [(b"content-type", b"application/problem+json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
