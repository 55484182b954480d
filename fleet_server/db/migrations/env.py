"""Alembic environment: runs on the connection :func:`fleet_server.db.migrate.upgrade`
passes in ``config.attributes["connection"]``, inside that connection's transaction."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from fleet_server.db.errors import StorageError
from fleet_server.db.tables import metadata


def _run() -> None:
    if context.is_offline_mode():
        raise StorageError("migrations", "offline (--sql) mode is not supported")
    conn = context.config.attributes.get("connection")
    if not isinstance(conn, Connection):
        raise StorageError(
            "migrations", "run them with fleet_server.db.migrate.upgrade(engine), not the CLI"
        )
    context.configure(
        connection=conn,
        target_metadata=metadata,
        transactional_ddl=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


_run()
