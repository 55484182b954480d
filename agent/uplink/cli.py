"""``edge-agent outbox``: what waits to go to the fleet (``edge-agent enroll`` is in
:mod:`agent.enrollment.cli`)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from agent.config import load_config
from agent.errors import AgentError

EXIT_ERROR = 2


def outbox_status(outbox: Path, decision_log: Path) -> dict[str, Any]:
    """What waits to go to the fleet: the outbox's records by kind (count, bytes, oldest),
    and the decision log's rows by upload state; read only, while the agent runs.

    Raises:
        AgentError: a file exists but can't be read.
    """
    out: dict[str, Any] = {"outbox": str(outbox), "records": {}, "decisions": {}}
    now = time.time()
    records: dict[str, dict[str, float]] = {}
    if outbox.is_file():
        sql = "SELECT kind, count(*), sum(nbytes), min(created) FROM outbox GROUP BY kind"
        for kind, count, nbytes, oldest in _read(outbox, sql):
            records[str(kind)] = {
                "count": int(count),
                "bytes": int(nbytes or 0),
                "oldest_age_s": round(now - float(oldest), 1),
            }
    out["records"] = records
    states = {0: "not_uploaded", 1: "uploaded", 2: "queued"}
    if decision_log.is_file():
        sql = "SELECT uploaded, count(*) FROM decisions GROUP BY uploaded"
        out["decisions"] = {states.get(int(s), str(s)): int(n) for s, n in _read(decision_log, sql)}
    return out


def _read(path: Path, sql: str) -> list[tuple[Any, ...]]:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            return list(conn.execute(sql))
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise AgentError(f"can't read {path}: {exc}") from exc


def cmd_outbox(config_path: Path, as_json: bool) -> int:
    """``edge-agent outbox``: print :func:`outbox_status` for the agent of this config."""
    config = load_config(config_path)
    state_dir = config.agent.state_dir
    status = outbox_status(
        config.uplink.outbox_path(state_dir), state_dir / config.decision_log.path
    )
    if as_json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"outbox {status['outbox']}")
    records = status["records"]
    if not records:
        print("  nothing waiting")
    for kind, r in sorted(records.items()):
        age = r["oldest_age_s"]
        print(f"  {kind:<10} {r['count']:>8} records {r['bytes']:>12} bytes  oldest {age:.0f} s")
    decisions = status["decisions"]
    print(
        "decision log: " + (", ".join(f"{k} {v}" for k, v in sorted(decisions.items())) or "empty")
    )
    return 0
