"""The retention job acts only while its replica leads, reports its figures in the
``retention`` health probe, and counts a failed pass and goes on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import Engine

from agent.kernel.errors import ConfigError
from fleet_server.api.context import ServerContext
from fleet_server.config import FleetServerConfig, load_config
from fleet_server.db import make_engine, open_database, sqlite_url
from fleet_server.health import HealthRegistry
from fleet_server.retention.config import RetentionSection
from fleet_server.retention.plan import Facts, plan
from fleet_server.retention.runner import PROBE, RetentionRunner
from tests.fleet_server.retention.retention_data import DAY, NOW, heartbeats, keys

WAIT_S = 10.0


@dataclass
class Leader:
    """A leadership that says what the test sets."""

    leading: bool = False
    replica_id: str = "test"

    def is_leader(self) -> bool:
        return self.leading

    def check(self) -> int:
        return 1


@dataclass
class Ctx:
    """What the runner reads of the server's context."""

    engine: Engine
    config: FleetServerConfig = field(
        default_factory=lambda: FleetServerConfig.model_validate(
            {"retention": {"interval_s": 0.05, "heartbeats": {"max_age_days": 7}}}
        )
    )
    repository: Any = None
    leader: Leader = field(default_factory=Leader)
    health: HealthRegistry = field(default_factory=HealthRegistry)


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = open_database(sqlite_url(tmp_path / "fleet.db"))
    yield eng
    eng.dispose()


def _wait(predicate: Any) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_run_once_does_nothing_until_the_replica_leads(engine: Engine) -> None:
    heartbeats(engine, [1, 30, 40])
    ctx = Ctx(engine)
    runner = RetentionRunner(cast(ServerContext, ctx))
    assert runner.run_once(now=NOW) is None
    assert len(keys(engine, "heartbeats")) == 3
    ctx.leader.leading = True
    report = runner.run_once(now=NOW)
    assert report is not None
    assert report.deleted["heartbeats"] == 2
    detail = runner.detail()
    assert (detail["runs"], detail["failures"], detail["skipped"]) == (1, 0, 1)
    assert detail["deleted"]["heartbeats"] == 2
    assert detail["deleted_total"] == 2
    assert detail["last_run_at"] is not None
    assert detail["last_duration_s"] >= 0


def test_the_thread_prunes_once_leading_and_the_probe_shows_it(engine: Engine) -> None:
    heartbeats(engine, [1, 3000, 4000])  # by the wall clock: two past 7 days
    ctx = Ctx(engine)
    runner = RetentionRunner(cast(ServerContext, ctx), first_run_s=0.0)
    runner.start()
    try:
        assert _wait(lambda: runner.detail()["skipped"] >= 3)
        assert len(keys(engine, "heartbeats")) == 3
        ctx.leader.leading = True
        assert _wait(lambda: runner.detail()["deleted_total"] == 2)
        health = ctx.health.check()[PROBE]
        assert health.ok
        assert health.detail["deleted"]["heartbeats"] == 2
        assert health.detail["runs"] >= 1
    finally:
        runner.stop()
    assert PROBE not in ctx.health.check()
    assert len(keys(engine, "heartbeats")) == 1


def test_a_failed_pass_is_counted_and_the_loop_goes_on(tmp_path: Path) -> None:
    bare = make_engine(sqlite_url(tmp_path / "empty.db"))  # no schema: every pass fails
    try:
        ctx = Ctx(bare, leader=Leader(leading=True))
        runner = RetentionRunner(cast(ServerContext, ctx), first_run_s=0.0)
        runner.start()
        try:
            assert _wait(lambda: runner.detail()["failures"] >= 2)
            health = ctx.health.check()[PROBE]
            assert health.ok  # a failed pass does not take the replica out of service
            assert "OperationalError" in health.detail["last_error"]
        finally:
            runner.stop()
    finally:
        bare.dispose()


def test_labelled_days_below_the_decision_budget_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"labelled_days \(30\) must be at least max_age"):
        RetentionSection.model_validate({"decisions": {"max_age_days": 90, "labelled_days": 30}})
    toml = tmp_path / "fleet.toml"
    toml.write_text("[retention.heartbeats]\nmax_age_days = -1\nmax_rowz = 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(toml)
    assert "retention.heartbeats.max_age_days" in str(err.value)
    assert "retention.heartbeats.max_rowz" in str(err.value)


def test_the_later_cutoff_wins_and_a_row_budget_cuts_at_the_nth_newest() -> None:
    budgets = RetentionSection.model_validate(
        {"heartbeats": {"max_age_days": 7, "max_rows": 100}, "telemetry": {"max_age_days": 7}}
    )
    steps = {
        s.table: s for s in plan(budgets, Facts(now=NOW, nth_newest={"heartbeats": NOW - DAY}))
    }
    assert (steps["heartbeats"].cutoff, steps["heartbeats"].reason) == (NOW - DAY, "rows")
    assert (steps["telemetry"].cutoff, steps["telemetry"].reason) == (NOW - 7 * DAY, "age")
    few = {s.table: s for s in plan(budgets, Facts(now=NOW, nth_newest={"heartbeats": None}))}
    assert few["heartbeats"].reason == "age"
