"""Outgoing webhooks, the transport: which targets may be called, how a call is signed, and one bounded POST.

Targets. ``WEBHOOK_ALLOWED_TARGETS`` lists ``scheme://host[:port]`` entries; a URL is allowed when its parsed
``(scheme, host, port)`` equals one of them (never a string prefix: ``http://127.0.0.1:18250@169.254.169.254/``
is a URL of host 169.254.169.254, and ``…:182500`` has no valid port). URLs with credentials are refused. At
delivery the host is resolved once; an address that is not global (loopback, private, link-local, unique
local, shared, reserved, IPv4-mapped …) is refused unless the allowed entry names exactly that address (an
admin who lists ``http://127.0.0.1:18250`` meant it; a name that resolves there did not ask for it). The
connection goes to the checked address, with the URL's host in ``Host`` and as the TLS server name: no second
lookup, so DNS rebinding between the check and the connection cannot move the call.

Signing (Standard Webhooks, https://www.standardwebhooks.com): ``webhook-id`` (the delivery's id, the same
on every retry), ``webhook-timestamp`` (seconds, per attempt) and ``webhook-signature: v1,<base64 of
HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``, the key being the base64 after ``whsec_`` in the secret.

Transport. One HTTP/1.1 POST with a total deadline (``WEBHOOK_DEADLINE_SECONDS``) over connect, TLS, send and
reading the status line and headers: every blocking step gets what is left of it, so a receiver trickling a
byte every few seconds is abandoned at the deadline. Redirects are never followed (the signature would go
along to wherever they point); a 3xx is a failed attempt.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # generated keys; a given one may be 24 to 64 bytes (the Standard Webhooks range)
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_HEAD_BYTES = 16 * 1024


class TargetRefused(Exception):
    """The URL may not be called (not allowed, malformed, or resolving to an address it may not reach)."""


class AttemptFailed(Exception):
    """One delivery attempt failed; ``retry`` says whether another attempt may succeed."""

    def __init__(self, message: str, retry: bool = True):
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower case; an IPv6 literal without brackets
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_target(url: str) -> tuple[Target, str]:
    """``(target, path with query)`` of an http(s) URL, or TargetRefused saying what is wrong with it."""
    if not isinstance(url, str) or not url.isascii() or any(ord(c) <= 32 or ord(c) == 127 for c in url):
        raise TargetRefused("must be an http(s) URL of ASCII characters without spaces (percent-encode the rest)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise TargetRefused(f"is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TargetRefused("must be an http(s) URL")
    if "@" in parts.netloc:
        raise TargetRefused("must not carry credentials (user@host)")
    try:
        port = parts.port
    except ValueError:
        raise TargetRefused("has an invalid port (an integer from 1 to 65535)") from None
    host = (parts.hostname or "").lower().rstrip(".")
    if not host or port == 0:
        raise TargetRefused("must name a host" if not host else "has an invalid port (an integer from 1 to 65535)")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(scheme, host, port or DEFAULT_PORTS[scheme]), path


def allowed_targets() -> dict[Target, str]:
    """The allow-list, parsed: target -> the entry as written. A malformed entry allows nothing."""
    out: dict[Target, str] = {}
    for entry in settings.WEBHOOK_ALLOWED_TARGETS:
        try:
            target, _ = parse_target(entry.strip())
        except TargetRefused:
            continue
        out[target] = entry
    return out


def check_url(url: str) -> Target:
    """The URL's target if the allow-list has it exactly; else TargetRefused (at write time and at delivery)."""
    target, _ = parse_target(url)
    if target not in allowed_targets():
        raise TargetRefused(f"{target} is not on the allow-list of webhook targets (setting "
                            "WEBHOOK_ALLOWED_TARGETS: scheme://host:port entries, matched exactly)")
    return target


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _reachable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and (address.ipv4_mapped or address.sixtofour or address.teredo):
        return False  # an IPv4 address in IPv6 clothing: judged as refused rather than unwrapped
    return address.is_global and not address.is_multicast


def resolve(target: Target) -> str:
    """The one address the call goes to (resolved once). Non-global addresses only when the allowed entry is
    that very address literal."""
    literal = _literal(target.host)
    if literal is not None:
        if not _reachable(literal) and target not in allowed_targets():
            raise TargetRefused(f"{target.host} is not a public address")
        return str(literal)
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AttemptFailed(f"cannot resolve {target.host}: {exc}") from None
    refused = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if _reachable(address):
            return str(address)
        refused.append(str(address))
    raise TargetRefused(f"{target.host} resolves only to addresses that are not public ({', '.join(refused)}); "
                        "allow the address itself to call it")


# ------------------------------------------------------------------------------------------------ signing

def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes | None:
    """The HMAC key of a ``whsec_<base64>`` secret, or None if it is not one."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (ValueError, TypeError):
        return None
    return key or None


def signature_headers(secret: str, message_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    key = secret_key(secret)
    if key is None:  # never sign with an empty or unknown key: such a signature proves nothing
        raise AttemptFailed("the webhook has no valid signing secret", retry=False)
    timestamp = str(int(now if now is not None else time.time()))
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": message_id, "webhook-timestamp": timestamp,
            "webhook-signature": "v1," + base64.b64encode(mac).decode()}


# ---------------------------------------------------------------------------------------------- transport

def post(url: str, body: bytes, headers: dict[str, str], deadline_seconds: float | None = None) -> int:
    """POST ``body`` to ``url`` (checked again here), within the total deadline. Returns the 2xx status;
    anything else raises AttemptFailed (TargetRefused for a target that may not be called)."""
    target = check_url(url)
    _, path = parse_target(url)
    address = resolve(target)
    budget = settings.WEBHOOK_DEADLINE_SECONDS if deadline_seconds is None else deadline_seconds
    ends = time.monotonic() + budget

    def left() -> float:
        remaining = ends - time.monotonic()
        if remaining <= 0:
            raise AttemptFailed(f"timeout: no complete answer within {budget:g} s")
        return remaining

    try:
        sock = socket.create_connection((address, target.port), timeout=left())
    except TimeoutError:
        raise AttemptFailed(f"timeout: no connection within {budget:g} s") from None
    except OSError as exc:
        raise AttemptFailed(f"connection to {address}:{target.port} failed: {exc}") from None
    try:
        if target.scheme == "https":
            context = ssl.create_default_context(cafile=settings.WEBHOOK_CA_FILE or None)
            sock.settimeout(left())
            sock = context.wrap_socket(sock, server_hostname=target.host)  # SNI and certificate: the URL's host
        host = f"[{target.host}]" if ":" in target.host else target.host
        if target.port != DEFAULT_PORTS[target.scheme]:
            host += f":{target.port}"
        head = "".join(f"{k}: {v}\r\n" for k, v in {
            "Host": host, "User-Agent": "draservice-webhooks", "Content-Type": "application/json",
            "Content-Length": str(len(body)), "Connection": "close", **headers}.items())
        sock.settimeout(left())
        sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        return _status(_read_head(sock, left))
    except TimeoutError:
        raise AttemptFailed(f"timeout: no complete answer within {budget:g} s") from None
    except ssl.SSLError as exc:
        raise AttemptFailed(f"TLS failed: {exc}") from None
    except OSError as exc:
        raise AttemptFailed(f"connection failed: {exc}") from None
    finally:
        sock.close()


def _read_head(sock: socket.socket, left) -> bytes:
    """The status line and headers; each read waits at most for what is left of the deadline."""
    data = b""
    while b"\r\n\r\n" not in data:
        sock.settimeout(left())
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_HEAD_BYTES:
            break
    return data


def _status(head: bytes) -> int:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise AttemptFailed(f"not an HTTP response: {line[:80]!r}")
    status = int(parts[1])
    if 300 <= status < 400:
        raise AttemptFailed(f"HTTP {status}: redirects are not followed", retry=False)
    if not 200 <= status < 300:
        raise AttemptFailed(f"HTTP {status}")
    return status
