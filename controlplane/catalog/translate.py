"""SQLAlchemy and driver errors → the catalog's errors, in one place.

Every public method of `Catalog` is wrapped with `translated`, so callers see only
Meridian errors and ask `error.retriable`:

* the server cannot be reached, the connection broke, the pool is exhausted, SQLite
  is locked past its busy timeout or its file cannot be opened, PostgreSQL found a
  serialization failure or deadlock → `CatalogUnavailableError` or
  `CatalogConflictError` (retriable);
* a unique key a concurrent writer took first → `CatalogConflictError` (retriable);
  any other constraint the caller's input broke → `CatalogInputError` (not retriable);
* anything else from SQLAlchemy → `CatalogError` (not retriable: a bug or a damaged
  schema, which retrying would only repeat).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy import exc as sa

from controlplane.catalog.engine import redacted
from controlplane.catalog.errors import (
    CatalogConflictError,
    CatalogError,
    CatalogInputError,
    CatalogUnavailableError,
)
from controlplane.errors import MeridianError

P = ParamSpec("P")
R = TypeVar("R")

# SQLSTATE classes and codes that mean "try again": connection exceptions (08),
# operator intervention such as admin shutdown (57), insufficient resources (53),
# serialization failure and deadlock (40001, 40P01).
RETRY_CLASSES = ("08", "53", "57")
# 25006: a read-only transaction (the server became a standby in an HA switch);
# 40003: the server cannot say whether a statement completed.
RETRY_CODES = ("25006", "40003")
CONFLICT_CODES = ("40001", "40P01")
# A value the schema cannot hold: string too long, numeric out of range, invalid text
# for its type, bad or out-of-range date/time. (Not all of class 22: a division by
# zero is a bug, a character the database's encoding cannot hold is its setting.)
DATA_EXCEPTIONS = ("22001", "22003", "22P02", "22007", "22008")
SQLITE_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o", "disk is full")


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


S = TypeVar("S", bound=HasUrl)


def first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlstate(exc: sa.DBAPIError) -> str:
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return code if isinstance(code, str) else ""


def translate_error(exc: sa.SQLAlchemyError, url: str) -> MeridianError:
    """The Meridian error for a SQLAlchemy error raised while talking to `url`."""
    where = f"the catalog at {redacted(url)}"
    detail = first_line(exc)
    if isinstance(exc, sa.DBAPIError):
        state = _sqlstate(exc)
        if state in CONFLICT_CODES:
            return CatalogConflictError(f"{where} refused a concurrent write ({detail}); retry")
        if state in DATA_EXCEPTIONS:
            # The record's fault, which a retry repeats for ever.
            return CatalogInputError(f"{where} refused a value: {detail}")
        if isinstance(exc, sa.IntegrityError):
            if state == "23505" or "UNIQUE constraint failed" in detail:
                # Natural keys are inserted with ON CONFLICT DO NOTHING, so a unique
                # violation is a concurrent writer taking the same key (an HLC): retry.
                return CatalogConflictError(
                    f"{where} refused a write a concurrent one made first ({detail}); retry"
                )
            return CatalogInputError(f"{where} refused a write that breaks a constraint: {detail}")
        if isinstance(exc.orig, sqlite3.Error):
            # SQLite has no SQLSTATE and raises OperationalError for a missing table
            # as for a locked file: only the latter kind passes.
            if any(word in detail.lower() for word in SQLITE_TRANSIENT):
                return CatalogUnavailableError(
                    f"{where} is unavailable ({detail}); retrying may help"
                )
            return CatalogError(f"{where} failed: {detail}")
        if (
            exc.connection_invalidated
            or state[:2] in RETRY_CLASSES
            or state in RETRY_CODES
            or isinstance(exc, sa.InterfaceError | sa.OperationalError)
        ):
            # psycopg raises OperationalError for lost connections and refused or
            # timed-out connects, with or without a SQLSTATE.
            return CatalogUnavailableError(f"{where} is unavailable ({detail}); retrying may help")
        return CatalogError(f"{where} failed: {detail}")
    if isinstance(exc, sa.TimeoutError | sa.DisconnectionError):
        return CatalogUnavailableError(f"{where} is unavailable ({detail}); retrying may help")
    return CatalogError(f"{where} failed: {detail}")


def translated(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """Wrap a catalog method so no SQLAlchemy error leaves it (see the module docstring)."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except sa.SQLAlchemyError as exc:
            raise translate_error(exc, self.url) from exc

    return wrapper
