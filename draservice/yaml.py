"""YAML in and out, because Kubernetes users paste manifests."""
import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer


class YAMLParser(BaseParser):
    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            docs = [d for d in yaml.safe_load_all(stream.read().decode("utf-8")) if d is not None]
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ParseError(f"YAML parse error: {exc}") from exc
        if len(docs) == 1:
            return docs[0]
        return {"apiVersion": "v1", "kind": "List", "items": docs}


class YAMLRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return yaml.safe_dump(_plain(data), sort_keys=False, allow_unicode=True).encode("utf-8")


def _plain(data):
    # DRF's ReturnDict/ReturnList and OrderedDicts are not safe_dump-able as-is.
    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v) for v in data]
    if isinstance(data, (str, int, float, bool)) or data is None:
        return data
    return str(data)
