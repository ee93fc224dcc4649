"""Bearer-token authentication: ``Authorization: Bearer dra_<prefix>_<secret>``.

``request.auth`` is the ``APIToken``; ``request.user`` is a ``TokenPrincipal`` (not a Django user) so that
DRF's ``IsAuthenticated`` and templates work unchanged. Session-authenticated Django users keep
``request.auth = None``; ``draservice.permissions.access_for(request)`` treats staff as admins and everyone
else as read-only.
"""
from __future__ import annotations

import hmac
import threading
import time
from datetime import timedelta

from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from draservice.models import APIToken
from draservice.tokens import split_secret

# last_used_at is informational; writing it on every request would turn every read into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)

# Verified tokens are kept in memory for TOKEN_CACHE_SECONDS, so that a burst of requests does not read the
# same row once per request. The key is the hash of the whole presented secret (never the prefix alone), so
# only the exact secret that was verified against a row can hit. Bounds on what the cache may delay:
# * expiry is checked on every request, against the cached ``expires_at``;
# * revocation (deleting the row) or any change saved through the ORM in THIS process empties the cache at
#   once (signals below); a revocation or change made by another process takes effect within
#   TOKEN_CACHE_SECONDS at most;
# * last_used_at stays accurate to LAST_USED_RESOLUTION (the update below still runs from cached tokens).
TOKEN_CACHE_SECONDS = 5.0
TOKEN_CACHE_MAX = 1024
_token_cache: dict[str, tuple[float, APIToken]] = {}
_token_cache_lock = threading.Lock()


def clear_token_cache(*args, **kwargs) -> None:
    with _token_cache_lock:
        _token_cache.clear()


post_save.connect(clear_token_cache, sender=APIToken, dispatch_uid="draservice.auth.token_cache.save")
post_delete.connect(clear_token_cache, sender=APIToken, dispatch_uid="draservice.auth.token_cache.delete")


def _cached_token(secret_hash: str) -> APIToken | None:
    entry = _token_cache.get(secret_hash)
    if entry is None:
        return None
    if time.monotonic() - entry[0] > TOKEN_CACHE_SECONDS:
        with _token_cache_lock:
            if _token_cache.get(secret_hash) is entry:
                del _token_cache[secret_hash]
        return None
    return entry[1]


def _remember_token(secret_hash: str, token: APIToken) -> None:
    with _token_cache_lock:
        if len(_token_cache) >= TOKEN_CACHE_MAX:
            _token_cache.clear()
        _token_cache[secret_hash] = (time.monotonic(), token)


class TokenPrincipal:
    """Who a token request acts as. Quacks enough like a Django user for DRF and templates."""

    is_authenticated = True
    is_anonymous = False
    is_active = True

    def __init__(self, token: APIToken):
        self.token = token
        self.is_staff = token.is_admin and not token.read_only
        self.is_superuser = False
        self.username = f"token:{token.name}"
        self.pk = None
        self.id = None

    def __str__(self) -> str:
        return self.username

    def get_username(self) -> str:
        return self.username


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None  # not ours: let session authentication try
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            secret = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        token = self.authenticate_secret(secret)
        return TokenPrincipal(token), token

    @staticmethod
    def authenticate_secret(secret: str) -> APIToken:
        prefix = split_secret(secret)
        presented = APIToken.hash_secret(secret) if prefix else ""
        token = _cached_token(presented) if prefix else None  # only ever a row verified against this secret
        if token is None:
            token = APIToken.objects.select_related("cluster").filter(prefix=prefix).first() if prefix else None
            # Compare hashes in constant time; an unknown prefix and a wrong secret look the same to the caller.
            if token is None or not hmac.compare_digest(token.secret_hash, presented):
                raise exceptions.AuthenticationFailed("Invalid token.")
            _remember_token(presented, token)
        now = timezone.now()
        if token.is_expired(now):
            raise exceptions.AuthenticationFailed("Token has expired.")
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            APIToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token

    def authenticate_header(self, request):
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents the scheme in /api/schema/ (drf-spectacular finds extensions by import)."""

    target_class = "draservice.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "dra_<prefix>_<secret>",
                "description": "An API token (python manage.py create_token, or a cluster's token)."}
