"""Alembic, configured in code, so `meridian db upgrade` works from any folder and install.

The scripts live in the top-level `migrations` package; its location is found
from the imported package, never from the working directory or an alembic.ini.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)

import migrations
from controlplane.catalog.engine import make_engine, redacted, sqlite_file
from controlplane.catalog.errors import CatalogError, CatalogUnavailableError
from controlplane.catalog.translate import first_line, translate_error
from controlplane.errors import ConfigError, InvalidInputError


def alembic_config(url: str) -> Config:
    """An Alembic Config for `url` pointing at the installed migration scripts."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # configparser interpolation would eat '%' in passwords.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["meridian_url"] = url
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError("the migrations package holds no revisions")  # packaging bug
    return head


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def _unreachable(url: str, exc: SQLAlchemyError) -> CatalogUnavailableError:
    verb = "is unreachable" if isinstance(exc, OperationalError) else "cannot be read"
    return CatalogUnavailableError(
        f"the catalog at {redacted(url)} {verb} ({first_line(exc)}); "
        "check --catalog / MERIDIAN_CATALOG"
    )


def _with_connection(url: str, action: Callable[[Config], None]) -> None:
    """Run an Alembic command in one transaction on a connection of our own engine.

    On SQLite, foreign keys are off while it runs: a batch migration rebuilds a table
    by copying it and dropping the original, and with foreign keys on, that DROP
    deletes every row referencing it through ON DELETE CASCADE (replicas of
    object_versions, and so on down). The keys are checked once it is done, and a
    violation undoes the whole migration."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")  # only outside a transaction
                conn.commit()
            try:
                with conn.begin():
                    cfg = alembic_config(url)
                    cfg.attributes["connection"] = conn
                    action(cfg)
                    if sqlite:
                        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                        if broken:
                            raise CatalogError(
                                f"the migration of {redacted(url)} would break "
                                f"{len(broken)} foreign keys (first: {tuple(broken[0])}); "
                                "nothing was changed"
                            )
            finally:
                if sqlite:
                    conn.exec_driver_sql("PRAGMA foreign_keys=ON")
    except IntegrityError as exc:  # a failed step is not an unreachable server
        raise translate_error(exc, url) from exc
    except DatabaseError as exc:  # unreachable, or not a database at all
        raise _unreachable(url, exc) from exc
    except SQLAlchemyError as exc:
        raise translate_error(exc, url) from exc
    finally:
        engine.dispose()


def refuse_in_memory(url: str) -> str:
    """`url`, unless it is an in-memory SQLite database (each connection would see a
    different, empty one, so no later command could see what was created)."""
    try:
        parsed = make_url(url) if "://" in url else None
    except ArgumentError as exc:
        raise ConfigError(f"catalog URL {url!r} is not a SQLAlchemy URL") from exc
    if parsed is not None and parsed.get_backend_name() == "sqlite":
        db = parsed.database or ""
        if not db or db == ":memory:" or "mode=memory" in url:
            raise ConfigError(
                f"catalog URL {url!r} is an in-memory SQLite database, which no later command "
                "could see; give a file, e.g. sqlite:///.meridian/catalog.db"
            )
    return url


def upgrade(url: str, revision: str = "head") -> None:
    _migrate(url, revision, command.upgrade)


def downgrade(url: str, revision: str) -> None:
    _migrate(url, revision, command.downgrade)


def _migrate(url: str, revision: str, step: Callable[[Config, str], None]) -> None:
    """Run `step` to `revision`; a target that names no migration of this build, or a
    step that does not apply from here, is the caller's mistake, said in one sentence
    (Alembic resolves the target before it changes anything; its own error reads as a
    crash)."""
    try:
        _with_connection(url, lambda cfg: step(cfg, revision))
    except (RevisionError, CommandError) as exc:
        script = ScriptDirectory.from_config(alembic_config("sqlite://"))
        known = ", ".join(reversed([r.revision for r in script.walk_revisions()]))
        raise InvalidInputError(
            f"--revision {revision!r}: {first_line(exc)}; give head, base, a relative step "
            f"such as +1 or -1, or one of {known}"
        ) from None


def current(url: str) -> str | None:
    """The catalog's migration; None when it has none, or is a SQLite file that does not
    exist (which is not created: only `upgrade` creates a catalog)."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        return None
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return current_revision(conn)
    except SQLAlchemyError as exc:
        raise _unreachable(url, exc) from exc
    finally:
        engine.dispose()


def check(url: str) -> None:
    """Raise alembic's AutogenerateDiffsDetected if the models drifted from the migrations."""
    _with_connection(url, command.check)
