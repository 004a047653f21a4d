"""Column types shared by the models and the migrations."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware.

    SQLite keeps no zone, so naive values read from it are UTC by construction.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps given to the catalog must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# HLC text (`%013d.%05d@region`) sorts as the HLC order only byte-wise: PostgreSQL's
# default collation may ignore punctuation, so the column collates as "C" there
# (SQLite compares bytes already).
HLC_TEXT_LENGTH = 96
HlcText = String(HLC_TEXT_LENGTH).with_variant(String(HLC_TEXT_LENGTH, collation="C"), "postgresql")
