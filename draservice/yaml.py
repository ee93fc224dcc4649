"""YAML in and out, because Kubernetes users paste manifests. The parser lives with the JSON one in
``draservice.parsers`` (both bound nesting and refuse NUL characters)."""
import yaml
from rest_framework.renderers import BaseRenderer

from draservice.parsers import YAMLParser

__all__ = ["YAMLParser", "YAMLRenderer"]


class YAMLRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return yaml.safe_dump(_plain(data), sort_keys=False, allow_unicode=True).encode("utf-8")


def _plain(data):
    """Plain Python types only: safe_dump refuses subclasses, and DRF hands over ReturnDict/ReturnList,
    OrderedDicts and ErrorDetail (a ``str`` subclass) among others."""
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if data is None or isinstance(data, bool):
        return data
    for plain in (str, int, float):  # bool is an int: handled above
        if isinstance(data, plain):
            return plain(data)
    return str(data)
