"""CSV for the usage report (``Accept: text/csv`` or ``?format=csv``): one header line, one line per item."""
from __future__ import annotations

import csv
import io

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        items = (data or {}).get("items") or [] if isinstance(data, dict) else []
        columns = (data or {}).get("columns") or (list(items[0]) if items else [])
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180
        writer.writerow(columns)
        for item in items:
            writer.writerow(["" if item.get(c) is None else item.get(c) for c in columns])
        return out.getvalue().encode(self.charset)
