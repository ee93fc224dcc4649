"""The ``/scale`` subresource (``autoscaling/v1`` Scale) of Deployments and StatefulSets: what ``kubectl scale``
reads and patches. A write becomes a replace of the object with the new ``spec.replicas`` (its store, so the
workload service makes or deletes the pods and their claims)."""
from __future__ import annotations

from kube import patch
from kube.status import KubeError

SCALABLE = ("deployments", "statefulsets")


def _selector(spec: dict) -> str:
    labels = ((spec.get("selector") or {}).get("matchLabels") or {})
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def scale_of(rendered: dict) -> dict:
    meta, spec, status = rendered["metadata"], rendered.get("spec") or {}, rendered.get("status") or {}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": spec.get("replicas", 1)},
            "status": {"replicas": status.get("replicas", 0), "selector": _selector(spec)}}


def _store_and_object(view, kw):
    if view.resource.plural not in SCALABLE:
        raise KubeError(404, "the server could not find the requested resource")
    obj = view.store.get(kw.get("namespace"), kw["name"])
    return obj, view.store.render(obj, kw["version"])


def get(view, kw) -> dict:
    return scale_of(_store_and_object(view, kw)[1])


def write(view, request, kw) -> dict:
    """PUT a Scale, or PATCH one (merge, strategic or JSON patch, as kubectl sends)."""
    obj, rendered = _store_and_object(view, kw)
    current = scale_of(rendered)
    body = request.data if request.method == "PUT" else patch.apply_patch(current, request.data,
                                                                            request.content_type or "")
    replicas = ((body or {}).get("spec") or {}).get("replicas") if isinstance(body, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise KubeError(422, f'Scale.autoscaling "{obj.name}" is invalid: spec.replicas: Required value: an integer')
    wanted_version = (body.get("metadata") or {}).get("resourceVersion")
    rendered.pop("status", None)
    rendered["spec"] = {**rendered["spec"], "replicas": replicas}
    rendered["metadata"] = {k: v for k, v in rendered["metadata"].items() if k != "resourceVersion"}
    if request.method == "PUT" and wanted_version:
        rendered["metadata"]["resourceVersion"] = wanted_version
    view.store.replace(view, obj, rendered)
    return get(view, kw)
