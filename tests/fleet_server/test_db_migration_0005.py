"""Migration 0005 on a database with data, on SQLite and on PostgreSQL: decisions, their
reviews and the review log are kept, now keyed by (device_id, id); a device may then
store a decision id another device used."""

from __future__ import annotations

import sqlalchemy as sa

from fleet_server.db import make_engine, store, upgrade
from fleet_server.review.reviews import get_decision, save_review

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

TS = 1_790_000_000.0
DECISION = (
    "INSERT INTO decisions (id, device_id, ts, source, outcome, model_name, model_version, "
    "payload) VALUES (:id, :device, :ts, 'cam1', 'pass', 'cls', '1.0.0', '{\"line\": \"3\"}')"
)

LOG = (
    "INSERT INTO decision_review_log (seq, decision_id, decided, verdict, outcome, note, "
    "reviewer, reviewed_at) VALUES (:seq, 'id-0', 'pass', 'confirm', 'pass', '', :who, 1.0)"
)
CURRENT = (
    "INSERT INTO decision_reviews (decision_id, seq, decision_ts, device_id, line, "
    "model_name, model_version, decided, verdict, outcome, note, reviewer, reviewed_at) "
    "VALUES ('id-0', 2, :ts, 'dev-a', '3', 'cls', '1.0.0', 'pass', 'confirm', 'pass', '', "
    "'y', 1.0)"
)


def test_upgrading_to_0005_keeps_decisions_reviews_and_the_review_log(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine, "0004")
    with engine.begin() as conn:
        for n, device in enumerate(("dev-a", "dev-b")):
            conn.execute(sa.text(DECISION), {"id": f"id-{n}", "device": device, "ts": TS + n})
        for seq, reviewer in ((1, "x"), (2, "y"), (3, "gone")):
            conn.execute(sa.text(LOG), {"seq": seq, "who": reviewer})
        conn.execute(sa.text(CURRENT), {"ts": TS})
        if conn.dialect.name == "postgresql":  # as inserts drawing from it would have left it
            conn.execute(
                sa.text("SELECT setval(pg_get_serial_sequence('decision_review_log', 'seq'), 3)")
            )
        # the newest log entry deleted (SQLite: its seq must not be used again)
        conn.execute(sa.text("DELETE FROM decision_review_log WHERE seq = 3"))

    upgrade(engine)

    detail = get_decision(engine, "id-0")
    assert detail.summary.device_id == "dev-a"
    assert detail.summary.review is not None
    assert detail.summary.review.reviewer == "y"
    assert [r.reviewer for r in detail.history] == ["y", "x"]
    with engine.connect() as conn:
        logged = conn.execute(sa.text("SELECT device_id FROM decision_review_log")).all()
    assert logged == [("dev-a",), ("dev-a",)]
    # dev-b may now store a decision under dev-a's id, and each keeps its own review
    assert (
        store.insert_decisions(
            engine,
            [store.DecisionRecord("id-0", "dev-b", TS, "cam1", "pass", "cls", "1.0.0", {})],
        )
        == 1
    )
    third = save_review(
        engine, "id-0", device_id="dev-b", verdict="confirm", outcome=None, note="", reviewer="z"
    )
    assert third.seq == 4  # 3 was given once, and is never given again
    assert get_decision(engine, "id-0", "dev-a").summary.review.reviewer == "y"  # type: ignore[union-attr]
    assert store.count_records(engine, "decisions") == 3
    engine.dispose()
