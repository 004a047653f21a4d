"""SQLAlchemy reaches both catalog databases: a SQLite file and the stack's PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, select

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'roundtrip.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_a_row_round_trips(database_url: str) -> None:
    metadata = MetaData()
    table = Table(
        f"roundtrip_{uuid.uuid4().hex[:8]}",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("region", String(63), nullable=False),
    )
    engine = create_engine(database_url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": 1, "region": "eu-west"}])
        with engine.connect() as conn:
            rows = conn.execute(select(table.c.id, table.c.region)).all()
        assert [tuple(r) for r in rows] == [(1, "eu-west")]
        expected_dialect = database_url.split(":", maxsplit=1)[0].split("+", maxsplit=1)[0]
        assert engine.dialect.name == expected_dialect
    finally:
        metadata.drop_all(engine)
        engine.dispose()
