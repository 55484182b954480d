"""Retention passes on real SQLite and PostgreSQL: only what is past its budget goes,
labels and what a running rollout judges stay, images go with their decisions, and
every transaction deletes at most ``batch_rows`` rows."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.auth.sessions import start_session
from fleet_server.db import store
from fleet_server.db import tables as t
from fleet_server.db.tokens import consume_token, create_token
from fleet_server.retention.prune import prune
from tests.fleet_server.retention.retention_data import (
    DAY,
    NOW,
    decision,
    event,
    heartbeats,
    keys,
    review,
    rollout,
    section,
    telemetry,
)

pytest_plugins = ["tests.fleet_server.db_fixtures"]


def test_age_budget_deletes_only_the_heartbeats_older_than_it(db: Engine) -> None:
    heartbeats(db, [0.5, 3, 6.9, 7.1, 8, 30])
    report = prune(db, section(heartbeats={"max_age_days": 7}), now=NOW)
    assert keys(db, "heartbeats") == {("cam-1", "hb-0"), ("cam-1", "hb-1"), ("cam-1", "hb-2")}
    assert report.deleted["heartbeats"] == 3
    assert report.errors == []


def test_row_budget_keeps_the_newest_rows_whatever_their_age(db: Engine) -> None:
    telemetry(db, [float(i) for i in range(12)])  # t-0 newest ... t-11 oldest
    report = prune(db, section(telemetry={"max_age_days": None, "max_rows": 5}), now=NOW)
    assert keys(db, "telemetry") == {("cam-1", f"t-{i}") for i in range(5)}
    assert report.deleted["telemetry"] == 7
    again = prune(db, section(telemetry={"max_age_days": None, "max_rows": 5}), now=NOW)
    assert again.deleted["telemetry"] == 0


def test_age_and_row_budgets_together_cut_at_whichever_is_later(db: Engine) -> None:
    telemetry(db, [1, 2, 3, 4, 40, 50])
    prune(db, section(telemetry={"max_age_days": 30, "max_rows": 3}), now=NOW)
    assert keys(db, "telemetry") == {("cam-1", "t-0"), ("cam-1", "t-1"), ("cam-1", "t-2")}


def test_old_decision_goes_with_its_image_and_a_recent_one_stays(db: Engine) -> None:
    decision(db, "old", 100)
    decision(db, "new", 10)
    report = prune(db, section(decisions={"max_age_days": 90}), now=NOW)
    assert keys(db, "decisions") == {("cam-1", "new")}
    assert keys(db, "decision_images") == {("new", "cam-1")}
    assert report.deleted["decisions"] == 1
    assert report.deleted["decision_images"] == 1


def test_a_reviewed_decision_and_its_image_survive_past_the_decision_budget(db: Engine) -> None:
    decision(db, "reviewed", 100)
    decision(db, "plain", 100)
    review(db, "reviewed")
    prune(db, section(decisions={"max_age_days": 90, "labelled_days": 365}), now=NOW)
    assert keys(db, "decisions") == {("cam-1", "reviewed")}
    assert keys(db, "decision_images") == {("reviewed", "cam-1")}
    assert len(keys(db, "decision_reviews")) == 1


def test_a_label_past_the_labelled_budget_goes_with_its_review_history(db: Engine) -> None:
    decision(db, "ancient", 400)
    review(db, "ancient")
    prune(db, section(decisions={"max_age_days": 90, "labelled_days": 365}), now=NOW)
    assert keys(db, "decisions") == set()
    assert keys(db, "decision_reviews") == set()
    assert keys(db, "decision_review_log") == set()
    assert keys(db, "decision_images") == set()


def test_labels_of_a_model_a_running_rollout_gates_survive_until_it_ends(db: Engine) -> None:
    decision(db, "gated", 400, model="detector", version="1.0.0")
    decision(db, "other-model", 400, model="counter", version="1.0.0")
    review(db, "gated")
    review(db, "other-model")
    rollout(db, "r1", "detector", "soaking", created_days=1)
    budgets = section(decisions={"max_age_days": 90, "labelled_days": 365})
    prune(db, budgets, now=NOW)
    assert keys(db, "decisions") == {("cam-1", "gated")}
    assert keys(db, "decision_images") == {("gated", "cam-1")}
    with store.write_transaction(db) as conn:
        conn.execute(t.rollouts.update().values(state="completed"))
    prune(db, budgets, now=NOW)
    assert keys(db, "decisions") == set()


def test_the_images_budget_removes_pictures_but_keeps_labelled_ones(db: Engine) -> None:
    decision(db, "a", 40)
    decision(db, "b", 40)
    review(db, "b")
    prune(db, section(decisions={"max_age_days": 90}, images={"max_age_days": 30}), now=NOW)
    assert keys(db, "decisions") == {("cam-1", "a"), ("cam-1", "b")}
    assert keys(db, "decision_images") == {("b", "cam-1")}


def test_install_events_a_running_rollout_reads_survive_the_events_budget(db: Engine) -> None:
    event(db, "alarm-old", 20)
    event(db, "install-old", 20, kind="install")
    event(db, "install-older", 40, kind="install")
    rollout(db, "r1", "detector", "assigning", created_days=30)
    prune(db, section(events={"max_age_days": 10}), now=NOW)
    assert keys(db, "events") == {("cam-1", "install-old")}


def _drift(hour: float, n: int = 10) -> dict[str, Any]:
    return {
        "device_id": "cam-1", "model_name": "detector", "model_version": "1.0.0",
        "line": "3", "source": "cam0", "hour": int(hour), "n": n,
        "payload": {"period_s": 3600}, "received_at": NOW,
    }  # fmt: skip


def test_drift_buckets_past_the_budget_go_but_the_reference_window_stays(db: Engine) -> None:
    first = NOW - 200 * DAY
    hours = [first, first + 3600, first + 30 * 3600, NOW - 100 * DAY, NOW - 5 * DAY]
    with store.write_transaction(db) as conn:
        conn.execute(t.drift_hours.insert(), [_drift(h) for h in hours])
    prune(db, section(drift_hours={"max_age_days": 90}), now=NOW, drift_reference_s=24 * 3600.0)
    kept = {k[5] for k in keys(db, "drift_hours")}
    assert kept == {int(first), int(first + 3600), int(NOW - 5 * DAY)}


def test_expired_sessions_and_used_or_expired_tokens_go_after_their_grace(db: Engine) -> None:
    user = {"username": "alice", "role": "operator", "password_hash": "-", "disabled": False,
            "created_at": NOW - 10 * DAY, "password_changed_at": NOW - 10 * DAY}  # fmt: skip
    with store.write_transaction(db) as conn:
        conn.execute(t.users.insert().values(user))
    start_session(db, "alice", "operator", max_s=3600, now=NOW - 5 * DAY)  # expired
    live, _ = start_session(db, "alice", "operator", max_s=8 * 3600, now=NOW - 60)
    create_token(db, "h-used", "cam-1", labels={}, profile="", ttl_s=DAY, now=NOW - 40 * DAY)
    consume_token(db, "h-used", now=NOW - 40 * DAY + 10)
    create_token(db, "h-expired", "cam-2", labels={}, profile="", ttl_s=DAY, now=NOW - 40 * DAY)
    create_token(db, "h-fresh", "cam-3", labels={}, profile="", ttl_s=DAY, now=NOW - 3600)
    report = prune(
        db, section(expired={"sessions_after_days": 1, "tokens_after_days": 30}), now=NOW
    )
    assert keys(db, "enrollment_tokens") == {"h-fresh"}
    assert len(keys(db, "user_sessions")) == 1
    assert report.deleted["user_sessions"] == 1
    assert report.deleted["enrollment_tokens"] == 2
    del live


def test_a_dry_run_counts_what_is_past_the_budget_and_deletes_nothing(db: Engine) -> None:
    heartbeats(db, [1, 8, 9])
    report = prune(db, section(heartbeats={"max_age_days": 7}), now=NOW, dry_run=True)
    by_table = {r.table: r for r in report.tables}
    assert by_table["heartbeats"].past_budget == 2
    assert report.deleted_total == 0
    assert len(keys(db, "heartbeats")) == 3


def test_each_transaction_deletes_at_most_batch_rows(db: Engine) -> None:
    heartbeats(db, [10 + i / 100 for i in range(23)])
    heartbeats(db, [1.0], device="cam-2")
    deletes: list[int] = []
    commits: list[int] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM HEARTBEATS"):
            deletes.append(cursor.rowcount)

    sa.event.listen(db, "after_cursor_execute", on_execute)

    def on_commit(conn: Any) -> None:
        commits.append(len(deletes))

    sa.event.listen(db, "after_cursor_execute", on_execute)
    sa.event.listen(db, "commit", on_commit)
    try:
        report = prune(db, section(batch_rows=5, heartbeats={"max_age_days": 7}), now=NOW)
    finally:
        sa.event.remove(db, "after_cursor_execute", on_execute)
        sa.event.remove(db, "commit", on_commit)
    assert deletes == [5, 5, 5, 5, 3]
    # a commit after each DELETE, before the next: every batch is its own transaction
    assert {1, 2, 3, 4, 5} <= set(commits)
    hb = next(r for r in report.tables if r.table == "heartbeats")
    assert (hb.deleted, hb.batches, hb.max_batch_rows) == (23, 5, 5)
    assert keys(db, "heartbeats") == {("cam-2", "hb-0")}


def test_a_pass_stops_between_batches_when_told(db: Engine) -> None:
    heartbeats(db, [10 + i / 100 for i in range(20)])
    calls: list[int] = []

    def go_on() -> bool:
        calls.append(1)
        return len(calls) <= 2

    budgets = section(
        batch_rows=5,
        decisions={"max_age_days": None, "labelled_days": None},
        images={"max_age_days": None},
        heartbeats={"max_age_days": 7},
    )
    report = prune(db, budgets, now=NOW, should_go_on=go_on)
    assert report.stopped
    assert [r.table for r in report.tables] == ["heartbeats"]
    assert report.deleted["heartbeats"] == 10
    assert len(keys(db, "heartbeats")) == 10
