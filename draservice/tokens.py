"""Issuing bearer tokens. The secret exists only in the return value of ``issue_token``."""
from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta

from django.db.models import Model
from django.utils import timezone

from draservice.models import APIToken

SECRET_PREFIX = "dra"
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> timedelta (for ``--expires``)."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"invalid duration {text!r}: use a positive number followed by s, m, h, d or w (e.g. 7d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def issue_token(*, kind: str, name: str = "", cluster: Model | None = None, namespaces: list[str] | None = None,
                read_only: bool = False, expires_at: datetime | None = None,
                expires_in: timedelta | None = None) -> tuple[APIToken, str]:
    """Create a token and return (token, secret). The secret is not stored and cannot be recovered.

    ``cluster``: the ``inventory.Cluster`` a cluster token pushes the inventory of."""
    if kind not in {k for k, _ in APIToken.KINDS}:
        raise ValueError(f"unknown token kind {kind!r}")
    if kind == APIToken.CLUSTER and cluster is None:
        raise ValueError("a cluster token needs a cluster")
    if kind == APIToken.NAMESPACE and not namespaces:
        raise ValueError("a namespace token needs at least one namespace")
    if kind != APIToken.CLUSTER:
        cluster = None
    if kind != APIToken.NAMESPACE:
        namespaces = []
    if expires_in is not None:
        expires_at = timezone.now() + expires_in
    prefix = secrets.token_hex(6)
    secret = f"{SECRET_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    if not name:
        name = {APIToken.ADMIN: "admin", APIToken.CLUSTER: f"cluster {cluster if cluster else ''}",
                APIToken.NAMESPACE: "namespaces " + ",".join(namespaces or [])}[kind]
    token = APIToken.objects.create(
        name=name[:128], prefix=prefix, secret_hash=APIToken.hash_secret(secret), kind=kind,
        cluster_id=cluster.pk if cluster is not None else None, namespaces=sorted(set(namespaces or [])),
        read_only=read_only, expires_at=expires_at,
    )
    return token, secret


def split_secret(secret: str) -> str | None:
    """The lookup prefix of a presented secret, or None if it is not shaped like one of ours."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != SECRET_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]
