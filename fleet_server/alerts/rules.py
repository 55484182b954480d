"""The alert rules as pure functions: facts in, the conditions that hold now out.

:mod:`fleet_server.alerts.facts` reads :class:`Facts` from the database, the CA and the
repository; :func:`evaluate` turns them into one list of :class:`Condition` per rule
(None for a rule that was not looked at this time: its alerts stay as they are);
:func:`changes` compares that with the alerts held open and says which fire and which
resolve. An alert is known by (rule, key): the same condition seen again is the same
alert, so each fires once and resolves once however often the rules are evaluated.
No clock, no I/O: ``now`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet_server.alerts.config import RulesSection

MINUTE_S = 60.0
DAY_S = 86_400.0
GATE_FAILED = "gate failed"
"""How the rollout machine begins the reason of a phase a failed gate entered."""


@dataclass(frozen=True)
class Condition:
    """One condition that holds now: an alert, firing or to fire.

    Attributes:
        rule: the rule's name (``device_offline``).
        key: what it is about, unique within the rule (a device id, a rollout id, ...).
        severity: info, warning or critical.
        summary: one line for a person.
        labels: what it is about, as names (``device``, ``rollout``, ``line``, ``site``).
        sites: the sites it concerns (routes it to a site's webhooks); empty: none known.
        detail: figures that say why.
    """

    rule: str
    key: str
    severity: str
    summary: str
    labels: Mapping[str, str] = field(default_factory=dict)
    sites: tuple[str, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenAlert:
    """An alert held as firing (not resolved)."""

    alert_id: int
    rule: str
    key: str


@dataclass(frozen=True)
class RolloutFact:
    """A rollout in a phase a rule looks at."""

    rollout_id: str
    bundle: str
    version: str
    phase: str
    reason: str
    since: float
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class StuckFact:
    """A device ``stuck`` in a rollout's revert."""

    rollout_id: str
    device_id: str
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceFact:
    """A device the offline rule looks at (not revoked, seen once, offline)."""

    device_id: str
    last_seen: float
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriftFact:
    """A (model version, line) the drift job holds as drifted."""

    model_name: str
    model_version: str
    line: str
    since: float | None
    reason: str = ""
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class BacklogFact:
    """Unreviewed decisions sent for review on one line in the rule's window."""

    line: str
    pending: int
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class StationFact:
    """One station's counts: the newest health report's, and the last report at least a
    window older (None: none that old, the rise is counted from 0)."""

    device_id: str
    station: str
    now_counts: Mapping[str, int]
    then_counts: Mapping[str, int] | None
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiskFact:
    """A device's disk figures from its newest health report (MiB; None: not reported)."""

    device_id: str
    free_mb: float | None
    state_mb: float | None
    budget_mb: float | None
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class CertFact:
    """A certificate: ``kind`` device or server, ``name`` the device id or the file's
    role (``ca``, ``broker main``, ``identity fleet-server``)."""

    kind: str
    name: str
    not_after: float
    sites: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoleFact:
    """A TUF role of the bundle repository: when it expires, its validity period."""

    role: str
    version: int
    expires: float
    period_s: float


@dataclass(frozen=True)
class Facts:
    """What the rules judge, read at ``now``. A field left None was not read this time
    (its rules keep their alerts as they are)."""

    now: float
    rollouts: Sequence[RolloutFact] | None = None
    stuck: Sequence[StuckFact] | None = None
    offline: Sequence[DeviceFact] | None = None
    drift: Sequence[DriftFact] | None = None
    backlog: Sequence[BacklogFact] | None = None
    stations: Sequence[StationFact] | None = None
    disks: Sequence[DiskFact] | None = None
    certs: Sequence[CertFact] | None = None
    roles: Sequence[RoleFact] | None = None


def _minutes(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def _rollout_labels(r: RolloutFact) -> dict[str, str]:
    return {"rollout": r.rollout_id, "bundle": r.bundle, "version": r.version}


def gate_stopped(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.rollout_gate_stopped
    if facts.rollouts is None:
        return None
    return [
        Condition(
            "rollout_gate_stopped",
            r.rollout_id,
            rule.severity,
            f"rollout {r.rollout_id} ({r.bundle} {r.version}) stopped by a gate: {r.reason}",
            _rollout_labels(r),
            r.sites,
            {"phase": r.phase, "reason": r.reason, "since": r.since},
        )
        for r in facts.rollouts
        if r.phase in ("paused", "rolling_back") and r.reason.startswith(GATE_FAILED)
    ]


def rolled_back(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.rollout_rolled_back
    if facts.rollouts is None:
        return None
    hold = rule.hold_minutes * MINUTE_S
    return [
        Condition(
            "rollout_rolled_back",
            r.rollout_id,
            rule.severity,
            f"rollout {r.rollout_id} ({r.bundle} {r.version}) rolled back: {r.reason}",
            _rollout_labels(r),
            r.sites,
            {"reason": r.reason, "since": r.since},
        )
        for r in facts.rollouts
        if r.phase == "rolled_back" and facts.now - r.since < hold
    ]


def awaiting_approval(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.rollout_awaiting_approval
    if facts.rollouts is None:
        return None
    after = rule.after_minutes * MINUTE_S
    return [
        Condition(
            "rollout_awaiting_approval",
            r.rollout_id,
            rule.severity,
            f"rollout {r.rollout_id} ({r.bundle} {r.version}) awaits approval: {r.reason}",
            _rollout_labels(r),
            r.sites,
            {"reason": r.reason, "since": r.since},
        )
        for r in facts.rollouts
        if r.phase == "awaiting_approval" and facts.now - r.since >= after
    ]


def stuck(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.device_stuck_reverting
    if facts.stuck is None:
        return None
    return [
        Condition(
            "device_stuck_reverting",
            f"{s.rollout_id}/{s.device_id}",
            rule.severity,
            f"{s.device_id} is stuck reverting rollout {s.rollout_id} (resolve it: fleetctl "
            f"rollouts resolve {s.rollout_id} {s.device_id})",
            {"rollout": s.rollout_id, "device": s.device_id},
            s.sites,
        )
        for s in facts.stuck
    ]


def offline(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.device_offline
    if facts.offline is None:
        return None
    after = rule.after_minutes * MINUTE_S
    return [
        Condition(
            "device_offline",
            d.device_id,
            rule.severity,
            f"{d.device_id} offline for over {_minutes(after)}",
            {"device": d.device_id, **_site(d.sites)},
            d.sites,
            {"last_seen": d.last_seen},
        )
        for d in facts.offline
        if facts.now - d.last_seen >= after
    ]


def drift(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.drift
    if facts.drift is None:
        return None
    return [
        Condition(
            "drift",
            f"{d.model_name}/{d.model_version}/{d.line}",
            rule.severity,
            f"drift on line {d.line}: {d.model_name} {d.model_version}"
            + (f" ({d.reason})" if d.reason else ""),
            {"model": d.model_name, "version": d.model_version, "line": d.line},
            d.sites,
            {"since": d.since},
        )
        for d in facts.drift
    ]


def backlog(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.review_backlog
    if facts.backlog is None:
        return None
    return [
        Condition(
            "review_backlog",
            b.line,
            rule.severity,
            f"line {b.line}: {b.pending} decisions wait for review (over {rule.max_pending})",
            {"line": b.line},
            b.sites,
            {"pending": b.pending, "max_pending": rule.max_pending},
        )
        for b in facts.backlog
        if b.pending > rule.max_pending
    ]


def rise(now_n: int, then_n: int | None) -> int:
    """How much a count since the agent's start rose: a lower count than before means
    the agent restarted (its counts began again), so all of the new one is the rise."""
    if then_n is None or now_n < then_n:
        return now_n
    return now_n - then_n


def _station(name: str, count: str, what: str, rules: RulesSection, facts: Facts
             ) -> list[Condition] | None:  # fmt: skip
    rule = getattr(rules, name)
    if facts.stations is None:
        return None
    out = []
    for s in facts.stations:
        then = s.then_counts.get(count) if s.then_counts is not None else None
        n = rise(int(s.now_counts.get(count, 0)), None if then is None else int(then))
        if n >= rule.min_count:
            out.append(
                Condition(
                    name,
                    f"{s.device_id}/{s.station}",
                    rule.severity,
                    f"station {s.station} on {s.device_id}: {n} {what} in "
                    f"{_minutes(rule.window_minutes * MINUTE_S)}",
                    {"device": s.device_id, "station": s.station, **_site(s.sites)},
                    s.sites,
                    {count: n, "window_minutes": rule.window_minutes},
                )
            )
    return out


def deadline_missed(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    return _station("station_deadline_missed", "deadline_missed", "missed deadlines", rules,
                    facts)  # fmt: skip


def overruns(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    return _station("station_overruns", "overruns", "overruns", rules, facts)


def disk(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.disk_over_budget
    if facts.disks is None:
        return None
    out = []
    for d in facts.disks:
        over = d.budget_mb is not None and d.state_mb is not None and d.state_mb > d.budget_mb
        low = d.free_mb is not None and d.free_mb < rule.min_free_mb
        if not (over or low):
            continue
        why = []
        if over:
            why.append(f"its state uses {d.state_mb:.0f} MiB of a {d.budget_mb:.0f} MiB budget")
        if low:
            why.append(f"{d.free_mb:.0f} MiB free on its data disk (under {rule.min_free_mb:g})")
        out.append(
            Condition(
                "disk_over_budget",
                d.device_id,
                rule.severity,
                f"{d.device_id}: " + "; ".join(why),
                {"device": d.device_id, **_site(d.sites)},
                d.sites,
                {"free_mb": d.free_mb, "state_mb": d.state_mb, "budget_mb": d.budget_mb},
            )
        )
    return out


def certificates(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.certificate_expiry
    if facts.certs is None:
        return None
    within = rule.within_days * DAY_S
    out = []
    for c in facts.certs:
        left = c.not_after - facts.now
        if left >= within:
            continue
        state = "expired" if left <= 0 else f"expires in {_minutes(left)}"
        labels = {"certificate": c.name, "kind": c.kind}
        if c.kind == "device":
            labels = {"device": c.name, "kind": c.kind, **_site(c.sites)}
        out.append(
            Condition(
                "certificate_expiry",
                f"{c.kind}:{c.name}",
                rule.severity,
                f"{c.kind} certificate {c.name} {state}",
                labels,
                c.sites,
                {"not_after": c.not_after},
            )
        )
    return out


def tuf(rules: RulesSection, facts: Facts) -> list[Condition] | None:
    rule = rules.tuf_expiry
    if facts.roles is None:
        return None
    out = []
    for r in facts.roles:
        left = r.expires - facts.now
        if left >= rule.min_left * r.period_s:
            continue
        state = "expired" if left <= 0 else f"expires in {_minutes(left)}"
        hint = "re-sign root offline" if r.role == "root" else "run fleetctl repo refresh"
        out.append(
            Condition(
                "tuf_expiry",
                r.role,
                rule.severity,
                f"repository {r.role} metadata v{r.version} {state} ({hint})",
                {"role": r.role},
                (),
                {"expires": r.expires, "version": r.version},
            )
        )
    return out


def _site(sites: tuple[str, ...]) -> dict[str, str]:
    return {"site": sites[0]} if len(sites) == 1 else {}


RULES = {
    "rollout_gate_stopped": gate_stopped,
    "rollout_rolled_back": rolled_back,
    "rollout_awaiting_approval": awaiting_approval,
    "device_stuck_reverting": stuck,
    "device_offline": offline,
    "drift": drift,
    "review_backlog": backlog,
    "station_deadline_missed": deadline_missed,
    "station_overruns": overruns,
    "disk_over_budget": disk,
    "certificate_expiry": certificates,
    "tuf_expiry": tuf,
}
"""Each rule's function, by the rule's name in ``[alerts.rules]``."""


def evaluate(rules: RulesSection, facts: Facts) -> dict[str, list[Condition] | None]:
    """Per rule, the conditions that hold (``[]`` for a disabled rule: its alerts
    resolve; None for a rule whose facts were not read this time)."""
    enabled = rules.by_name()
    out: dict[str, list[Condition] | None] = {}
    for name, fn in RULES.items():
        out[name] = fn(rules, facts) if enabled[name].enabled else []
    return out


@dataclass(frozen=True)
class Changes:
    """What an evaluation changes: conditions that fire, open alerts that resolve."""

    fire: tuple[Condition, ...] = ()
    resolve: tuple[OpenAlert, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.fire or self.resolve)


def changes(
    evaluated: Mapping[str, Sequence[Condition] | None], open_alerts: Iterable[OpenAlert]
) -> Changes:
    """Fire each condition that has no open alert of its (rule, key); resolve each open
    alert of an evaluated rule whose condition no longer holds. An open alert of a rule
    that is gone from the code (a newer server's) or was not evaluated is left alone."""
    held = {(a.rule, a.key): a for a in open_alerts}
    fire: list[Condition] = []
    holding: set[tuple[str, str]] = set()
    for conditions in evaluated.values():
        if conditions is None:
            continue
        for c in conditions:
            k = (c.rule, c.key)
            if k in holding:
                continue  # one alert per (rule, key), whatever a fact repeats
            holding.add(k)
            if k not in held:
                fire.append(c)
    resolve = [a for k, a in held.items() if evaluated.get(a.rule) is not None and k not in holding]
    return Changes(tuple(fire), tuple(sorted(resolve, key=lambda a: a.alert_id)))


def finite(value: Any) -> float | None:
    """``value`` as a finite float (None: missing, not a number, or not finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


__all__ = [
    "RULES",
    "BacklogFact",
    "CertFact",
    "Changes",
    "Condition",
    "DeviceFact",
    "DiskFact",
    "DriftFact",
    "Facts",
    "OpenAlert",
    "RoleFact",
    "RolloutFact",
    "StationFact",
    "StuckFact",
    "changes",
    "evaluate",
    "finite",
    "rise",
]
