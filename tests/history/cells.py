"""The cells of a dashboard page's table rows, read with the standard library's HTML parser: for each ``<tr>``
with a given ``data-testid``, its attributes and its cells (attributes and text, whitespace collapsed; the
lines of a cell, its elements, one space apart)."""
from __future__ import annotations

from html.parser import HTMLParser


class _Rows(HTMLParser):
    def __init__(self, testid: str):
        super().__init__()
        self.testid, self.rows, self._row, self._cell = testid, [], None, None

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "tr" and found.get("data-testid") == self.testid:
            self._row = {"attrs": found, "cells": []}
        elif tag == "td" and self._row is not None:
            self._cell = {"attrs": found, "text": ""}
        elif self._cell is not None:
            self._cell["text"] += " "  # an element inside a cell (a line of it) is a word of its own

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None and self._row is not None:
            self._cell["text"] = " ".join(self._cell["text"].split())
            self._row["cells"].append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def rows(html: str, testid: str) -> list[dict]:
    """``[{"attrs": {...}, "cells": [{"attrs": {...}, "text": "..."}]}]`` of the rows marked ``testid``."""
    parser = _Rows(testid)
    parser.feed(html)
    return parser.rows


def cells(row: dict, name: str) -> list[dict]:
    """The cells of ``row`` marked ``data-cell=name``, in order (what happened, then the replay)."""
    return [c for c in row["cells"] if c["attrs"].get("data-cell") == name]
