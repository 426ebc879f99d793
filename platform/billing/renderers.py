"""A CSV renderer for the billing exports (``?format=csv`` or ``Accept: text/csv``)."""

import csv
import io
from collections.abc import Mapping
from typing import Any

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    """A list of flat objects as CSV: a header row, then one row per object.

    The columns are the view's ``csv_fields`` (so an empty list still has its header), else the
    first object's keys. An object (an error such as ``{"detail": ...}``) becomes one row.
    """

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Mapping | None = None
    ) -> bytes:
        if data is None:
            return b""
        rows = [data] if isinstance(data, Mapping) else list(data)
        view = (renderer_context or {}).get("view")
        fields = getattr(view, "csv_fields", None) if not isinstance(data, Mapping) else None
        if fields is None:
            fields = list(rows[0]) if rows else []
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\r\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if value is None else value for key, value in row.items()})
        return out.getvalue().encode(self.charset)
