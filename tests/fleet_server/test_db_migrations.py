"""The fleet database's Alembic migrations, on SQLite and on PostgreSQL (see db_fixtures)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from fleet_server.db import (
    StorageError,
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    open_database,
    sqlite_url,
    upgrade,
)
from fleet_server.db.store import (
    DecisionRecord,
    Record,
    count_records,
    insert_decisions,
    insert_heartbeats,
    list_decision_records,
)
from fleet_server.db.tables import metadata

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # the db_url and pg_cluster fixtures

JOIN_TIMEOUT_S = 60.0
SCHEMA = {t.name for t in metadata.sorted_tables}


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _version_rows(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]


def test_upgrade_from_empty_creates_every_table_and_records_the_head(db_url: str) -> None:
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    assert _tables(engine) == set()
    upgrade(engine)
    assert _tables(engine) == SCHEMA | {"alembic_version"}
    assert _version_rows(engine) == [head_revision()]
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_upgrading_again_changes_nothing_and_keeps_the_data(db_url: str) -> None:
    engine = open_database(db_url)
    insert_heartbeats(engine, [Record("dev-a", "r1", 1.0, {"seq": 1})])
    upgrade(engine)
    engine.dispose()
    engine = open_database(db_url)  # a restart
    assert _version_rows(engine) == [head_revision()]
    assert count_records(engine, "heartbeats") == 1
    engine.dispose()


def test_migrations_build_exactly_the_tables_the_code_defines(db_url: str) -> None:
    engine = open_database(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []
    engine.dispose()


def test_upgrading_to_0010_keeps_the_decisions_as_free_running_ones(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine, "0009")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO decisions (id, device_id, ts, source, outcome, model_name, "
                "model_version, payload, received_at) VALUES (:id, 'dev-a', :ts, 'cam1', "
                "'pass', 'cls', '1.0.0', '{\"line\": \"3\"}', :ts)"
            ),
            [{"id": f"id-{n}", "ts": 1_790_000_000.0 + n} for n in range(3)],
        )
    upgrade(engine)
    old = list_decision_records(engine, "dev-a")
    assert sorted(d.id for d in old) == ["id-0", "id-1", "id-2"]
    assert {(d.station, d.part_id, d.deadline_missed) for d in old} == {("", "", False)}
    assert old[0].payload == {"line": "3"}
    new = DecisionRecord("id-9", "dev-a", 1_790_000_009.0, "cam1", "reject", "cls", "1.0.0",
                         {}, station="st-1", part_id="P-9", deadline_missed=True)  # fmt: skip
    assert insert_decisions(engine, [new]) == 1
    assert list_decision_records(engine, "dev-a", limit=1) == [new]
    assert "ix_decisions_part_id_ts" in _decision_indexes(engine)
    downgrade(engine, "0009")  # and back: the station columns go, the rows and indexes stay
    columns = {c["name"] for c in sa.inspect(engine).get_columns("decisions")}
    assert not columns & {"station", "part_id", "deadline_missed"}
    assert count_records(engine, "decisions") == 4
    left = _decision_indexes(engine)
    assert "ix_decisions_part_id_ts" not in left
    assert {"ix_decisions_line_ts", "ix_decisions_device_id_line_ts"} <= left  # expressions
    engine.dispose()


def _decision_indexes(engine: sa.Engine) -> set[str]:
    """The names of the decisions table's indexes, expression indexes too (which SQLite's
    reflection leaves out)."""
    sql = (
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'decisions'"
        if engine.dialect.name == "sqlite"
        else "SELECT indexname FROM pg_indexes WHERE tablename = 'decisions'"
    )
    with engine.connect() as conn:
        return {str(r[0]) for r in conn.exec_driver_sql(sql)}


def test_failed_migration_keeps_neither_tables_nor_a_version(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:  # a table in the way of the last ones the migration makes
        conn.execute(sa.text("CREATE TABLE rollout_devices (x INTEGER)"))
    with pytest.raises(StorageError, match="can't upgrade to 'head'"):
        upgrade(engine)
    assert _tables(engine) == {"rollout_devices"}
    assert current_revision(engine) is None
    engine.dispose()


def test_two_servers_upgrading_at_once_both_end_at_head(db_url: str) -> None:
    # The second server waits on SQLite's write lock while the first migrates: give it as
    # long as the test waits (the 10 s default is short on a loaded CI machine).
    engines = [make_engine(db_url, busy_timeout_s=JOIN_TIMEOUT_S) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=JOIN_TIMEOUT_S)
    errors: list[BaseException] = []

    def start(engine: sa.Engine) -> None:
        try:
            barrier.wait()
            upgrade(engine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert errors == []
    assert _version_rows(engines[0]) == [head_revision()]
    for e in engines:
        e.dispose()


def test_downgrade_to_base_removes_the_schema_and_upgrade_restores_it(db_url: str) -> None:
    engine = open_database(db_url)
    downgrade(engine, "base")
    assert _tables(engine) <= {"alembic_version"}
    assert current_revision(engine) is None
    upgrade(engine)
    assert _tables(engine) == SCHEMA | {"alembic_version"}
    engine.dispose()


def test_unknown_revision_is_refused(db_url: str) -> None:
    engine = make_engine(db_url)
    with pytest.raises(StorageError, match="can't upgrade to 'nope'"):
        upgrade(engine, "nope")
    engine.dispose()


def test_sqlite_runs_in_wal_mode_with_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = open_database(sqlite_url(tmp_path / "fleet.db"))
    with engine.connect() as conn:
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "busy_timeout", "foreign_keys", "synchronous")
        }
    assert pragma == {
        "journal_mode": "wal",
        "busy_timeout": 10_000,
        "foreign_keys": 1,
        "synchronous": 2,
    }
    engine.dispose()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    path.write_bytes(b"this is not an SQLite database, just some text " * 100)
    with pytest.raises(StorageError, match="not a database"):
        open_database(sqlite_url(path))


def _open_at_once(url: str) -> tuple[list[str], list[BaseException]]:
    """Two engines connect to ``url`` at the same moment; their journal modes and errors."""
    engines = [make_engine(url) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=JOIN_TIMEOUT_S)
    modes: list[str] = []
    errors: list[BaseException] = []

    def connect(engine: sa.Engine) -> None:
        try:
            barrier.wait()
            with engine.connect() as conn:
                modes.append(str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=connect, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    for e in engines:
        e.dispose()
    return modes, errors


def test_two_engines_opening_a_new_sqlite_file_at_once_both_get_wal(tmp_path: Path) -> None:
    # Switching a new file to WAL from two connections at once can deadlock on the file's
    # lock, and SQLite answers "database is locked" at once to one of them (no busy wait).
    # Before the engine retried, about 4 rounds in 10 failed; 30 rounds all must pass.
    for round_no in range(30):
        modes, errors = _open_at_once(sqlite_url(tmp_path / f"fresh-{round_no}.db"))
        assert errors == [], f"round {round_no}"
        assert modes == ["wal", "wal"], f"round {round_no}"
