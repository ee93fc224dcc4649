"""ETag / If-Match for writable objects: the ETag is the object's ``resource_version``.

Views read ``If-Match`` with ``if_match(request)`` and hand it to the service, which compares it with the
row it has locked (``check_if_match``), so the check and the write are one atomic step.
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from draservice.problems import PreconditionFailed

IF_MATCH_PARAMETER = OpenApiParameter(
    "If-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="The ETag from a previous read; the write fails with 412 if the object changed since.",
)


def etag_for(resource_version: int) -> str:
    return f'"{resource_version}"'


def if_match(request) -> list[str] | None:
    header = request.headers.get("If-Match")
    if header is None:
        return None
    return [tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()]


def check_if_match(expected: list[str] | None, resource_version: int) -> None:
    if expected is None or "*" in expected:
        return
    if etag_for(resource_version) not in expected:
        raise PreconditionFailed(
            f"If-Match {', '.join(expected)} does not match the current ETag {etag_for(resource_version)}."
        )


def not_modified(request, resource_version: int) -> bool:
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag_for(resource_version) in tags
