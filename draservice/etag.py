"""ETag / If-Match / If-None-Match for every writable object of the API: one implementation.

An object's ETag is quoted; ``etag_for(resource_version)`` for objects whose version alone identifies them, or
the model's own ``etag`` (claims, gangs: uid and version, so a re-created object never matches an old tag).
Views read the header with ``if_match(request)`` (or pass the raw header on) and hand it to the service, which
compares it with the row it has locked (``check_if_match`` / ``check_precondition``), so the check and the
write are one atomic step. Weak tags (``W/"…"``) compare by their value and a comma-separated list matches if
any tag does (RFC 9110 13.1.1), ``*`` matches anything.
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from draservice.errors import Conflict, PreconditionFailed

IF_MATCH_PARAMETER = OpenApiParameter(
    "If-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="The ETag from a previous read; the write fails with 412 if the object changed since.",
)


def etag_for(resource_version: int | str) -> str:
    """The quoted tag of a version (or content hash); a tag that is already quoted is returned as it is."""
    text = str(resource_version)
    return text if text.startswith('"') else f'"{text}"'


def parse_tags(header: str | None) -> list[str] | None:
    """The tags of an If-Match / If-None-Match header, weakness dropped; None when there is no header."""
    if header is None:
        return None
    return [tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()]


def if_match(request) -> list[str] | None:
    return parse_tags(request.headers.get("If-Match"))


def check_if_match(expected: list[str] | str | None, current: int | str) -> None:
    """412 unless ``expected`` (parsed tags, or a raw header) names ``current`` (an ETag, or a version or content
    hash that ``etag_for`` quotes)."""
    if isinstance(expected, str):
        expected = parse_tags(expected)
    if not expected or "*" in expected:
        return
    tag = etag_for(current)
    if tag not in expected:
        raise PreconditionFailed(f"If-Match {', '.join(expected)} does not match the current ETag {tag}.")


def check_precondition(obj, if_match_header: str | None, body_version: str | None = None) -> None:
    """If-Match against ``obj.etag`` (412 when stale) and Kubernetes' ``metadata.resourceVersion`` in the body
    (409 when stale, as the Kubernetes API answers an update with an old resourceVersion)."""
    check_if_match(if_match_header, obj.etag)
    if body_version not in (None, "") and str(body_version) != str(obj.resource_version):
        raise Conflict(f"the object has been modified (resourceVersion {obj.resource_version}, "
                       f"not {body_version}); read it again and retry")


def not_modified(request, resource_version: int | str) -> bool:
    tags = parse_tags(request.headers.get("If-None-Match"))
    if not tags:
        return False
    tag = etag_for(resource_version)
    return "*" in tags or tag in tags
