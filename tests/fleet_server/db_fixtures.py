"""Fixtures for the fleet storage tests: every test runs on SQLite and on PostgreSQL.

``pg_cluster`` is one PostgreSQL cluster per session (a failure to start it fails the
tests, never skips them); ``db_url`` is a fresh database per test (a file for SQLite,
``CREATE DATABASE`` for PostgreSQL), empty unless the test asks for ``db`` too; ``db`` is
an engine on it, migrated.
A test module loads them with ``pytest_plugins = ["tests.fleet_server.db_fixtures"]``.

Where a test asks for ``db``, ``db_url``'s fresh database is a copy of one migrated to
head once per session (SQLite's file copied, PostgreSQL's ``CREATE DATABASE ... TEMPLATE``):
the same schema as migrating it anew, without running every migration for each of the
hundreds of tests that only need the schema; ``db`` still opens it with the product's
``open_database`` (its integrity check, and an upgrade with nothing left to do). The
migrations themselves run on an empty ``db_url`` (tests/fleet_server/test_db_migrations.py).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from fleet_server.db import make_engine, open_database, sqlite_url
from fleet_server.db.store import Record, insert_heartbeats
from tests.support.pg import PgCluster, start_cluster, stop_cluster

BACKENDS = ["sqlite", "postgresql"]
JOIN_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="session")
def _sqlite_at_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite fleet database migrated to head, to copy."""
    path = tmp_path_factory.mktemp("sqlite-at-head") / "fleet.db"
    open_database(sqlite_url(path)).dispose()
    return path


@pytest.fixture(scope="session")
def _pg_at_head(pg_cluster: PgCluster) -> str:
    """The name of a PostgreSQL database migrated to head, to copy (no connection to it
    stays open: ``CREATE DATABASE ... TEMPLATE`` needs none)."""
    url = pg_cluster.create_database("at_head")
    open_database(url).dispose()
    return url.rsplit("/", 1)[1]


def _copy_sqlite(source: Path, target: Path) -> None:
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database's URL: empty, or, where the test asks for ``db`` too, a copy of
    one migrated to head (see the module docstring)."""
    at_head = "db" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "fleet.db"
        if at_head:
            _copy_sqlite(request.getfixturevalue("_sqlite_at_head"), path)
        yield sqlite_url(path)
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    template = request.getfixturevalue("_pg_at_head") if at_head else "template0"
    url = cluster.create_database(template=template)
    try:
        yield url
    finally:
        cluster.drop_database(url)


@pytest.fixture
def db(db_url: str) -> Iterator[Engine]:
    """An engine on a fresh database with the schema at head."""
    engine = open_database(db_url)
    try:
        yield engine
    finally:
        engine.dispose()


def ingest_worker(
    url: str,
    batches: list[list[Record]],
    barrier: multiprocessing.synchronize.Barrier,
    results: multiprocessing.Queue[int],
) -> None:
    """A process that inserts its batches once the other one is ready too, and puts
    how many rows it stored in ``results``."""
    engine = make_engine(url)
    try:
        barrier.wait(timeout=JOIN_TIMEOUT_S)
        results.put(sum(insert_heartbeats(engine, b) for b in batches), timeout=JOIN_TIMEOUT_S)
    finally:
        engine.dispose()
