"""Engine setup for the catalog and the checks that it is reachable and migrated.

SQLite gets foreign keys, WAL and a busy timeout (so concurrent writers wait
instead of failing at once); PostgreSQL gets a bounded connect timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

from controlplane.catalog.errors import CatalogNotMigratedError, CatalogUnavailableError
from controlplane.errors import ConfigError

HEAD_TABLES = ("alembic_version", "policy_revisions", "replicas", "transfers", "failovers")
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_TCP_USER_TIMEOUT_MS = 10_000
PG_STATEMENT_TIMEOUT_MS = 120_000  # long enough for a bulk COPY of millions of rows


def _on_sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def sqlite_file(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else None."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"catalog URL {url!r} is not a SQLAlchemy URL") from exc
    db = parsed.database
    if (
        parsed.get_backend_name() != "sqlite"
        or not db
        or db == ":memory:"
        or db.startswith("file:")
    ):
        return None
    return Path(db).expanduser()


def make_engine(url: str) -> Engine:
    """An engine for `url`; creates the parent folder of a SQLite file; never connects."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"catalog URL {url!r} is not a SQLAlchemy URL") from exc
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    elif parsed.get_backend_name() == "postgresql":
        # A blackholed server (packets dropped, not refused) must not hang a controller's
        # catalog thread for the kernel's ~15 minutes of retransmissions: TCP keepalives
        # and tcp_user_timeout end a dead connection within seconds, and a statement
        # waiting on a live but stuck server ends at statement_timeout (retriable).
        kwargs["connect_args"] = {
            "connect_timeout": 5,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 3,
            "keepalives_count": 3,
            "tcp_user_timeout": PG_TCP_USER_TIMEOUT_MS,
            "options": f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS}",
        }
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (ArgumentError, ImportError) as exc:
        raise ConfigError(f"catalog URL {url!r} cannot be used: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _on_sqlite_connect)
    return engine


def redacted(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def check_migrated(engine: Engine, url: str) -> None:
    """Raise one clear sentence when the catalog is unreachable or not migrated to head."""
    from controlplane.catalog.migrate import current_revision, head_revision

    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            current = current_revision(conn) if "alembic_version" in tables else None
    except OperationalError as exc:
        raise CatalogUnavailableError(
            f"the catalog at {redacted(url)} is unreachable "
            f"({_first_line(exc)}); check --catalog / MERIDIAN_CATALOG"
        ) from exc
    except SQLAlchemyError as exc:
        raise CatalogUnavailableError(
            f"the catalog at {redacted(url)} cannot be read ({_first_line(exc)})"
        ) from exc
    head = head_revision()
    if current is None:
        raise CatalogNotMigratedError(
            f"the catalog at {redacted(url)} has no schema yet; run `meridian db upgrade`"
        )
    if current != head:
        raise CatalogNotMigratedError(
            f"the catalog at {redacted(url)} is at migration {current}, not {head}; "
            "run `meridian db upgrade`"
        )


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
