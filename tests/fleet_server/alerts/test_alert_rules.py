"""The alert rules as pure functions: facts in, conditions out, and what fires and what
resolves against the alerts held open (no database, no clock)."""

from __future__ import annotations

from fleet_server.alerts.config import AlertsSection, RulesSection
from fleet_server.alerts.rules import (
    RULES,
    BacklogFact,
    CertFact,
    Condition,
    DeviceFact,
    DiskFact,
    Facts,
    OpenAlert,
    RoleFact,
    RolloutFact,
    StationFact,
    changes,
    evaluate,
    rise,
)
from fleet_server.alerts.webhook import routes
from fleet_server.config import parse_config

NOW = 1_800_000_000.0
DAY = 86_400.0


def _keys(conditions: list[Condition] | None) -> list[str]:
    assert conditions is not None
    return sorted(c.key for c in conditions)


def test_every_rule_of_the_config_has_a_function_and_the_reverse() -> None:
    assert set(RULES) == set(RulesSection().by_name())


def test_rollout_rules_tell_a_gate_stop_from_an_operators_pause_and_hold_a_rollback() -> None:
    rollouts = [
        RolloutFact("r-gate", "det", "2.0", "rolling_back", "gate failed in wave 1: crash", NOW),
        RolloutFact("r-op", "det", "2.0", "paused", "paused by operator (olga)", NOW),
        RolloutFact("r-old", "det", "1.9", "rolled_back", "gate failed; reverted", NOW - 2 * 3600),
        RolloutFact("r-new", "det", "2.1", "rolled_back", "rollback by operator", NOW - 60),
        RolloutFact("r-wait", "det", "2.2", "awaiting_approval", "wave 1 passed", NOW - 30),
    ]
    rules = RulesSection()
    found = evaluate(rules, Facts(NOW, rollouts=rollouts))
    assert _keys(found["rollout_gate_stopped"]) == ["r-gate"]
    assert _keys(found["rollout_rolled_back"]) == ["r-new"]  # held 60 minutes after it ended
    assert _keys(found["rollout_awaiting_approval"]) == ["r-wait"]
    later = RulesSection.model_validate({"rollout_awaiting_approval": {"after_minutes": 5}})
    assert evaluate(later, Facts(NOW, rollouts=rollouts))["rollout_awaiting_approval"] == []


def test_offline_backlog_and_disk_fire_past_their_thresholds_only() -> None:
    facts = Facts(
        NOW,
        offline=[DeviceFact("cam-1", NOW - 16 * 60, ("plant-a",)), DeviceFact("cam-2", NOW - 60)],
        backlog=[BacklogFact("3", 501), BacklogFact("4", 500)],
        disks=[
            DiskFact("cam-1", free_mb=9000.0, state_mb=1100.0, budget_mb=1024.0),
            DiskFact("cam-2", free_mb=100.0, state_mb=10.0, budget_mb=None),
            DiskFact("cam-3", free_mb=9000.0, state_mb=10.0, budget_mb=1024.0),
        ],
    )
    found = evaluate(RulesSection(), facts)
    (offline,) = found["device_offline"] or []
    assert (offline.key, offline.labels, offline.sites) == (
        "cam-1", {"device": "cam-1", "site": "plant-a"}, ("plant-a",),
    )  # fmt: skip
    assert _keys(found["review_backlog"]) == ["3"]
    disks = {c.key: c.summary for c in found["disk_over_budget"] or []}
    assert set(disks) == {"cam-1", "cam-2"}
    assert "1100 MiB of a 1024 MiB budget" in disks["cam-1"]
    assert "100 MiB free" in disks["cam-2"]


def test_station_counts_fire_on_their_rise_in_the_window_and_an_agent_restart_counts() -> None:
    assert rise(12, 10) == 2
    assert rise(3, 10) == 3  # the agent restarted: its counts began again
    assert rise(7, None) == 7  # no report that old: counted from 0
    stations = [
        StationFact("cam-1", "gate", {"deadline_missed": 40, "overruns": 2},
                    {"deadline_missed": 30, "overruns": 2}),
        StationFact("cam-2", "gate", {"deadline_missed": 3, "overruns": 9}, None),
    ]  # fmt: skip
    found = evaluate(RulesSection(), Facts(NOW, stations=stations))
    assert _keys(found["station_deadline_missed"]) == ["cam-1/gate"]
    assert _keys(found["station_overruns"]) == ["cam-2/gate"]


def test_certificates_and_repository_roles_near_expiry() -> None:
    certs = [
        CertFact("device", "cam-1", NOW + 10 * DAY, ("plant-a",)),
        CertFact("device", "cam-2", NOW + 100 * DAY),
        CertFact("server", "broker main", NOW - 1.0),
    ]
    roles = [
        RoleFact("timestamp", 40, NOW + 5 * 3600, DAY),  # 5 h of 24 left: under a quarter
        RoleFact("snapshot", 9, NOW + 4 * DAY, 7 * DAY),
        RoleFact("root", 1, NOW + 300 * DAY, 365 * DAY),
    ]
    found = evaluate(RulesSection(), Facts(NOW, certs=certs, roles=roles))
    summaries = {c.key: c.summary for c in found["certificate_expiry"] or []}
    assert summaries == {
        "device:cam-1": "device certificate cam-1 expires in 10.0 days",
        "server:broker main": "server certificate broker main expired",
    }
    (tuf,) = found["tuf_expiry"] or []
    assert tuf.key == "timestamp"
    assert "fleetctl repo refresh" in tuf.summary


def test_an_alert_fires_once_resolves_once_and_a_rule_not_looked_at_keeps_its_alerts() -> None:
    rules = RulesSection()
    offline = [DeviceFact("cam-1", NOW - DAY)]
    first = changes(evaluate(rules, Facts(NOW, offline=offline)), [])
    assert [c.key for c in first.fire] == ["cam-1"]
    assert first.resolve == ()
    held = [OpenAlert(7, "device_offline", "cam-1"), OpenAlert(8, "tuf_expiry", "timestamp")]
    again = changes(evaluate(rules, Facts(NOW, offline=offline)), held)
    assert not again  # the same condition seen again is the same alert
    back = changes(evaluate(rules, Facts(NOW, offline=[])), held)
    assert back.fire == ()
    assert back.resolve == (held[0],)
    off = RulesSection.model_validate({"device_offline": {"enabled": False}})
    assert changes(evaluate(off, Facts(NOW, offline=offline)), held).resolve == (held[0],)
    gone = [OpenAlert(9, "a_rule_of_a_newer_server", "x")]
    assert not changes(evaluate(rules, Facts(NOW)), gone)


def test_routes_follow_the_rules_webhooks_and_each_webhooks_rules_sites_and_severity() -> None:
    cfg = parse_config(
        {"alerts": {
            "rules": {"drift": {"webhooks": ["quality"]}, "tuf_expiry": {"webhooks": []}},
            "webhooks": [
                {"name": "ops", "url": "https://ops.example/h", "secret_env": "A"},
                {"name": "plant-a", "url": "https://a.example/h", "secret_env": "B",
                 "sites": ["plant-a"], "min_severity": "warning"},
                {"name": "quality", "url": "https://q.example/h", "secret_env": "C",
                 "rules": ["drift", "review_backlog"]},
            ],
        }}
    )  # fmt: skip
    route = routes(cfg.alerts)
    offline_a = Condition("device_offline", "cam-1", "warning", "", sites=("plant-a",))
    offline_b = Condition("device_offline", "cam-9", "warning", "", sites=("plant-b",))
    info_a = Condition("rollout_awaiting_approval", "r", "info", "", sites=("plant-a",))
    assert route(offline_a) == ["ops", "plant-a"]
    assert route(offline_b) == ["ops"]
    assert route(info_a) == ["ops"]  # under plant-a's min_severity
    assert route(Condition("drift", "m/1/3", "warning", "", sites=("plant-a",))) == ["quality"]
    assert route(Condition("tuf_expiry", "timestamp", "critical", "")) == []
    assert AlertsSection().webhooks == []
