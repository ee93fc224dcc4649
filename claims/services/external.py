"""Claims that another allocator places (e.g. gangs: all or nothing over many consumers).

An app registers the annotation that marks its claims (in ``AppConfig.ready``). The claims round never takes
such claims, nor groups containing one, and the claims API does not let a user change the marker.
"""
from __future__ import annotations

from claims.models import ResourceClaim

EXTERNAL_ALLOCATOR_ANNOTATIONS: set[str] = set()


def register_external_allocator(annotation: str) -> None:
    EXTERNAL_ALLOCATOR_ANNOTATIONS.add(annotation)


def managed_elsewhere(claim: ResourceClaim) -> str | None:
    return next((a for a in EXTERNAL_ALLOCATOR_ANNOTATIONS if a in (claim.annotations or {})), None)
