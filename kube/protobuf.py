"""Just enough of Kubernetes' protobuf encoding to read the bodies kubectl sends as protobuf whatever the server
says (its typed clients, e.g. ``kubectl auth can-i``'s reviews): the ``k8s\\0`` envelope (runtime.Unknown) and
messages of strings and nested messages, read by field number. Answers go out as JSON, which clients accept."""
from __future__ import annotations

from kube.status import KubeError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise KubeError(400, "malformed protobuf body")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> dict[int, list]:
    """field number -> its values (bytes for length-delimited fields, int for varints); others skipped."""
    out: dict[int, list] = {}
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at:at + size], at + size
        else:
            raise KubeError(400, "malformed protobuf body")
        out.setdefault(number, []).append(value)
    return out


def unwrap(body: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, the object's own message) from a ``k8s\\0`` envelope."""
    if not body.startswith(MAGIC):
        raise KubeError(400, "a protobuf body starts with the k8s envelope")
    unknown = fields(body[len(MAGIC):])
    type_meta = fields((unknown.get(1) or [b""])[0])
    return (text(type_meta, 1), text(type_meta, 2), (unknown.get(2) or [b""])[0])


def text(message: dict[int, list], number: int) -> str:
    values = message.get(number)
    return values[0].decode("utf-8", "replace") if values else ""


def message(parent: dict[int, list], number: int) -> dict[int, list] | None:
    values = parent.get(number)
    return fields(values[0]) if values else None
