"""Fixtures for the fleet storage tests: every test runs on SQLite and on PostgreSQL.

``pg_cluster`` is one PostgreSQL cluster per session (a failure to start it fails the
tests, never skips them); ``db_url`` is a fresh empty database per test (a file for
SQLite, ``CREATE DATABASE`` for PostgreSQL); ``db`` is an engine on it, migrated.
A test module loads them with ``pytest_plugins = ["tests.fleet_server.db_fixtures"]``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
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


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database's URL."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "fleet.db")
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    url = cluster.create_database()
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
