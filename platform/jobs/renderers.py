"""JSON Lines for a job's metrics (``jobs/{id}/metrics/?format=jsonl``): the file a run of
``plexrl train`` writes (``metrics.jsonl``), downloadable for any job, session or preset."""

import json
from collections.abc import Mapping
from typing import Any

from rest_framework.renderers import BaseRenderer


class JSONLinesRenderer(BaseRenderer):
    """A list of objects as one compact JSON object a line, keys sorted (so the bytes depend on
    the values only, not on how the database kept them: two runs that logged the same numbers
    download the same file). An object (an error such as ``{"detail": ...}``) is one line."""

    media_type = "application/jsonl"
    format = "jsonl"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Mapping | None = None
    ) -> bytes:
        if data is None:
            return b""
        rows = [data] if isinstance(data, Mapping) else list(data)
        return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode(self.charset)
