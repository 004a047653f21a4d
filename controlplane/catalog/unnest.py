"""Multi-row inserts on PostgreSQL as ONE statement over arrays (`unnest`).

psycopg's `executemany` sends one Bind/Execute per row (pipelined): for a recorder
batch of 500 versions that is about 1,500 statements the server parses, plans and
runs one by one, and most of the batch's time on a PostgreSQL catalog. The same
rows go as one array per column, expanded by `unnest` into one
`INSERT ... SELECT`: one statement, one plan, whatever the row count.

`unnest_form` turns the statement compiled for one row (`INSERT INTO t (a, b)
VALUES (%(a)s, %(b)s) ON CONFLICT ...`) into that form, keeping its ON CONFLICT
clause as SQLAlchemy compiled it. Each column's array is sent as
the base type of its kind (text, bigint, boolean, timestamptz: the INSERT's
assignment casts give the column's own type, length and collation); a JSON column
goes as text and is cast back. A column of any other kind returns None, and the
caller keeps `executemany`. Each column's values must be of one Python type (psycopg
types an array by its elements): the recorder's facts are, as `plan` checks them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, DateTime, FromClause
from sqlalchemy.engine import Dialect

# Python type of a column -> the array type its values are sent as.
_ARRAYS: dict[type, str] = {str: "TEXT", int: "BIGINT", bool: "BOOLEAN"}


@dataclass(frozen=True)
class UnnestForm:
    sql: str  # takes one parameter per column, p0..pN: that column's values, in order
    # Positions of JSON columns -> whether a None there is SQL NULL (the column type's
    # `none_as_null`) rather than JSON 'null', as SQLAlchemy would bind it.
    json_columns: dict[int, bool]
    serialize: Callable[[Any], str] = json.dumps  # the dialect's JSON serializer

    def parameters(self, columns: list[list[Any]]) -> dict[str, list[Any]]:
        """The statement's parameters from the rows' values by column (bind-processed,
        except JSON columns: their plain values, serialized here)."""
        out: dict[str, list[Any]] = {}
        for n, values in enumerate(columns):
            if n in self.json_columns:
                null = None if self.json_columns[n] else "null"
                out[f"p{n}"] = [null if v is None else self.serialize(v) for v in values]
            else:
                out[f"p{n}"] = values
        return out


def _array_type(column: Any, dialect: Dialect) -> tuple[str, str | None] | None:
    """(array element type, cast back to the column's type or None) for one column."""
    kind = column.type
    impl = getattr(kind, "impl", kind)  # a TypeDecorator's own type
    if isinstance(impl, JSON):
        return "TEXT", kind.compile(dialect=dialect)
    if isinstance(impl, DateTime):
        # Only zone-aware columns: timestamptz -> timestamp would shift by the session zone.
        return ("TIMESTAMPTZ", None) if impl.timezone else None
    try:
        python = impl.python_type
    except NotImplementedError:
        return None
    element = _ARRAYS.get(python)
    return None if element is None else (element, None)


def unnest_form(
    compiled_sql: str, table: FromClause, order: tuple[str, ...], dialect: Dialect
) -> UnnestForm | None:
    """The one-statement form of a one-row INSERT compiled for PostgreSQL (see the
    module), or None when it cannot be made (then insert row by row)."""
    insert_into, values_sep, rest = compiled_sql.partition(" VALUES (")
    if not values_sep or not insert_into.startswith("INSERT INTO "):
        return None
    # The clauses after the row's VALUES (...) (ON CONFLICT ...), found by balancing
    # parentheses, as the placeholders hold some (`%(key)s::VARCHAR`). A RETURNING
    # clause is dropped: nothing reads the rows it would return.
    depth, end = 1, 0
    while depth and end < len(rest):
        depth += {"(": 1, ")": -1}.get(rest[end], 0)
        end += 1
    if depth:
        return None
    tail = rest[end:].partition(" RETURNING ")[0]
    arrays: list[str] = []
    selected: list[str] = []
    json_columns: dict[int, bool] = {}
    for n, key in enumerate(order):
        typed = _array_type(table.c[key], dialect)
        if typed is None:
            return None
        element, cast_back = typed
        arrays.append(f"CAST(%(p{n})s AS {element}[])")
        if cast_back is None:
            selected.append(f"u.c{n}")
        else:
            kind = table.c[key].type
            json_columns[n] = bool(getattr(getattr(kind, "impl", kind), "none_as_null", False))
            selected.append(f"CAST(u.c{n} AS {cast_back})")
    # The column list is made here, in `order` (the compiled one is in the table's
    # order, which need not be the rows'), quoted as the dialect quotes.
    quote = dialect.identifier_preparer
    columns = ", ".join(quote.quote(table.c[key].name) for key in order)
    names = ", ".join(f"c{n}" for n in range(len(order)))
    # Only names the dialect quoted and placeholders: no value is in the text.
    sql = (
        f"INSERT INTO {quote.format_table(table)} ({columns}) "  # noqa: S608
        f"SELECT {', '.join(selected)} FROM unnest({', '.join(arrays)}) AS u({names})"
    )
    serialize = getattr(dialect, "_json_serializer", None) or json.dumps
    return UnnestForm(sql + tail, json_columns, serialize)
