"""A stuck revert on the console, over HTTP against a real fleet server (SQLite, a signed
repository, the real rollout service): the rollout's page says which device is stuck and
why; an operator retries it, then accepts it as it is, each kept with their name; a line
manager's post changes nothing; a new rollout on the devices it holds is refused on the
form, naming it."""

from __future__ import annotations

import time

from fleet_server.db import store
from tests.fleet_server.web.console_http_support import SPEC, Console, rollout_form

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]

QUICK = {**SPEC, "waves": "1,100%", "policy": {"timeouts": {"rolling_back_s": 1}}}
"""A reverting device is stuck one second after its revert was sent."""


def _stuck_canary(console: Console) -> tuple[str, str]:
    """A rollout whose canary's revert timed out: (rollout id, canary)."""
    service = console.rollouts.service
    rid = service.create(QUICK)
    service.tick()  # starts it; the canary gets its directive
    (canary,) = [d["device_id"] for d in service.get(rid)["devices"] if d["wave"] == 1]
    # it installed release 3 (its other slot keeps 2) and never confirms a revert
    store.upsert_device(console.engine, canary, active_bundle="detector", active_release=3,
                        previous_bundle="detector", previous_release=2)  # fmt: skip
    service.tick()
    olga = console.client("olga")
    done = olga.post(f"/ui/rollouts/{rid}/rollback", {"csrf_token": olga.csrf()})
    assert done.status == 303, done.text
    view = service.get(rid)
    assert view["phase"] == "rolling_back"
    deadline = time.monotonic() + 20
    while not view["stuck"] and time.monotonic() < deadline:
        time.sleep(0.2)
        service.tick()
        view = service.get(rid)
    assert [s["device_id"] for s in view["stuck"]] == [canary], view
    return rid, canary


def test_a_stuck_revert_is_shown_with_why_and_an_operator_retries_then_accepts_it(
    console: Console,
) -> None:
    rid, canary = _stuck_canary(console)
    service = console.rollouts.service
    olga, lena = console.client("olga"), console.client("lena")
    page = olga.get(f"/ui/rollouts/{rid}")
    assert 'data-testid="open-reverts"' in page.text
    assert "timeout: no revert to detector release 2 confirmed within 1 s" in page.text
    assert 'data-resolve="retry"' in page.text
    assert 'data-resolve="retry"' not in lena.get(f"/ui/rollouts/{rid}").text

    url = f"/ui/rollouts/{rid}/devices/{canary}/resolve"
    refused = lena.post(url, {"csrf_token": lena.csrf(), "how": "accept"})
    assert refused.status == 403
    assert service.get(rid)["stuck"] != []

    csrf = olga.csrf()
    bad = olga.post(url, {"csrf_token": csrf, "how": "assign", "release": "²"})
    assert bad.status == 409
    assert "is not a release number" in bad.text
    sent = len(console.rollouts.sent)
    retried = olga.post(url, {"csrf_token": csrf, "how": "retry"})
    assert (retried.status, retried.headers["location"]) == (303, f"/ui/rollouts/{rid}?done=retry")
    assert len(console.rollouts.sent) == sent + 1  # the revert went out again
    (entry,) = [d for d in service.get(rid)["devices"] if d["device_id"] == canary]
    assert entry["status"] == "reverting"

    accepted = olga.post(url, {"csrf_token": csrf, "how": "accept", "reason": "checked on site"})
    assert accepted.status == 303
    view = service.get(rid)
    assert view["phase"] == "rolled_back", view["reason"]
    (entry,) = [d for d in view["devices"] if d["device_id"] == canary]
    assert entry["status"] == "accepted"
    assert entry["why"] == "accepted as it is (detector release 3) by olga: checked on site"
    notes = [n.payload for n in store.list_events(console.engine, rid, kind="rollout")]
    resolved = [(n["by"], n["message"]) for n in notes if n["kind"] == "resolved"]
    assert sorted(resolved) == [
        ("olga", f"{canary}: {entry['why']}"),
        ("olga", f"{canary}: retry by olga: revert to detector release 2"),
    ]
    (rollback,) = [n for n in notes if n["kind"] == "phase" and n["phase"] == "rolling_back"]
    assert rollback["by"] == "olga"


def test_a_new_rollout_on_devices_a_stuck_rollback_holds_is_refused_on_the_form(
    console: Console,
) -> None:
    rid, canary = _stuck_canary(console)
    olga = console.client("olga")
    refused = olga.post("/ui/rollouts", rollout_form(olga.csrf(), "ro-00000000cafe"))
    assert refused.status == 400
    assert f"held by rollout {rid} (rolling_back): {canary}" in refused.text
    assert [r.rollout_id for r in store.list_rollouts(console.engine)] == [rid]
