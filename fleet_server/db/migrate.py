"""Schema migrations (Alembic, run from code; no alembic.ini) and opening a database.

A whole upgrade runs in one transaction, version stamp included: on SQLite under the
write lock (``BEGIN IMMEDIATE``), on PostgreSQL under an advisory lock, so that several
``fleet-server`` processes starting together upgrade the schema once.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Engine

from fleet_server.db._tx import writing
from fleet_server.db.engine import make_engine
from fleet_server.db.errors import StorageError

log = logging.getLogger(__name__)

SCRIPT_LOCATION = "fleet_server.db:migrations"
ADVISORY_LOCK_KEY = 0x6564_6765_666C  # "edgefl": one key for every fleet database
CONNECTION_ATTRIBUTE = "connection"


def alembic_config() -> Config:
    """The Alembic configuration of the fleet database's migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    return cfg


def head_revision() -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StorageError("migrations", f"no revision found under {SCRIPT_LOCATION}")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the migrations up to ``revision``; a database already there is left as is.

    Raises:
        StorageError: a migration failed (nothing of it is kept) or ``revision`` is unknown.
    """
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Undo the migrations above ``revision`` (``"base"``: all of them; data is lost).

    Raises:
        StorageError: a migration failed (nothing of it is kept) or ``revision`` is unknown.
    """
    _run(engine, "downgrade", revision)


def _run(engine: Engine, direction: str, revision: str) -> None:
    cfg = alembic_config()
    step = command.upgrade if direction == "upgrade" else command.downgrade
    try:
        with writing(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(ADVISORY_LOCK_KEY)))
            cfg.attributes[CONNECTION_ATTRIBUTE] = conn
            step(cfg, revision)
    except (CommandError, sa.exc.SQLAlchemyError) as exc:
        raise StorageError("migrations", f"can't {direction} to '{revision}': {exc}") from exc
    log.info("fleet database at revision %s", current_revision(engine))


def check_integrity(engine: Engine) -> None:
    """On SQLite, run ``PRAGMA quick_check``; PostgreSQL checks itself.

    Raises:
        StorageError: SQLite reports a damaged database.
    """
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        problems = [str(row[0]) for row in conn.exec_driver_sql("PRAGMA quick_check")]
    if problems != ["ok"]:
        where = engine.url.database or "sqlite"
        raise StorageError(where, "integrity check failed: " + "; ".join(problems[:5]))


def open_database(url: str) -> Engine:
    """An engine for ``url`` with its schema up to date (SQLite: checked first).

    Raises:
        StorageError: the URL is not usable, the database is damaged or can't be migrated.
    """
    engine = make_engine(url)
    try:
        check_integrity(engine)
        upgrade(engine)
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        shown = engine.url.render_as_string(hide_password=True)
        raise StorageError(shown, f"can't open the database: {exc}") from exc
    except BaseException:
        engine.dispose()
        raise
    return engine
