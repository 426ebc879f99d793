"""Tables of problems as files (CSV, Parquet), written by the libraries a user's tools use, for the
engine's and the platform's dataset tests."""

from __future__ import annotations

import csv
import io


def csv_bytes(rows: list[dict]) -> bytes:
    """A CSV file: a header line of the first row's keys, then a record a row (``\\r\\n`` line ends)."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def parquet_bytes(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()
