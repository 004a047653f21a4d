"""Throwaway catalogs for tests: a fresh SQLite file or PostgreSQL database each time.

Every test folder (through `harness.catalog_fixtures`) and the catalog benchmark
(through `benchmarks/bench_harness.py`) use it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from controlplane.catalog import migrate


@contextmanager
def scratch_postgres(server_url: str, prefix: str = "meridian_t") -> Iterator[str]:
    """Create a uniquely named database on the server of `server_url`, yield its URL,
    then drop it (forcing out any connection left behind)."""
    base = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextmanager
def scratch_catalog(
    backend: str, folder: Path, postgres_url: str | None, *, migrated: bool = True
) -> Iterator[str]:
    """A fresh catalog URL on `backend` ("sqlite" or "postgresql"), migrated to head."""
    if backend == "sqlite":
        url = f"sqlite:///{folder / f'catalog-{uuid.uuid4().hex[:8]}.db'}"
        if migrated:
            migrate.upgrade(url)
        yield url
        return
    if postgres_url is None:
        raise RuntimeError("a PostgreSQL server URL is needed for the postgresql backend")
    with scratch_postgres(postgres_url) as url:
        if migrated:
            migrate.upgrade(url)
        yield url
