"""Domain exceptions: what a service refuses, in the service's words, with no HTTP in them.

Services (and the validation they call) raise these; each door maps them in one place to its own answer:
``draservice.problems.exception_handler`` (problem+json under /api) and ``kube.status.translate`` (a Kubernetes
``Status`` under /k8s), both from the status codes in ``draservice.problems.STATUS``.

An error names what is wrong either as field errors, ``[(field path, reason), ...]`` (the body's ``errors``), or
as one message about the whole request.
"""
from __future__ import annotations


class ServiceError(Exception):
    """``what``: field errors ``[(path, reason)]`` (or ``{"field", "reason"}`` dicts) or one message.
    ``title``: the problem's title when not the door's default; ``extra``: more members of the problem body
    (the manifest doctor's rewrite, for one)."""

    title: str | None = None

    def __init__(self, what: str | list[tuple[str, str]] | list[dict], detail: str | None = None, *,
                 title: str | None = None, extra: dict | None = None):
        if isinstance(what, str):
            self.errors: list[dict] = []
            detail = what if detail is None else detail
        else:
            self.errors = [e if isinstance(e, dict) else {"field": e[0], "reason": e[1]} for e in what]
            if detail is None:
                detail = "; ".join(f"{e['field']}: {e['reason']}" if e["field"] else e["reason"]
                                   for e in self.errors)
        super().__init__(detail)
        self.detail: str = detail
        if title is not None:
            self.title = title
        self.extra: dict = dict(extra or {})

    def with_errors(self, errors: list[tuple[str, str]]) -> ServiceError:
        """The same refusal with its field paths said otherwise (a caller whose body nests the callee's); a
        refusal without field errors is returned as it is."""
        if not self.errors:
            return self
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.errors = [{"field": field, "reason": reason} for field, reason in errors]
        copy.detail = "; ".join(f"{e['field']}: {e['reason']}" if e["field"] else e["reason"] for e in copy.errors)
        copy.args = (copy.detail,)
        return copy


class Invalid(ServiceError):
    """The object (or a field of it) is invalid."""


class BadRequest(ServiceError):
    """The request around the object is malformed: a query parameter, a header, a body that is no object."""


class NotFound(ServiceError):
    """What the request names does not exist (any more)."""


class AlreadyExists(ServiceError):
    """An object of that name exists already."""

    title = "AlreadyExists"


class Conflict(ServiceError):
    """The object's current state forbids the request (or another writer got there first)."""


class PreconditionFailed(ServiceError):
    """The caller's precondition (If-Match) does not hold."""


class Forbidden(ServiceError):
    """The caller may not do this with what it names (a claim naming a reservation its namespace may not use)."""

    title = "Forbidden"


class QuotaExceeded(ServiceError):
    """Over a namespace's object-count cap (as a Kubernetes ResourceQuota refuses)."""


class Throttled(ServiceError):
    """Over a rate cap; ``wait``: seconds until a retry can pass."""

    def __init__(self, what: str, *, wait: int):
        super().__init__(what)
        self.wait = wait
