"""switch_to_wal: connections opening a new SQLite file at once all end in WAL mode."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.decisionlog.connection import connect_writer
from agent.kernel.sqlitewal import switch_to_wal

JOIN_TIMEOUT_S = 30.0
ROUNDS = 30  # a bare PRAGMA journal_mode=WAL from two threads failed ~4 rounds in 10


Opener = Callable[[Path], str]


def _at_once(path: Path, open_one: Opener) -> tuple[list[str], list[BaseException]]:
    barrier = threading.Barrier(2, timeout=JOIN_TIMEOUT_S)
    modes: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            modes.append(open_one(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    return modes, errors


def _switch(path: Path) -> str:
    conn = sqlite3.connect(path, timeout=JOIN_TIMEOUT_S, isolation_level=None)
    try:
        return switch_to_wal(conn, JOIN_TIMEOUT_S)
    finally:
        conn.close()


def _decision_log_writer(path: Path) -> str:
    conn = connect_writer(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("open_one", [_switch, _decision_log_writer], ids=["bare", "decisionlog"])
def test_two_connections_switching_a_new_file_both_end_in_wal(
    tmp_path: Path, open_one: Opener
) -> None:
    for round_no in range(ROUNDS):
        modes, errors = _at_once(tmp_path / f"new-{round_no}.db", open_one)
        assert errors == [], f"round {round_no}"
        assert modes == ["wal", "wal"], f"round {round_no}"


def test_a_file_locked_past_the_timeout_is_an_error_not_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # rollback-journal mode: nobody else may switch
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            switch_to_wal(conn, 0.2)
    finally:
        conn.close()
        holder.execute("ROLLBACK")
        holder.close()
