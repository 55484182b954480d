"""Webhook delivery against a receiver on loopback that checks as docs/alerts.md says:
the signature over the timestamp and the body, the timestamp's age, each delivery once;
a receiver that is down gets its tries with a doubling backoff, then the delivery is a
dead letter, and sent again by hand once the receiver is back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from fleet_server.alerts import store
from fleet_server.alerts.config import AlertsSection
from fleet_server.alerts.delivery import Deliverer, backoff_s
from fleet_server.alerts.rules import Changes, Condition
from fleet_server.alerts.webhook import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    body,
    headers,
    post,
    routes,
    signature,
)
from fleet_server.db import open_database, sqlite_url
from hil.loopback import free_port
from hil.webhooks import WebhookReceiver

SECRET = b"a webhook secret made for this test"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(sqlite_url(tmp_path / "fleet.db"))
    yield engine
    engine.dispose()


def _section(url: str, **delivery: float) -> AlertsSection:
    return AlertsSection.model_validate(
        {"webhooks": [{"name": "ops", "url": url, "secret_env": "EDGEFLEET_TEST_HOOK",
                       "timeout_s": 2}],
         "delivery": {"attempts": 3, "backoff_s": 10, "max_backoff_s": 15, **delivery}}
    )  # fmt: skip


def _fire(db: Engine, section: AlertsSection, now: float, key: str = "cam-1") -> int:
    c = Condition("device_offline", key, "warning", f"{key} offline", {"device": key})
    applied = store.apply(db, Changes(fire=(c,)), routes(section), epoch=1, now=now)
    (alert_id,) = applied.fired
    return alert_id


def test_a_signed_delivery_is_taken_once_and_a_forged_or_stale_one_is_refused(
    db: Engine,
) -> None:
    clock = Clock()
    with WebhookReceiver(SECRET, clock=clock) as hook:
        section = _section(hook.url)
        alert_id = _fire(db, section, clock.now)
        deliverer = Deliverer(db, section, {"ops": SECRET}, clock=clock)
        assert deliverer.run_once() == 1
        (got,) = hook.received
        assert (got.event, got.alert["alert_id"], got.alert["state"]) == (
            "firing", alert_id, "firing",
        )  # fmt: skip
        assert got.alert["summary"] == "cam-1 offline"
        (row,) = store.list_deliveries(db)
        assert (row.state, row.attempts, row.last_status) == ("delivered", 1, 204)
        # what a receiver must refuse: another key, an altered body, a stale timestamp
        data = body(row.alert, "firing", "d-1")
        forged = headers(b"not the secret at all, no", int(clock.now), data, "firing", "d-1")
        hook_cfg = section.webhooks[0]
        for head, payload in (
            (forged, data),
            (headers(SECRET, int(clock.now), data, "firing", "d-1"), data + b" "),
            (headers(SECRET, int(clock.now) - 301, data, "firing", "d-1"), data),
        ):
            with pytest.raises(Exception, match="answered 401"):
                post(hook_cfg, payload, head)
        assert len(hook.refused) == 3
        assert "not the body's" in hook.refused[0]
        assert "not the body's" in hook.refused[1]
        assert "a replay, or a clock off" in hook.refused[2]
        # the same delivery again (a retry whose answer was lost, or a replay): taken once
        again = headers(SECRET, int(clock.now), data, "firing", "d-2")
        assert post(hook_cfg, data, again) == 204
        assert post(hook_cfg, data, again) == 204
        assert hook.duplicates == 1
        assert [r.delivery_id for r in hook.received] == [row.delivery_id, "d-2"]


def test_the_signature_is_hmac_sha256_over_the_timestamp_a_dot_and_the_body() -> None:
    # the vector docs/alerts.md's receiver checks itself against
    data = json.dumps({"format": 1, "event": "firing"}, separators=(",", ":")).encode()
    sig = signature(b"0123456789abcdef", 1_800_000_000, data)
    assert (
        sig
        == "v1="
        + __import__("hmac").new(b"0123456789abcdef", b"1800000000." + data, "sha256").hexdigest()
    )
    head = headers(b"0123456789abcdef", 1_800_000_000, data, "resolved", "abc")
    assert head[TIMESTAMP_HEADER] == "1800000000"
    assert head[SIGNATURE_HEADER] == sig
    assert head[DELIVERY_HEADER] == "abc"


def test_a_receiver_that_is_down_gets_its_tries_then_the_dead_letters_then_a_resend(
    db: Engine,
) -> None:
    clock = Clock()
    port = free_port()
    hook = WebhookReceiver(SECRET, port=port, clock=clock)  # not started: nothing listens
    section = _section(hook.url)
    _fire(db, section, clock.now)
    deliverer = Deliverer(db, section, {"ops": SECRET}, clock=clock)
    tried_at = []
    for _ in range(40):  # a try is due at T0, +10 s, +10+15 s; none after
        if deliverer.run_once():
            tried_at.append(clock.now - T0)
        clock.now += 1.0
    assert tried_at == [0.0, 10.0, 25.0]  # backoff 10 s, then doubled to the 15 s ceiling
    assert [backoff_s(section.delivery, n) for n in (1, 2, 3)] == [10.0, 15.0, 15.0]
    (dead,) = store.list_deliveries(db, state=store.DEAD)
    assert dead.attempts == 3
    assert dead.last_status is None
    assert "ConnectionRefused" in dead.last_error
    assert deliverer.stats.dead == 1
    assert deliverer.stats.failed_tries == 3
    assert store.due_deliveries(db, clock.now + 3600, 10) == []  # dead: not tried again
    # the receiver is back; an operator sends the dead letter again
    with hook:
        assert store.retry_dead(db, dead.delivery_id, clock.now)
        assert not store.retry_dead(db, dead.delivery_id, clock.now)  # pending now, not dead
        assert deliverer.run_once() == 1
        assert [r.delivery_id for r in hook.received] == [dead.delivery_id]
    assert store.count_deliveries(db) == {"delivered": 1}


def test_a_receiver_answering_500_is_retried_and_a_webhook_no_longer_configured_is_dead(
    db: Engine,
) -> None:
    clock = Clock()
    with WebhookReceiver(SECRET, clock=clock) as hook:
        hook.status = 500
        section = _section(hook.url)
        _fire(db, section, clock.now)
        deliverer = Deliverer(db, section, {"ops": SECRET}, clock=clock)
        assert deliverer.run_once() == 1
        (row,) = store.list_deliveries(db)
        assert (row.state, row.attempts, row.last_status, row.last_error) == (
            "pending", 1, 500, "answered 500",
        )  # fmt: skip
        hook.status = 204
        clock.now += 10
        assert deliverer.run_once() == 1
        assert store.list_deliveries(db)[0].state == "delivered"
        # the config changed: a delivery owed to a webhook that is gone is dead at once
        _fire(db, section, clock.now, key="cam-2")
        renamed = AlertsSection.model_validate({"webhooks": [{"name": "other", "url": hook.url,
                                                "secret_env": "X"}]})  # fmt: skip
        Deliverer(db, renamed, {"other": SECRET}, clock=clock).run_once()
        (dead,) = store.list_deliveries(db, state=store.DEAD)
        assert dead.last_error == "webhook 'ops' is no longer configured"
        assert len(hook.received) == 1
