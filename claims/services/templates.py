"""ResourceClaimTemplates (``resource.k8s.io/v1``): create, update (labels and annotations; the spec is immutable,
as upstream's) and delete. A template's claims are made by ``claims.services.consumers``."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from claims import k8s
from claims.models import ResourceClaimTemplate
from claims.placement import parse_annotations
from claims.services.claims import check_device_classes, get_namespace_for_write
from draservice.errors import AlreadyExists, Conflict, Invalid
from draservice.etag import check_precondition


def create_template(ns_name: str, obj: dict) -> ResourceClaimTemplate:
    with transaction.atomic():
        ns = get_namespace_for_write(ns_name)
        api_version = k8s.check_kind(obj, "ResourceClaimTemplate")
        meta = k8s.parse_metadata(obj, namespace=ns.name)
        spec = k8s.template_spec_to_v1(obj.get("spec"), api_version, "spec")
        check_device_classes([("spec.spec", spec["spec"])])
        parse_annotations((spec.get("metadata") or {}).get("annotations") or {}, "spec.metadata.annotations")
        if ResourceClaimTemplate.objects.filter(namespace=ns, name=meta["name"]).exists():
            raise AlreadyExists([("metadata.name", f'resourceclaimtemplates "{meta["name"]}" already exists')])
        try:
            with transaction.atomic():
                return ResourceClaimTemplate.objects.create(namespace=ns, name=meta["name"], labels=meta["labels"],
                                                            annotations=meta["annotations"], spec=spec,
                                                            source_api_version=api_version)
        except IntegrityError as exc:
            raise Conflict(f'resourceclaimtemplates "{meta["name"]}" was created concurrently') from exc


def update_template(template_id: int, obj: dict, *, if_match: str | None = None) -> ResourceClaimTemplate:
    """PUT of a whole template: labels and annotations may change; the spec is immutable, as upstream's."""
    with transaction.atomic():
        template = (ResourceClaimTemplate.objects.select_for_update(of=("self",)).select_related("namespace")
                    .get(pk=template_id))
        check_precondition(template, if_match)
        api_version = k8s.check_kind(obj, "ResourceClaimTemplate")
        meta = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
        if meta.get("name") not in (None, template.name):
            raise Invalid([("metadata.name", "field is immutable")])
        parsed = k8s.parse_metadata({"metadata": {**meta, "name": template.name}}, namespace=template.namespace.name)
        if obj.get("spec") is not None and k8s.template_spec_to_v1(obj.get("spec"), api_version,
                                                                   "spec") != template.spec:
            raise Invalid([("spec", "field is immutable")])
        template.labels, template.annotations = parsed["labels"], parsed["annotations"]
        template.resource_version += 1
        template.save(update_fields=["labels", "annotations", "resource_version"])
    return template


def delete_template(template_id: int, *, if_match: str | None = None) -> None:
    with transaction.atomic():
        template = ResourceClaimTemplate.objects.select_for_update().get(pk=template_id)
        check_precondition(template, if_match)
        template.delete()
