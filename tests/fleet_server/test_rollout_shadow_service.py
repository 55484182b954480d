"""The rollout service's shadow phase over the real fleet database (SQLite), a real signed
repository and the ingest sink: the devices' stored comparisons (each backed by a stored
decision; a health summary or a committed shadow install event shows the shadow running)
move the wave from shadow directives (``custom.mode: shadow``) to switch directives (no
mode), or stop it with a revert and no switch. The summary's own totals decide nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from tuf.api.metadata import Metadata, Targets

from agent.wire import topics
from agent.wire.messages import Health, install_state_event
from agent.wire.quality import ShadowSummary
from fleet_server.db import store
from fleet_server.repository import KeyStore, Repository, manifest_target
from tests.fleet_server.quality.shadow_data import compared
from tests.fleet_server.test_rollout_service import VERSIONS, Setup, db, fleet  # noqa: F401

SPEC = {
    "bundle": "cls@2.0.0",
    "selector": "line=3",
    "waves": "1,100%",
    "soak_s": 0,
    "shadow_s": "1h",
    "shadow_min": 100,
    "min_agreement": 0.9,
}


def _directive(payload: bytes) -> tuple[int, dict[str, Any]]:
    """(release, custom) of a published directive."""
    signed = Metadata[Targets].from_bytes(payload).signed
    (path,) = signed.targets
    release = next(r for r in VERSIONS if path == manifest_target("cls", r))
    return release, signed.unrecognized_fields["custom"]


def _published(s: Setup, since: int) -> list[tuple[str, int | None, str]]:
    """(device, release, mode) of the directives published after ``since`` (None,
    "clear": the directive emptied)."""
    out: list[tuple[str, int | None, str]] = []
    for topic, payload, _, _ in s.sent[since:]:
        if not payload:
            out.append((topics.device_of(topic), None, "clear"))
            continue
        release, custom = _directive(payload)
        out.append((topics.device_of(topic), release, custom.get("mode", "active")))
    return out


def _compared(s: Setup, device_id: str, n: int, agree: int) -> None:
    """``n`` more stored comparisons of the device (at 10 decisions a second)."""
    compared(s.db, device_id, n, agree, s.clock.advance(n / 10))


def _shadow_health(s: Setup, device_id: str, n: int, agree: int, p99: float = 10.0) -> None:
    summary = ShadowSummary(
        bundle="cls", version="2.0.0", release=2, n=n, agree=agree,
        agreement=agree / n if n else None, shadow_p50_ms=p99 / 2, shadow_p99_ms=p99,
    )  # fmt: skip
    ts = s.clock.advance(0.01)
    s.sink.store_health([Health(device_id=device_id, seq=0, ts=ts, shadow=summary)])


def _shadow_install(s: Setup, device_id: str, outcome: str = "committed") -> None:
    at = s.clock.advance(0.01)
    report = {"at": at, "source": "mqtt", "outcome": outcome, "step": "commit", "reason": "",
              "bundle": "cls", "release": 2, "version": "2.0.0", "mode": "shadow"}  # fmt: skip
    s.sink.store_events([install_state_event(device_id, report)])


def test_stored_shadow_summaries_move_each_wave_from_shadow_to_switch_directives(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
) -> None:
    s = Setup(db, fleet)
    devices = ["gw-1", "gw-2", "gw-3"]
    for d in devices:
        s.device(d)
    rid = s.service.create(SPEC)

    (canary,) = s.tick()
    assert _published(s, 0) == [(canary, 2, "shadow")]
    assert s.status(rid)[canary] == "shadow-assigned"
    assert s.tick() == []  # nothing reported: nothing new

    _shadow_install(s, canary)  # the install event alone shows the shadow running
    assert s.tick() == []
    view = s.service.get(rid)
    assert view["phase"] == "shadow"
    assert s.status(rid)[canary] == "shadowing"

    _shadow_health(s, canary, 100_000, 100_000)  # a claim alone counts for nothing
    _compared(s, canary, 60, 60)
    assert s.tick() == []  # 60 of 100 frames
    assert s.service.get(rid)["gate"]["shadow_n"] == 60
    # the claim contradicts what the device could have decided: quarantined, alarm raised
    (alarm,) = store.list_events(s.db, canary, kind="claim_refused")
    assert alarm.payload["claim"] == {"n": 100_000, "agree": 100_000}
    assert "claims 100000 sampled frames" in alarm.payload["reason"]
    notes = [e.payload for e in store.list_events(s.db, rid, kind="rollout")]
    assert [n["message"] for n in notes if n["kind"] == "claim_refused"] == [
        f"device {canary}: shadow claim refused: {alarm.payload['reason']}"
    ]
    (held,) = store.list_quarantine(s.db)
    assert held.topic == topics.telemetry(canary)
    assert canary in held.reason
    s.tick()
    assert len(store.list_quarantine(s.db)) == 1  # once per rollout and device
    _compared(s, canary, 90, 89)
    _shadow_health(s, canary, 150, 149)
    before = len(s.sent)
    assert s.tick() == [canary]
    assert _published(s, before) == [(canary, 2, "active")]
    view = s.service.get(rid)
    assert view["phase"] == "assigning"
    assert "shadow passed" in view["reason"]
    assert view["gate"]["shadow_agree"] == 149

    s.install(canary, 2)
    before = len(s.sent)
    rest = s.tick()
    assert sorted(rest) == sorted(set(devices) - {canary})
    assert {m for _, _, m in _published(s, before)} == {"shadow"}
    for d in rest:  # their stored comparisons alone show these running it
        _compared(s, d, 80, 79)
    assert s.tick() == []  # a wave of two: each device's own records must pass
    for d in rest:
        _compared(s, d, 40, 40)
    before = len(s.sent)
    assert sorted(s.tick()) == sorted(rest)
    assert sorted(_published(s, before)) == sorted((d, 2, "active") for d in rest)
    for d in rest:
        s.install(d, 2)
    s.tick()
    view = s.service.get(rid)
    assert view["phase"] == "completed", view["reason"]
    assert view["wave_metrics"][1]["shadow_n"] == 100  # the less agreeing one, capped


def test_a_disagreeing_candidate_is_stopped_with_its_shadows_cleared_and_nothing_switched(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
) -> None:
    s = Setup(db, fleet)
    for d in ("gw-1", "gw-2"):
        s.device(d)
    rid = s.service.create({**SPEC, "waves": "100%"})
    first = s.tick()
    assert sorted(first) == ["gw-1", "gw-2"]
    for d in first:
        _shadow_install(s, d)
        _compared(s, d, 100, 70)
    before = len(s.sent)
    reverted = s.tick()
    assert sorted(reverted) == ["gw-1", "gw-2"]
    # they never switched: their directive is cleared and the agent empties its shadow slot
    assert sorted(_published(s, before)) == [("gw-1", None, "clear"), ("gw-2", None, "clear")]
    view = s.service.get(rid)
    assert view["phase"] in ("rolling_back", "rolled_back")
    assert "agreement 0.7000" in view["reason"]
    assert "n=100" in view["reason"]  # the more agreeing device's own records fail too
    assert "upper bound" in view["reason"]
    assert all(release != 2 or mode == "shadow" for _, release, mode in _published(s, 0))
    s.tick()
    assert s.service.get(rid)["phase"] == "rolled_back"
