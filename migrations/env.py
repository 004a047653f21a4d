"""Alembic environment: runs online against the connection or URL given in code."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from controlplane.catalog.engine import make_engine
from controlplane.catalog.models import Base

config = context.config
target_metadata = Base.metadata


def _run(conn: Connection) -> None:
    context.configure(
        connection=conn,
        target_metadata=target_metadata,
        render_as_batch=conn.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


given = config.attributes.get("connection")
if given is not None:
    _run(given)
else:
    engine = make_engine(
        config.attributes.get("meridian_url") or config.get_main_option("sqlalchemy.url") or ""
    )
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()
