"""Reads too hot for the ORM's query compiler: fixed SQL, its rows built into model instances.

Every API request by token makes the token read (``selectors.token_by_digest``). Built as a
queryset, compiling it cost about 2.5 ms of the web server's CPU a request, about a third of a
simple request's whole cost (profiled under uvicorn; README "REST under load"); the database
answers it in a fraction of that. Such a read is written here once as SQL over the models' own
table and column names, and its rows go through the same converters and ``Model.from_db`` as a
queryset's, so the instances are those the ORM would have built, on PostgreSQL and SQLite alike.

Keep this for reads that run on every request; anything else is a queryset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

Converter = Callable[[Any, Any, BaseDatabaseWrapper], Any]


class ModelColumns:
    """A model's concrete columns in a SELECT, under a table alias, and the instance of a row's
    slice of them. ``Organization`` as ``o``: ``columns.sql(connection)`` gives ``"o"."id",
    "o"."name", ...`` and ``columns.instance(values, connection)`` the ``Organization``."""

    def __init__(self, model: type[Model], alias: str):
        self.model, self.alias = model, alias
        self.fields: tuple[Field, ...] = tuple(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.width = len(self.fields)
        self._converters: dict[str, list[tuple[int, Converter, Field]]] = {}  # {connection alias: ...}

    def sql(self, connection: BaseDatabaseWrapper) -> str:
        quote = connection.ops.quote_name
        return ", ".join(f"{quote(self.alias)}.{quote(f.column)}" for f in self.fields)

    def converters(self, connection: BaseDatabaseWrapper) -> list[tuple[int, Converter, Field]]:
        """(position, converter, field) of every conversion a queryset would apply to these columns:
        the backend's (SQLite's datetimes and booleans arrive as text and integers) and the field's."""
        found = self._converters.get(connection.alias)
        if found is None:
            found = []
            for i, field in enumerate(self.fields):
                column = field.get_col(self.alias)
                for convert in (*connection.ops.get_db_converters(column), *field.get_db_converters(connection)):
                    found.append((i, convert, column))
            self._converters[connection.alias] = found
        return found

    def instance(self, values: Sequence[Any], connection: BaseDatabaseWrapper) -> Model:
        values = list(values)
        for i, convert, column in self.converters(connection):
            values[i] = convert(values[i], column, connection)
        return self.model.from_db(connection.alias, self.attnames, values)


def fetch_one(sql: str, params: Sequence[Any], using: str = "default") -> tuple[Any, ...] | None:
    """The first row of ``sql`` with ``params`` (``%s`` placeholders), or None."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()
