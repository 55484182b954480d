"""Retention of the alerts on real SQLite and PostgreSQL: a resolved alert goes with its
deliveries (dead letters included) past its budget, judged by when it resolved; an alert
still firing stays whatever its age, and does not count against the row budget."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.alerts import store
from fleet_server.alerts.rules import Changes, Condition, OpenAlert
from fleet_server.db import tables as t
from fleet_server.retention.prune import prune
from tests.fleet_server.retention.retention_data import DAY, NOW, section

pytest_plugins = ["tests.fleet_server.db_fixtures"]


def _alert(db: Engine, key: str, fired_days: float, resolved_days: float | None) -> int:
    c = Condition("device_offline", key, "warning", f"{key} offline")
    (alert_id,) = store.apply(
        db, Changes(fire=(c,)), lambda _: ["ops"], epoch=1, now=NOW - fired_days * DAY
    ).fired
    if resolved_days is not None:
        gone = (OpenAlert(alert_id, c.rule, key),)
        store.apply(db, Changes(resolve=gone), lambda _: [], epoch=1,
                    now=NOW - resolved_days * DAY)  # fmt: skip
    return alert_id


def _keys(db: Engine) -> set[str]:
    with db.connect() as conn:
        return {r[0] for r in conn.execute(sa.select(t.alerts.c.key))}


def _deliveries(db: Engine) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(t.alert_deliveries)).scalar_one()
        )


def test_a_resolved_alert_goes_with_its_deliveries_and_a_firing_one_stays(db: Engine) -> None:
    _alert(db, "resolved-long-ago", 400, 200)
    _alert(db, "fired-long-ago-resolved-lately", 400, 10)
    _alert(db, "firing-for-a-year", 365, None)
    assert _deliveries(db) == 5  # 3 firing, 2 resolved
    report = prune(db, section(alerts={"max_age_days": 180, "max_rows": None}), now=NOW)
    assert _keys(db) == {"fired-long-ago-resolved-lately", "firing-for-a-year"}
    assert report.deleted["alerts"] == 1
    assert _deliveries(db) == 3  # the pruned alert's firing and resolved went with it


def test_the_row_budget_keeps_the_newest_resolved_alerts_and_every_firing_one(db: Engine) -> None:
    for i in range(4):
        _alert(db, f"r{i}", 30 + i, 20 + i)  # r0 resolved last
    _alert(db, "firing", 50, None)
    prune(db, section(alerts={"max_age_days": None, "max_rows": 2}), now=NOW)
    assert _keys(db) == {"r0", "r1", "firing"}
