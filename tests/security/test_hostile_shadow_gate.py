"""One enrolled device, hostile, in a shadow wave of three (the rollout service over a real
fleet database, a real signed repository): whatever it claims in its health and whatever
comparisons it uploads (within what its certificate lets it write), it can neither pass a
candidate the other devices' frames reject nor veto one they accept. A claim that
contradicts its stored records is quarantined and raises an alarm naming it.

The attacker is ``atk``; ``v1`` and ``v2`` are well-behaved devices on the same line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from agent.wire.messages import Health
from agent.wire.quality import ShadowSummary
from fleet_server.db import store
from fleet_server.repository import KeyStore, Repository
from tests.fleet_server.quality.shadow_data import compared
from tests.fleet_server.test_rollout_service import Setup, db, fleet  # noqa: F401
from tests.fleet_server.test_rollout_shadow_service import SPEC, _published, _shadow_install

ATTACKER = "atk"
VICTIMS = ["v1", "v2"]
FRAMES = 200  # each victim's comparisons (shadow_min is 100)


def _claim(s: Setup, n: int, agree: int) -> None:
    summary = ShadowSummary(bundle="cls", version="2.0.0", release=2, n=n, agree=agree,
                            shadow_p99_ms=1.0)  # fmt: skip
    s.sink.store_health(
        [Health(device_id=ATTACKER, seq=0, ts=s.clock.advance(0.01), shadow=summary)]
    )


def _liar_records(s: Setup, n: int, agree: int, **kw: Any) -> None:
    compared(s.db, ATTACKER, n, agree, s.clock(), **kw)


# What the attacker does once its shadow runs: (health claim n, agree) and comparisons
# uploaded (n, agree, options). Each is tried against a bad candidate (the victims agree
# on 21 % of their frames) and a good one (they agree on all).
Attack = Callable[[Setup, bool], None]


def _huge_claim(s: Setup, good: bool) -> None:
    _claim(s, 10**12, 0 if good else 10**12)


def _claim_at_the_bound(s: Setup, good: bool) -> None:
    _claim(s, 5_000, 0 if good else 5_000)


def _flooded_records(s: Setup, good: bool) -> None:
    # far more comparisons than it could have decided since its directive
    _liar_records(s, 10_000, 0 if good else 10_000)


def _plausible_records(s: Setup, good: bool) -> None:
    _liar_records(s, 150, 0 if good else 150)


def _records_without_decisions(s: Setup, good: bool) -> None:
    _liar_records(s, 400, 0 if good else 400, decisions=False)


def _records_of_old_decisions(s: Setup, good: bool) -> None:
    # decisions and comparisons received before its shadow directive
    compared(s.db, ATTACKER, 300, 0 if good else 300, s.clock() - 3600)


def _claim_and_records(s: Setup, good: bool) -> None:
    _claim(s, 10**9, 0 if good else 10**9)
    _liar_records(s, 2_000, 0 if good else 2_000)


ATTACKS: dict[str, Attack] = {
    "huge-claim": _huge_claim,
    "claim-at-bound": _claim_at_the_bound,
    "flooded-records": _flooded_records,
    "plausible-records": _plausible_records,
    "records-without-decisions": _records_without_decisions,
    "records-of-old-decisions": _records_of_old_decisions,
    "claim-and-records": _claim_and_records,
}


def _wave(s: Setup, attack: Attack, *, good: bool) -> dict[str, Any]:
    """A shadow wave of the attacker and the victims; the victims' frames agree on all
    (good) or 21 % (bad); the attacker does ``attack``. The rollout's view once the wave
    is judged."""
    for d in [ATTACKER, *VICTIMS]:
        s.device(d)
    rid = s.service.create({**SPEC, "waves": "100%"})
    assert sorted(s.tick()) == sorted([ATTACKER, *VICTIMS])
    for d in [ATTACKER, *VICTIMS]:
        _shadow_install(s, d)
    assert s.tick() == []
    s.clock.advance(30.0)  # the attacker's bound: 120 decisions a second since its directive
    attack(s, good)
    for d in VICTIMS:
        compared(s.db, d, FRAMES, FRAMES if good else FRAMES * 21 // 100, s.clock())
    for _ in range(3):
        s.tick()
    view = s.service.get(rid)
    view["_rid"] = rid
    return view


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_lying_device_cannot_pass_a_candidate_the_others_reject(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
    name: str,
) -> None:
    s = Setup(db, fleet)
    view = _wave(s, ATTACKS[name], good=False)
    assert view["phase"] in ("rolling_back", "rolled_back"), view["reason"]
    assert "upper bound < min_agreement" in view["reason"]
    assert not [p for p in _published(s, 0) if p[1] == 2 and p[2] == "active"]  # none switched


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_lying_device_cannot_veto_a_candidate_the_others_accept(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
    name: str,
) -> None:
    s = Setup(db, fleet)
    view = _wave(s, ATTACKS[name], good=True)
    assert "shadow passed" in view["reason"] or view["phase"] == "completed", view["reason"]
    switched = {d for d, release, mode in _published(s, 0) if release == 2 and mode == "active"}
    assert switched == {ATTACKER, *VICTIMS}


@pytest.mark.parametrize("name", ["huge-claim", "claim-at-bound", "claim-and-records"])
def test_a_claim_that_contradicts_the_records_is_quarantined_and_names_the_device(
    db: Engine,  # noqa: F811
    fleet: tuple[KeyStore, Repository],  # noqa: F811
    name: str,
) -> None:
    s = Setup(db, fleet)
    view = _wave(s, ATTACKS[name], good=True)
    (alarm,) = store.list_events(s.db, ATTACKER, kind="claim_refused")
    assert alarm.payload["device_id"] == ATTACKER
    notes = [e.payload["message"] for e in store.list_events(s.db, view["_rid"], kind="rollout")]
    assert any(m.startswith(f"device {ATTACKER}: shadow claim refused") for m in notes)
    assert any(ATTACKER in q.reason for q in store.list_quarantine(s.db))
    for victim in VICTIMS:
        assert store.list_events(s.db, victim, kind="claim_refused") == []
