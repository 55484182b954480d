"""Reading the facts the alert rules judge (:class:`fleet_server.alerts.rules.Facts`).

A handful of queries, each bounded by an index or by what is wrong: the rollouts in the
phases a rule looks at (the ``state`` index; the phase's reason and start out of the
stored state as JSON, not the whole state), the devices stuck in them, the devices
offline (one pass over the registry's columns), the drift flags, the unreviewed
decisions of the backlog window (``ix_decisions_outcome_ts``), the newest health of
each device (its disk figures compared in SQL, its stations' counts out of the JSON of
the devices that run one) and, only for a station whose counts could have risen enough
to fire, the health report a window older
(``ix_telemetry_device_id_ts``). Sites come from the devices' ``site`` labels.

Certificates and the repository's metadata are read only when asked (``slow``): they
change by days, and reading every device's certificate is the costly part. A device
certificate's expiry is cached by serial (:class:`CertCache`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from cryptography import x509
from sqlalchemy.engine import Connection, Engine

from fleet_server.alerts.config import RulesSection
from fleet_server.alerts.rules import (
    MINUTE_S,
    BacklogFact,
    CertFact,
    DeviceFact,
    DiskFact,
    DriftFact,
    Facts,
    RoleFact,
    RolloutFact,
    StationFact,
    StuckFact,
    finite,
)
from fleet_server.db._tx import reading
from fleet_server.db.tables import (
    LINE_EXPRESSION,
    decision_reviews,
    decisions,
    devices,
    drift_status,
    rollout_devices,
    rollouts,
    telemetry,
)
from fleet_server.errors import FleetError

log = logging.getLogger(__name__)

PHASES = ("paused", "rolling_back", "awaiting_approval")
"""Live phases a rollout rule looks at (``rolled_back`` is read within its hold)."""
HOUR_S = 3600.0
STATION_COUNTS = ("deadline_missed", "overruns")
HEALTH_PREFIX = "health:"
"""Record ids of health reports in ``telemetry``."""
CERT_CACHE_MAX = 500_000


@dataclass
class CertCache:
    """Device certificates' expiry by serial (a serial's certificate never changes)."""

    not_after: dict[str, float] = field(default_factory=dict)
    reads: int = 0

    def get(self, serial: str, read: Callable[[int], datetime]) -> float | None:
        """The expiry of ``serial``'s certificate (None: unreadable, logged)."""
        hit = self.not_after.get(serial)
        if hit is not None:
            return hit
        try:
            value = read(int(serial, 16)).timestamp()
        except (ValueError, FleetError) as exc:
            log.warning("alerts: certificate %s: %s", serial, exc)
            return None
        self.reads += 1
        if len(self.not_after) >= CERT_CACHE_MAX:
            self.not_after.clear()
        self.not_after[serial] = value
        return value


def _site_of(labels: Any) -> tuple[str, ...]:
    site = labels.get("site") if isinstance(labels, dict) else None
    return (site,) if isinstance(site, str) and site else ()


def _sites(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple(sorted({v for v in values if isinstance(v, str) and v}))


def _label(name: str) -> sa.ColumnElement[str]:
    label: sa.ColumnElement[str] = devices.c.labels[name].as_string()
    return label


def read_rollouts(conn: Connection, rules: RulesSection, now: float) -> list[RolloutFact]:
    """Rollouts paused, rolling back or awaiting approval, and those rolled back within
    the rolled-back rule's hold."""
    r = rollouts.c
    state = r.controller_state
    hold_s = rules.rollout_rolled_back.hold_minutes * MINUTE_S
    query = sa.select(
        r.rollout_id, r.bundle, r.version, r.state, r.selector,
        state[("rollout", "reason")].as_string(), state[("rollout", "since")].as_float(),
    ).where(
        sa.or_(r.state.in_(PHASES), sa.and_(r.state == "rolled_back", r.updated_at >= now - hold_s))
    )  # fmt: skip
    out = []
    for rid, bundle, version, phase, selector, reason, since in conn.execute(query):
        site = selector.get("site") if isinstance(selector, dict) else None
        sites = (site,) if isinstance(site, str) and site else _rollout_sites(conn, rid)
        out.append(RolloutFact(rid, bundle, version, phase, reason or "", since or now, sites))
    return out


def _rollout_sites(conn: Connection, rollout_id: str) -> tuple[str, ...]:
    rd = rollout_devices.c
    query = (
        sa.select(_label("site"))
        .distinct()
        .select_from(rollout_devices.join(devices, devices.c.device_id == rd.device_id))
        .where(rd.rollout_id == rollout_id)
    )
    return _sites(row[0] for row in conn.execute(query))


def read_stuck(conn: Connection) -> list[StuckFact]:
    """Devices ``stuck`` in a rollout that is rolling back."""
    rd, r = rollout_devices.c, rollouts.c
    query = (
        sa.select(rd.rollout_id, rd.device_id, _label("site"))
        .select_from(
            rollout_devices.join(rollouts, r.rollout_id == rd.rollout_id).outerjoin(
                devices, devices.c.device_id == rd.device_id
            )
        )
        .where(r.state == "rolling_back", rd.status == "stuck")
        .order_by(rd.rollout_id, rd.device_id)
    )
    return [StuckFact(rid, did, _sites([site])) for rid, did, site in conn.execute(query)]


def read_offline(conn: Connection, rules: RulesSection, now: float) -> list[DeviceFact]:
    """Devices not revoked, seen once, offline since before the rule's threshold."""
    d = devices.c
    cutoff = now - rules.device_offline.after_minutes * MINUTE_S
    query = sa.select(d.device_id, d.last_seen, _label("site")).where(
        sa.not_(d.revoked), sa.not_(d.online), d.last_seen.is_not(None), d.last_seen <= cutoff
    )
    return [DeviceFact(did, float(seen), _sites([site])) for did, seen, site in conn.execute(query)]


def _line_sites(conn: Connection, lines: Collection[str]) -> dict[str, tuple[str, ...]]:
    if not lines:
        return {}
    line = _label("line")
    query = sa.select(line, _label("site")).distinct().where(line.in_(sorted(lines)))
    found: dict[str, set[str]] = {}
    for ln, site in conn.execute(query):
        if isinstance(site, str) and site:
            found.setdefault(ln, set()).add(site)
    return {ln: tuple(sorted(s)) for ln, s in found.items()}


def read_drift(conn: Connection) -> list[DriftFact]:
    """The (model version, line) flags the drift job holds as drifted."""
    s = drift_status.c
    query = (
        sa.select(s.model_name, s.model_version, s.line, s.changed_at, s.result)
        .where(s.drifted)
        .order_by(s.model_name, s.model_version, s.line)
    )
    rows = conn.execute(query).all()
    sites = _line_sites(conn, {r[2] for r in rows})
    out = []
    for model, version, line, since, result in rows:
        reason = result.get("reason") if isinstance(result, dict) else ""
        out.append(DriftFact(model, version, line, since, str(reason or ""), sites.get(line, ())))
    return out


def read_backlog(conn: Connection, rules: RulesSection, now: float) -> list[BacklogFact]:
    """Per line, decisions sent for review in the rule's window that have no review."""
    d, v = decisions.c, decision_reviews.c
    window = rules.review_backlog.window_hours * HOUR_S
    row_line = sa.text(LINE_EXPRESSION[conn.dialect.name])
    line = sa.func.coalesce(row_line, _label("line"), "")
    reviewed = (
        sa.select(sa.literal(1)).where(v.device_id == d.device_id, v.decision_id == d.id).exists()
    )
    query = (
        sa.select(line.label("line"), sa.func.count())
        .select_from(decisions.outerjoin(devices, devices.c.device_id == d.device_id))
        .where(d.outcome == "review", d.ts >= now - window, ~reviewed)
        .group_by(line)
    )
    counts = {str(ln): int(n) for ln, n in conn.execute(query)}
    over = [ln for ln, n in counts.items() if n > rules.review_backlog.max_pending]
    sites = _line_sites(conn, over)
    return [BacklogFact(ln, counts[ln], sites.get(ln, ())) for ln in sorted(over)]


@dataclass(frozen=True)
class StationRow:
    """A device's stations' counts from its newest health report."""

    device_id: str
    sites: tuple[str, ...]
    stations: Mapping[str, Mapping[str, int]]


def _counts(value: Any) -> dict[str, dict[str, int]]:
    """A health report's ``stations`` as {station: {count: n}} (what is not one dropped)."""
    out: dict[str, dict[str, int]] = {}
    if not isinstance(value, dict):
        return out
    for name, counts in value.items():
        if not isinstance(name, str) or not isinstance(counts, dict):
            continue
        kept = {}
        for key in STATION_COUNTS:
            n = counts.get(key)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                kept[key] = n
        out[name] = kept
    return out


def read_station_rows(conn: Connection) -> list[StationRow]:
    """Each device (not revoked) whose newest health report names a station, with its
    stations' counts (the JSON filtered in SQL: most devices run no station)."""
    d = devices.c
    stations = d.health["stations"]
    text = stations.as_string()
    query = sa.select(d.device_id, _label("site"), stations).where(
        sa.not_(d.revoked), text.is_not(None), text != "{}"
    )
    return [
        StationRow(did, _sites([site]), _counts(value)) for did, site, value in conn.execute(query)
    ]


def read_disks(conn: Connection, rules: RulesSection) -> list[DiskFact]:
    """Devices (not revoked) whose newest health says their state directory is over
    their budget or their data disk has less than the rule's ``min_free_mb`` free (the
    comparison in SQL: a fleet of healthy disks returns no row)."""
    d = devices.c
    h = d.health
    free, used, budget = (
        h["disk_free_mb"].as_float(), h["state_dir_mb"].as_float(), h["disk_budget_mb"].as_float()
    )  # fmt: skip
    query = sa.select(d.device_id, _label("site"), free, used, budget).where(
        sa.not_(d.revoked),
        h.is_not(None),
        sa.or_(used > budget, free < rules.disk_over_budget.min_free_mb),
    )
    return [
        DiskFact(did, finite(f), finite(u), finite(b), _sites([site]))
        for did, site, f, u, b in conn.execute(query)
    ]


def _earlier_query() -> sa.Select[Any]:
    t = telemetry.c
    return (
        sa.select(t.payload["stations"])
        .where(
            t.device_id == sa.bindparam("device"),
            t.ts <= sa.bindparam("before"),
            t.record_id.startswith(HEALTH_PREFIX),
        )
        .order_by(t.ts.desc())
        .limit(1)
    )


_EARLIER = _earlier_query()
"""The last health report of a device at or before a time (built once: one index seek
each, ``ix_telemetry_device_id_ts``)."""


def read_stations(
    conn: Connection, health: Iterable[StationRow], rules: RulesSection, now: float
) -> list[StationFact]:
    """Stations whose counts could have risen enough to fire (a count since the agent
    started below a rule's ``min_count`` can't have risen by it), with the counts a
    window before now (each station rule has its own window)."""
    windows = {
        "deadline_missed": rules.station_deadline_missed.window_minutes * MINUTE_S,
        "overruns": rules.station_overruns.window_minutes * MINUTE_S,
    }
    least = {
        "deadline_missed": rules.station_deadline_missed.min_count,
        "overruns": rules.station_overruns.min_count,
    }
    out = []
    for row in health:
        busy = {
            s: c for s, c in row.stations.items() if any(c.get(k, 0) >= n for k, n in least.items())
        }
        if not busy:
            continue
        earlier: dict[float, dict[str, dict[str, int]]] = {}
        for window in set(windows.values()):
            found = conn.execute(_EARLIER, {"device": row.device_id, "before": now - window})
            first = found.first()
            earlier[window] = _counts(first[0]) if first is not None else {}
        for station, counts in sorted(busy.items()):
            then: dict[str, int] = {}
            for key, window in windows.items():
                before = earlier[window].get(station, {})
                if key in before:
                    then[key] = before[key]
            out.append(StationFact(row.device_id, station, counts, then or None, row.sites))
    return out


def read_device_certs(
    conn: Connection, read: Callable[[int], datetime], cache: CertCache
) -> list[CertFact]:
    """The certificate of every device not revoked (its serial in the registry)."""
    d = devices.c
    query = sa.select(d.device_id, d.cert_serial, _label("site")).where(
        sa.not_(d.revoked), d.cert_serial.is_not(None)
    )
    out = []
    for device_id, serial, site in conn.execute(query):
        not_after = cache.get(str(serial), read)
        if not_after is not None:
            out.append(CertFact("device", device_id, not_after, _sites([site])))
    return out


def read_server_certs(files: Mapping[str, Path]) -> list[CertFact]:
    """The server's certificates: name -> file (a file missing is skipped, one that
    can't be read is logged)."""
    out = []
    for name, path in sorted(files.items()):
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            log.warning("alerts: certificate %s (%s): %s", name, path, exc)
            continue
        out.append(CertFact("server", name, cert.not_valid_after_utc.timestamp()))
    return out


@dataclass(frozen=True)
class Sources:
    """Where the slow facts come from: the CA's issued certificates by serial, the
    server's certificate files, the repository's roles (role, version, expires, period
    in seconds) — each a callable, so tests and the runner give their own."""

    issued: Callable[[int], datetime] | None = None
    server_certs: Callable[[], Mapping[str, Path]] = dict
    roles: Callable[[], list[RoleFact]] = list


def gather(
    engine: Engine,
    rules: RulesSection,
    now: float,
    *,
    slow: bool,
    sources: Sources,
    cache: CertCache,
) -> Facts:
    """Every fact the enabled rules need, read now (certificates and the repository's
    roles only when ``slow``)."""
    on = {name for name, rule in rules.by_name().items() if rule.enabled}
    with reading(engine) as conn:
        rollout_rules = {"rollout_gate_stopped", "rollout_rolled_back", "rollout_awaiting_approval"}
        found: dict[str, Any] = {"now": now}
        if on & rollout_rules:
            found["rollouts"] = read_rollouts(conn, rules, now)
        if "device_stuck_reverting" in on:
            found["stuck"] = read_stuck(conn)
        if "device_offline" in on:
            found["offline"] = read_offline(conn, rules, now)
        if "drift" in on:
            found["drift"] = read_drift(conn)
        if "review_backlog" in on:
            found["backlog"] = read_backlog(conn, rules, now)
        if on & {"station_deadline_missed", "station_overruns"}:
            found["stations"] = read_stations(conn, read_station_rows(conn), rules, now)
        if "disk_over_budget" in on:
            found["disks"] = read_disks(conn, rules)
        if slow and "certificate_expiry" in on:
            certs = read_server_certs(sources.server_certs())
            if sources.issued is not None:
                certs += read_device_certs(conn, sources.issued, cache)
            found["certs"] = certs
    if slow and "tuf_expiry" in on:
        found["roles"] = sources.roles()
    return Facts(**found)


__all__ = ["CertCache", "Sources", "StationRow", "gather"]
