"""Device reports for the rollout machine, from what ingest stored.

For each device of a rollout one :class:`DeviceReport` is built from its registry row
(online, active bundle, newest health) and its newest install event, and it is kept only
when it would change the device's record (:func:`fleet_server.rollout.reports.apply_report`
is pure, so this is decided before stepping). Reading the current facts rather than a
stream of changes makes the loop restart-safe: nothing is lost or counted twice between
ticks or across fleet-server processes.

The install event's payload is the agent's install report (``agent.directives.link``):
``outcome`` committed | noop | refused | failed, ``step``, ``bundle``, ``release``, ``at``,
and ``rolled_back`` where the installer says so, ``mode: "shadow"`` for an install into
the shadow slot; the installer's journal form (``status`` and ``target``) is read too. A
failure at or after the switch is an automatic rollback.

What runs in a device's shadow slot is read from its newest health's shadow summary
(``Health.shadow``: bundle, version, release), from its stored comparisons of the target,
and from a committed shadow install event of the target (before the first health). The
numbers the shadow gate judges never come from the summary: they are the device's stored,
decision-backed comparisons since its shadow directive, bounded by what it could have
decided (:func:`stored_shadow_report`, :mod:`fleet_server.quality.shadowrecords`). A
summary whose totals contradict those records is quarantined with the reason and raises
an alarm naming the device: a ``claim_refused`` note on the rollout and an event of the
same kind on the device (:func:`refuse_claim`), once per rollout and device.

The review labels for the accuracy gates (:func:`label_counts`) are read per tick only
when the rollout's policy sets an accuracy gate.
"""

from __future__ import annotations

import json
import logging
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from agent.wire import topics
from agent.wire.messages import EVENT_INSTALL
from fleet_server.db import store
from fleet_server.db.store import Device, EventRecord
from fleet_server.db.tables import decision_reviews
from fleet_server.quality.shadowrecords import StoredShadow, contradiction, stored_shadow
from fleet_server.review.labels import labelled_accuracy
from fleet_server.rollout.events import DeviceReport, InstallOutcome, ShadowReport
from fleet_server.rollout.gates import LabelCounts
from fleet_server.rollout.reports import apply_report, shadow_is_target
from fleet_server.rollout.state import SHADOW, DeviceState, Rollout

log = logging.getLogger(__name__)

ROLLOUT_NOTE = "rollout"
"""Kind of the events a rollout's notes are kept as (its id as their device id)."""
EVENT_LOOKBACK_S = 3600.0
"""Install events dated this long before a rollout's creation are still read (clocks)."""
MAX_EVENTS = 10_000
"""The most install events read per tick and rollout (the newest)."""

_OUTCOMES = {
    "running": InstallOutcome.RUNNING,
    "committed": InstallOutcome.COMMITTED,
    "noop": InstallOutcome.COMMITTED,
    "failed": InstallOutcome.FAILED,
    "refused": InstallOutcome.FAILED,
    "rolled-back": InstallOutcome.FAILED,
}
_AFTER_SWITCH = frozenset({"switch", "health", "commit"})


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _count(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None and number >= 0 else 0


def install_facts(
    payload: Mapping[str, Any],
) -> tuple[InstallOutcome | None, str | None, int | None, bool]:
    """(outcome, bundle, release, auto_rollback) of an install report; unknown → None."""
    raw = payload.get("outcome", payload.get("status"))
    outcome = _OUTCOMES.get(raw) if isinstance(raw, str) else None
    target = payload.get("target")
    target = target if isinstance(target, dict) else {}
    bundle = payload.get("bundle", target.get("name"))
    release = payload.get("release", target.get("release"))
    failed = outcome is InstallOutcome.FAILED
    rolled = payload.get("rolled_back") is True or raw == "rolled-back"
    auto = failed and (rolled or payload.get("step") in _AFTER_SWITCH)
    return (
        outcome,
        bundle if isinstance(bundle, str) else None,
        release if isinstance(release, int) and not isinstance(release, bool) else None,
        auto,
    )


MAX_REASON_CHARS = 300
"""The most characters of a device's install reason kept (it is the device's text)."""


def _plain(value: Any) -> str:
    """``value`` when it is a string, with control and format characters (newlines,
    bidi overrides) replaced by spaces, cut to :data:`MAX_REASON_CHARS`."""
    if not isinstance(value, str):
        return ""
    text = "".join(
        " " if unicodedata.category(c)[0] == "C" else c for c in value[:MAX_REASON_CHARS]
    )
    return " ".join(text.split())


def install_reason(payload: Mapping[str, Any]) -> str:
    """``step: reason`` of an install report (the device's words, made plain)."""
    step, reason = _plain(payload.get("step")), _plain(payload.get("reason"))
    return f"{step}: {reason}" if step and reason else step or reason


def health_facts(health: Mapping[str, Any] | None) -> tuple[int, float | None, dict[str, int]]:
    """(worker crashes, highest p99 over models, decisions by outcome) of a health report.

    ``worker_crashes`` and ``outcome_counts`` are read when the agent sends them (the
    health message keeps fields it does not define).
    """
    if not health:
        return 0, None, {}
    latency = health.get("latency_ms")
    p99s = [
        p
        for entry in (latency.values() if isinstance(latency, dict) else ())
        if isinstance(entry, dict) and (p := _number(entry.get("p99"))) is not None
    ]
    counts = health.get("outcome_counts")
    outcomes = {str(k): _count(v) for k, v in counts.items()} if isinstance(counts, dict) else {}
    return _count(health.get("worker_crashes")), max(p99s, default=None), outcomes


def shadow_facts(health: Mapping[str, Any] | None) -> ShadowReport | None:
    """The shadow summary of a health report (None: none, or not well formed)."""
    shadow = health.get("shadow") if health else None
    if not isinstance(shadow, dict) or not isinstance(shadow.get("bundle"), str):
        return None
    release = shadow.get("release")
    version = shadow.get("version")
    n = _count(shadow.get("n"))
    return ShadowReport(
        bundle=shadow["bundle"],
        release=release if isinstance(release, int) and not isinstance(release, bool) else None,
        version=version if isinstance(version, str) else None,
        n=n,
        agree=min(n, _count(shadow.get("agree"))),
        p99_ms=_number(shadow.get("shadow_p99_ms")),
    )


def device_report(device: Device, install: EventRecord | None, now: float) -> DeviceReport:
    """The report of one device: its row and its newest install event.

    Health figures count only when reported after that install began (before, they are
    of the bundle it replaced).
    """
    outcome, bundle, release, auto = (None, None, None, False)
    began: float | None = None
    shadow_install = False
    why = ""
    if install is not None:
        outcome, bundle, release, auto = install_facts(install.payload)
        began = _number(install.payload.get("at")) or install.ts
        shadow_install = install.payload.get("mode") == "shadow"
        why = install_reason(install.payload)
    health = device.health
    health_ts = _number(health.get("ts")) if health else None
    if began is not None and (health_ts is None or health_ts < began):
        health = None
    crashes, p99, outcomes = health_facts(health)
    return DeviceReport(
        device_id=device.device_id,
        now=now,
        online=device.online,
        active_bundle=device.active_bundle,
        active_release=device.active_release,
        install=outcome,
        install_bundle=bundle,
        install_release=release,
        install_shadow=shadow_install,
        auto_rollback=auto,
        worker_crashes=crashes,
        p99_ms=p99,
        outcome_counts=outcomes,
        shadow=shadow_facts(health),
        install_at=began,
        install_reason=why,
    )


def newest_installs(events: Iterable[EventRecord]) -> dict[str, EventRecord]:
    """The newest install event of each device (by ``ts``, then id)."""
    newest: dict[str, EventRecord] = {}
    for event in events:
        held = newest.get(event.device_id)
        if held is None or (event.ts, event.event_id) > (held.ts, held.event_id):
            newest[event.device_id] = event
    return newest


def changes(rollout: Rollout, reports: Iterable[DeviceReport]) -> list[DeviceReport]:
    """The reports that would change their device's record in ``rollout``."""
    out = []
    for report in reports:
        held = rollout.devices.get(report.device_id)
        if held is None:
            continue
        after = apply_report(held, report, rollout.target, report.now, rollout.spec.version)
        if replace(after, reports=held.reports, last_report_at=held.last_report_at) != held:
            out.append(report)
    return out


def collect(engine: Engine, rollout: Rollout, now: float) -> list[DeviceReport]:
    """The reports of the rollout's devices that change something, in assignment order."""
    wanted = set(rollout.order)
    rows = {d.device_id: d for d in store.list_devices(engine) if d.device_id in wanted}
    events = store.list_events(
        engine,
        kind=EVENT_INSTALL,
        since=rollout.created_at - EVENT_LOOKBACK_S,
        limit=MAX_EVENTS,
    )
    installs = newest_installs(e for e in events if e.device_id in wanted)
    reports = [device_report(rows[d], installs.get(d), now) for d in rollout.order if d in rows]
    reports = [stored_shadow_report(engine, rollout, r, now) for r in reports]
    return changes(rollout, reports)


CLAIM_REFUSED = "claim_refused"
"""Kind of the rollout note and the device event of a refused shadow claim."""


def stored_shadow_report(
    engine: Engine, rollout: Rollout, report: DeviceReport, now: float
) -> DeviceReport:
    """``report`` with its shadow figures taken from the device's stored records of the
    target (while the device is in the rollout's shadow phase); a health summary that
    contradicts them is refused (:func:`refuse_claim`)."""
    held = rollout.devices.get(report.device_id)
    if held is None or held.status not in SHADOW:
        return report
    target, version = rollout.target, rollout.spec.version
    since = held.assigned_at if held.assigned_at is not None else rollout.created_at
    stored = stored_shadow(engine, report.device_id, target.name, version, since, now)
    claim = report.shadow if shadow_is_target(report.shadow, target, version) else None
    if claim is not None:
        why = contradiction(claim.n, claim.agree, stored)
        if why is not None:
            refuse_claim(engine, rollout, held, claim, stored, why, now)
    elif stored.over_bound:
        why = contradiction(0, 0, stored)
        refuse_claim(engine, rollout, held, None, stored, why or "", now)
    if stored.stored == 0 and claim is None:
        return replace(report, shadow=None)
    figures = ShadowReport(target.name, target.release, version, stored.n, stored.agree,
                           stored.p99_ms)  # fmt: skip
    return replace(report, shadow=figures)


def refuse_claim(
    engine: Engine,
    rollout: Rollout,
    device: DeviceState,
    claim: ShadowReport | None,
    stored: StoredShadow,
    why: str,
    now: float,
) -> None:
    """Quarantine a device's shadow claim that contradicts its stored records and raise
    the alarm naming it: a note on the rollout and an event on the device (once per
    rollout and device: the events' ids are fixed, the quarantine follows a new one)."""
    wave = 0 if device.wave is None else device.wave + 1
    message = f"device {device.device_id}: shadow claim refused: {why}"
    facts = {
        "rollout_id": rollout.rollout_id,
        "device_id": device.device_id,
        "reason": why,
        "claim": None if claim is None else {"n": claim.n, "agree": claim.agree},
        "stored": {"comparisons": stored.stored, "counted": stored.n, "agree": stored.agree,
                   "bound": stored.bound},
    }  # fmt: skip
    note = {"rollout_id": rollout.rollout_id, "kind": CLAIM_REFUSED,
            "phase": rollout.phase.value, "wave": wave, "message": message}  # fmt: skip
    event_id = f"{rollout.rollout_id}:{CLAIM_REFUSED}:{device.device_id}"
    new = store.insert_events(
        engine,
        [
            EventRecord(rollout.rollout_id, event_id, now, ROLLOUT_NOTE, note, now),
            EventRecord(device.device_id, event_id, now, CLAIM_REFUSED, facts, now),
        ],
    )
    if new:
        log.warning("rollout %s: %s", rollout.rollout_id, message)
        payload = json.dumps(facts, sort_keys=True).encode()
        store.quarantine(engine, topics.telemetry(device.device_id), message, payload, now=now)


def rollout_lines(rollout: Rollout) -> set[str]:
    """The ``line`` labels of the rollout's devices."""
    return {line for d in rollout.devices.values() if (line := d.labels.get("line"))}


def label_counts(engine: Engine, rollout: Rollout, base_versions: Iterable[str]) -> LabelCounts:
    """Review labels of the target version and of ``base_versions`` (what the rollout's
    devices ran before) of the target's bundle, on the decisions of the devices enrolled
    on the rollout's devices' lines (the registry's ``line`` label, never the line a
    decision names; every device when none of the rollout's devices has a line)."""
    lines = sorted(rollout_lines(rollout))
    devices = None
    if lines:
        devices = sorted(
            {d.device_id for line in lines for d in store.list_devices(engine, {"line": line})}
        )
    name, version = rollout.target.name, rollout.spec.version
    confirmed, reviewed = labelled_on_devices(engine, name, version, devices)
    base_confirmed = base_reviewed = 0
    for old in sorted(set(base_versions) - {version}):
        ok, n = labelled_on_devices(engine, name, old, devices)
        base_confirmed, base_reviewed = base_confirmed + ok, base_reviewed + n
    return LabelCounts(confirmed, reviewed, base_confirmed, base_reviewed)


def labelled_on_devices(
    engine: Engine, name: str, version: str, devices: Sequence[str] | None
) -> tuple[int, int]:
    """``(confirmed, reviewed)`` of ``name`` ``version``'s reviewed decisions of
    ``devices`` (None: every device's; ``[]``: none)."""
    if devices is None:
        return labelled_accuracy(engine, name, version, None)
    if not devices:
        return 0, 0
    r = decision_reviews
    ok = sa.func.coalesce(sa.func.sum(sa.case((r.c.decided == r.c.outcome, 1), else_=0)), 0)
    query = sa.select(ok, sa.func.count()).where(
        r.c.model_name == name, r.c.model_version == version, r.c.device_id.in_(devices)
    )
    with engine.connect() as conn:
        confirmed, reviewed = conn.execute(query).one()
    return int(confirmed), int(reviewed)
