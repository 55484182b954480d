"""The fleet server's figures as Prometheus metric families, read at scrape time.

:class:`FleetCollector` keeps no figure of its own: at each scrape it asks the health
probes (``ctx.health``: each service puts its counters in its probe's detail), the
leadership (``ctx.leader``) and the database (:mod:`fleet_server.metrics.dbfigures`).
Every family is declared at every scrape, with samples only where the part exists (a
replica without retention shows the family without a sample), so that a dashboard's
metric names can be checked against any running server.

A source that fails (a probe's detail without the figure, a database that doesn't
answer, a leadership that raises) is logged and counted in
``edgefleet_fleet_metrics_errors_total{source}``; the scrape goes on with the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from fleet_server.cluster import NotLeader
from fleet_server.errors import FleetError
from fleet_server.health import PartHealth
from fleet_server.metrics.dbfigures import REASON_CLASSES, CachedFigures, DbFigures
from fleet_server.rollout.state import Phase

if TYPE_CHECKING:
    from fleet_server.api.context import ServerContext

log = logging.getLogger(__name__)

PREFIX = "edgefleet_fleet_"
INGEST_PREFIX = "ingest"
"""Probes whose name starts with this and whose detail counts ``received`` are ingest
workers; the probe's name is the ``worker`` label."""
FILES_PREFIX = "files"
ROLLOUTS_PROBE = "rollouts"
DRIFT_PROBE = "drift"
RETENTION_PROBE = "retention"
ALERTS_PROBE = "alerts"
ALERT_DELIVERY_RESULTS = (("sent", "delivered"), ("failed", "delivery_failed_tries"),
                          ("dead", "dead_letters"))  # fmt: skip
"""``result`` label of the alert deliveries counter, and the probe detail key it reads."""
RATE_WINDOW_S = 60.0
"""The ingest rate gauge is the rate over the scrapes of the last this many seconds."""
RATE_MIN_SPAN_S = 1.0
RATE_SAMPLES = 64
INGEST_RESULTS = (
    ("stored", "stored"),
    ("duplicate", "duplicates"),
    ("quarantined", "quarantined"),
    ("gave_up", "gave_up"),
)
"""``result`` label of the ingest records counter, and the probe detail key it reads."""
RECONCILER_EVENTS = ("ticks", "conflicts", "fenced", "command_errors", "tick_errors")


def _num(detail: Mapping[str, Any], key: str) -> float | None:
    value = detail.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class IngestRates:
    """Messages per second of each ingest worker over the scrapes of the last
    :data:`RATE_WINDOW_S`: the collector's only memory (a restarted worker, whose count
    went down, starts over)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, deque[tuple[float, float]]] = {}

    def rate(self, worker: str, received: float) -> float | None:
        """Record ``received`` now; the rate over the window (None: not yet a span of
        :data:`RATE_MIN_SPAN_S`)."""
        now = self.clock()
        with self._lock:
            samples = self._seen.setdefault(worker, deque(maxlen=RATE_SAMPLES))
            if samples and received < samples[-1][1]:
                samples.clear()
            samples.append((now, received))
            while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_S:
                samples.popleft()
            t0, n0 = samples[0]
        if now - t0 < RATE_MIN_SPAN_S:
            return None
        return (received - n0) / (now - t0)


class _Families:
    """The families of one scrape, by short name (the prefix is added)."""

    def __init__(self) -> None:
        self.all: list[Metric] = []

    def gauge(self, name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
        self.all.append(family)
        return family

    def counter(self, name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
        self.all.append(family)
        return family


class FleetCollector:
    """A prometheus-client collector over a running server's context (register it in
    the app's own :class:`~prometheus_client.CollectorRegistry`)."""

    def __init__(self, ctx: ServerContext, figures: CachedFigures) -> None:
        self.ctx = ctx
        self.figures = figures
        self.rates = IngestRates()
        self._errors_lock = threading.Lock()
        self.errors: dict[str, int] = {}

    def describe(self) -> list[Metric]:
        """Nothing: the registry must not call :meth:`collect` at registration."""
        return []

    def _failed(self, source: str, exc: BaseException) -> None:
        with self._errors_lock:
            self.errors[source] = self.errors.get(source, 0) + 1
        log.warning("metrics: %s: %s: %s", source, type(exc).__name__, exc)

    def collect(self) -> Iterator[Metric]:
        """Every family, read now."""
        out = _Families()
        parts = self.ctx.health.check()
        self._parts(out, parts)
        self._ingest(out, parts)
        self._jobs(out, parts)
        self._retention(out, parts.get(RETENTION_PROBE))
        self._alerts(out, parts.get(ALERTS_PROBE))
        self._leader(out)
        self._database(out)
        errors = out.counter(
            "metrics_errors", "Sources /metrics could not read, by source.", ["source"]
        )
        with self._errors_lock:
            for source, n in sorted(self.errors.items()):
                errors.add_metric([source], n)
        yield from out.all

    def _parts(self, out: _Families, parts: Mapping[str, PartHealth]) -> None:
        up = out.gauge(
            "part_up",
            "1 while a part of the server (its health probe's name) says it works, else 0.",
            ["part"],
        )
        for name, part in parts.items():
            up.add_metric([name], 1.0 if part.ok else 0.0)

    def _ingest(self, out: _Families, parts: Mapping[str, PartHealth]) -> None:
        received = out.counter(
            "ingest_received_messages",
            "Messages an ingest worker took from the broker.",
            ["worker"],
        )
        records = out.counter(
            "ingest_records",
            "Records an ingest worker handled, by result: stored, duplicate, quarantined, "
            "gave_up (left unacknowledged for the broker to resend).",
            ["worker", "result"],
        )
        rate = out.gauge(
            "ingest_messages_per_second",
            f"Messages per second an ingest worker took, over the last {RATE_WINDOW_S:g} s "
            "of scrapes (rate() of the counter is the same over Prometheus' window).",
            ["worker"],
        )
        lag = out.gauge(
            "ingest_lag_seconds",
            "Receive to stored, of the oldest message of the worker's last batch.",
            ["worker"],
        )
        waiting = out.gauge(
            "ingest_oldest_wait_seconds",
            "How long the oldest message not yet stored has waited in the worker.",
            ["worker"],
        )
        queued = out.gauge(
            "ingest_queue_messages", "Messages queued in the worker, not yet stored.", ["worker"]
        )
        connected = out.gauge(
            "ingest_connected", "1 while the worker is connected to its broker.", ["worker"]
        )
        for name, part in parts.items():
            d = part.detail
            total = _num(d, "received")
            if not name.startswith(INGEST_PREFIX) or total is None:
                continue
            received.add_metric([name], total)
            for result, key in INGEST_RESULTS:
                n = _num(d, key)
                if n is not None:
                    records.add_metric([name, result], n)
            per_s = self.rates.rate(name, total)
            if per_s is not None:
                rate.add_metric([name], per_s)
            for family, key in (
                (lag, "last_lag_s"),
                (waiting, "oldest_wait_s"),
                (queued, "queue"),
            ):
                value = _num(d, key)
                if value is not None:
                    family.add_metric([name], value)
            connected.add_metric([name], 1.0 if d.get("connected") else 0.0)

    def _jobs(self, out: _Families, parts: Mapping[str, PartHealth]) -> None:
        published = out.counter(
            "rollout_directives_published",
            "Directives the rollout service published (acknowledged by the broker).",
        )
        publish_failures = out.counter(
            "rollout_publish_failures", "Directives the rollout service failed to publish."
        )
        rollouts = parts.get(ROLLOUTS_PROBE)
        if rollouts is not None:
            d = rollouts.detail
            pub = d.get("publisher")
            source: Mapping[str, Any] = pub if isinstance(pub, Mapping) else d
            for family, key in ((published, "published"), (publish_failures, "publish_failures")):
                value = _num(source, key)
                if value is not None:
                    family.add_metric([], value)
        events = out.counter(
            "rollout_reconciler_events",
            "The rollout service's counts, by event: ticks (loop passes), conflicts (another "
            "replica saved first), fenced (a save or publish refused: no longer the leader), "
            "command_errors, tick_errors.",
            ["event"],
        )
        stats = rollouts.detail.get("stats") if rollouts is not None else None
        if isinstance(stats, Mapping):
            for event in RECONCILER_EVENTS:
                value = _num(stats, event)
                if value is not None:
                    events.add_metric([event], value)
        drift_runs = out.counter("drift_runs", "Runs of the drift job.")
        drift_failures = out.counter("drift_failures", "Runs of the drift job that failed.")
        drift_raised = out.counter("drift_alerts_raised", "Drift alerts the drift job raised.")
        drift = parts.get(DRIFT_PROBE)
        if drift is not None:
            for family, key in (
                (drift_runs, "runs"),
                (drift_failures, "failures"),
                (drift_raised, "raised"),
            ):
                value = _num(drift.detail, key)
                if value is not None:
                    family.add_metric([], value)
        requests = out.counter(
            "bundle_requests", "Bundle fetch requests the file server answered.", ["part"]
        )
        chunks = out.counter("bundle_chunks", "Bundle chunks the file server sent.", ["part"])
        for name, part in parts.items():
            if not name.startswith(FILES_PREFIX):
                continue
            for family, key in ((requests, "requests"), (chunks, "chunks")):
                value = _num(part.detail, key)
                if value is not None:
                    family.add_metric([name], value)

    def _retention(self, out: _Families, part: PartHealth | None) -> None:
        runs = out.counter("retention_runs", "Retention passes run by this replica.")
        failures = out.counter(
            "retention_failures", "Retention passes that failed or stopped on an error."
        )
        deleted = out.counter(
            "retention_deleted_rows", "Rows retention deleted, by table.", ["table"]
        )
        last_run = out.gauge(
            "retention_last_run_timestamp_seconds", "When the last retention pass began."
        )
        last_duration = out.gauge(
            "retention_last_duration_seconds", "How long the last retention pass took."
        )
        if part is None:
            return
        d = part.detail
        for family, key in (
            (runs, "runs"),
            (failures, "failures"),
            (last_run, "last_run_at"),
            (last_duration, "last_duration_s"),
        ):
            value = _num(d, key)
            if value is not None:
                family.add_metric([], value)
        tables = d.get("deleted")
        if isinstance(tables, Mapping):
            for table, rows in sorted(tables.items()):
                n = _num(tables, table)
                if n is not None:
                    deleted.add_metric([str(table)], n)
                else:
                    self._failed("retention", TypeError(f"deleted[{table!r}] = {rows!r}"))

    def _alerts(self, out: _Families, part: PartHealth | None) -> None:
        firing = out.gauge(
            "alerts_firing",
            "Alerts firing now, by severity (counted every [alerts] interval_s on every replica).",
            ["severity"],
        )
        runs = out.counter("alert_evaluations", "Evaluations of the alert rules this replica ran.")
        failures = out.counter("alert_evaluation_failures", "Evaluations that failed.")
        deliveries = out.counter(
            "alert_deliveries",
            "Webhook tries this replica made, by result: sent (a 2xx), failed (to be tried "
            "again or given up), dead (given up: a dead letter).",
            ["result"],
        )
        if part is None:
            return
        d = part.detail
        counts = d.get("firing_by_severity")
        if isinstance(counts, Mapping):
            for severity in sorted(counts):
                n = _num(counts, severity)
                if n is not None:
                    firing.add_metric([str(severity)], n)
        for family, key in ((runs, "evaluations"), (failures, "evaluation_failures")):
            value = _num(d, key)
            if value is not None:
                family.add_metric([], value)
        for result, key in ALERT_DELIVERY_RESULTS:
            value = _num(d, key)
            if value is not None:
                deliveries.add_metric([result], value)

    def _leader(self, out: _Families) -> None:
        leader = out.gauge(
            "leader",
            "1 while this replica leads (runs the rollout reconciler, drift and retention).",
            ["replica"],
        )
        epoch = out.gauge(
            "leader_epoch",
            "The fencing epoch of this replica's lead (only while it leads).",
            ["replica"],
        )
        lead = self.ctx.leader
        try:
            replica = str(lead.replica_id)
            leading = lead.is_leader()
        except Exception as exc:  # noqa: BLE001 (a broken leadership is a metrics error, not a 500)
            self._failed("leader", exc)
            return
        leader.add_metric([replica], 1.0 if leading else 0.0)
        if not leading:
            return
        try:
            epoch.add_metric([replica], float(lead.check()))
        except NotLeader:
            pass  # lost the lead between the two questions: no epoch to show
        except Exception as exc:  # noqa: BLE001 (a broken leadership is a metrics error, not a 500)
            self._failed("leader", exc)

    def _database(self, out: _Families) -> None:
        devices = out.gauge(
            "devices", "Registered (not revoked) devices, by broker shard.", ["shard"]
        )
        online = out.gauge("devices_online", "Devices online, by broker shard.", ["shard"])
        rollouts = out.gauge(
            "rollouts", "Rollouts by phase (every known phase, 0 when none).", ["phase"]
        )
        quarantined = out.gauge(
            "quarantined_payloads",
            "Quarantined payloads kept in the database, by reason class: "
            + ", ".join(name for name, _ in REASON_CLASSES)
            + ", invalid.",
            ["reason"],
        )
        try:
            figures: DbFigures = self.figures.get()
        except FleetError as exc:
            self._failed("database", exc)
            return
        for shard in sorted(figures.devices):
            devices.add_metric([shard], figures.devices[shard])
            online.add_metric([shard], figures.online.get(shard, 0))
        phases = {p.value: 0 for p in Phase} | figures.rollouts
        for phase in sorted(phases):
            rollouts.add_metric([phase], phases[phase])
        for reason in sorted(figures.quarantine):
            quarantined.add_metric([reason], figures.quarantine[reason])


__all__ = ["PREFIX", "FleetCollector", "IngestRates"]
