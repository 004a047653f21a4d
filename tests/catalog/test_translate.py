"""Every SQLAlchemy error becomes one Meridian error with the right `retriable` flag."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import exc as sa

from controlplane.catalog.errors import (
    CatalogConflictError,
    CatalogError,
    CatalogInputError,
    CatalogUnavailableError,
)
from controlplane.catalog.translate import translate_error

URL = "postgresql+psycopg://meridian:secret@db:5432/meridian"


class PgError(Exception):
    """A driver error carrying a SQLSTATE, as psycopg's do."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


def _pg(kind: type[sa.DBAPIError], sqlstate: str) -> sa.DBAPIError:
    return kind("SELECT 1", {}, PgError(sqlstate, f"server says {sqlstate}"))


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (_pg(sa.OperationalError, "08006"), CatalogUnavailableError),  # connection failure
        (_pg(sa.OperationalError, "57P01"), CatalogUnavailableError),  # admin shutdown
        (_pg(sa.InternalError, "25006"), CatalogUnavailableError),  # read-only (standby)
        (_pg(sa.OperationalError, "53100"), CatalogUnavailableError),  # disk full
        (_pg(sa.OperationalError, "40001"), CatalogConflictError),  # serialization failure
        (_pg(sa.OperationalError, "40P01"), CatalogConflictError),  # deadlock
        (_pg(sa.IntegrityError, "23505"), CatalogConflictError),  # unique: a racing writer
        (_pg(sa.IntegrityError, "23503"), CatalogInputError),  # foreign key: bad input
        (_pg(sa.DataError, "22001"), CatalogInputError),  # a value too long for its column
        (_pg(sa.ProgrammingError, "42P01"), CatalogError),  # undefined table: a bug
        (
            sa.OperationalError("x", {}, sqlite3.OperationalError("database is locked")),
            CatalogUnavailableError,
        ),
        (
            sa.OperationalError("x", {}, sqlite3.OperationalError("database or disk is full")),
            CatalogUnavailableError,
        ),
        (
            sa.OperationalError("x", {}, sqlite3.OperationalError("no such table: replicas")),
            CatalogError,
        ),
        (sa.TimeoutError("QueuePool limit reached"), CatalogUnavailableError),
        (sa.NoResultFound("no row"), CatalogError),
    ],
)
def test_each_error_gets_its_class_and_flag(error: sa.SQLAlchemyError, want: type) -> None:
    got = translate_error(error, URL)
    assert type(got) is want
    assert got.retriable == (want in (CatalogUnavailableError, CatalogConflictError))
    assert "secret" not in str(got) and "\n" not in str(got)  # password hidden, one line
