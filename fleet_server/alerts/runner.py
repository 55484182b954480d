"""The alerts in ``fleet-server serve``: evaluation and delivery on the leader, the
console's badge on every replica.

:class:`Evaluator` is one evaluation: read the facts, judge the rules, compare with the
open alerts, write what fires and resolves (fenced by the leader's epoch).
:class:`AlertRunner` is the service: its ``alerts`` thread evaluates every ``[alerts]
interval_s`` while this replica leads and refreshes the firing counts the console's
badge shows on every replica; its ``alert-delivery`` thread sends the due deliveries
every ``[alerts.delivery] poll_s`` while this replica leads. A failed pass is logged and
counted; the loops go on. The health probe ``alerts`` carries the figures.

The server refuses to start when a webhook's secret is missing or short (as for the
metrics token): a typo must not silently drop every alert.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from fleet_server.alerts import store
from fleet_server.alerts.board import AlertBoard
from fleet_server.alerts.config import AlertsSection
from fleet_server.alerts.delivery import Deliverer
from fleet_server.alerts.facts import CertCache, Sources, gather
from fleet_server.alerts.rules import RoleFact, changes, evaluate
from fleet_server.alerts.secrets import secrets_of
from fleet_server.alerts.webhook import routes
from fleet_server.cluster import Leadership, NotLeader
from fleet_server.db.cluster import EpochMismatch
from fleet_server.errors import FleetError
from fleet_server.health import PartHealth

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from fleet_server.api.context import ServerContext
    from fleet_server.config import FleetServerConfig
    from fleet_server.repository import Repository

log = logging.getLogger(__name__)

PROBE = "alerts"
JOIN_S = 15.0
TUF_ROLES = ("root", "targets", "snapshot", "timestamp")


def server_cert_files(config: FleetServerConfig, ca_cert: Path) -> dict[str, Path]:
    """The server's certificate files by name: the fleet CA, each managed broker's
    server certificate, the server's MQTT identities, a configured external one."""
    files = {"fleet CA": ca_cert}
    b = config.broker
    if b.managed:
        for name, mosquitto in config.shard_mosquitto_configs().items():
            files[f"broker {name}"] = Path(mosquitto.certfile)
        identity = config.identity_dir
        if identity.is_dir():
            for path in sorted(identity.glob("*.crt")):
                files[f"identity {path.stem}"] = path
    else:
        if b.external is not None:
            files["mqtt client main"] = Path(b.external.cert)
        for shard in b.shards:
            if shard.external is not None:
                files[f"mqtt client {shard.name}"] = Path(shard.external.cert)
    return files


def repository_roles(repo: Repository) -> list[RoleFact]:
    """The four top-level roles' versions and expiries (none before ``repo init``)."""
    if not repo.initialized():
        return []
    signed = {
        "root": repo.root().signed,
        "timestamp": repo.timestamp().signed,
        "snapshot": repo.snapshot().signed,
        "targets": repo.targets().signed,
    }
    return [
        RoleFact(
            role,
            int(signed[role].version),
            signed[role].expires.timestamp(),
            repo.expiries.of(role).total_seconds(),
        )
        for role in TUF_ROLES
    ]


@dataclass
class EvalStats:
    """Counts since start."""

    runs: int = 0
    failures: int = 0
    skipped: int = 0
    fenced: int = 0
    fired: int = 0
    resolved: int = 0
    last_run_at: float | None = None
    last_duration_s: float | None = None
    last_cpu_s: float | None = None
    last_error: str | None = None


class Evaluator:
    """One evaluation of the rules (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        section: AlertsSection,
        leader: Leadership,
        sources: Sources,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.section = section
        self.leader = leader
        self.sources = sources
        self.clock = clock
        self.route = routes(section)
        self.cache = CertCache()
        self.next_slow = 0.0
        self.stats = EvalStats()

    def run_once(self) -> store.Applied | None:
        """Evaluate now if this replica leads (None when it does not, or was fenced).

        Raises:
            StorageError: the database failed (nothing was written).
        """
        try:
            epoch = self.leader.check()
        except NotLeader:
            self.stats.skipped += 1
            return None
        began, cpu = time.monotonic(), time.process_time()
        now = self.clock()
        slow = now >= self.next_slow
        facts = gather(self.engine, self.section.rules, now, slow=slow, sources=self.sources,
                       cache=self.cache)  # fmt: skip
        found = changes(evaluate(self.section.rules, facts), store.open_alerts(self.engine))
        try:
            applied = store.apply(self.engine, found, self.route, epoch=epoch, now=now)
        except EpochMismatch as exc:
            self.stats.fenced += 1
            log.info("alerts: not written (%s)", exc)
            return None
        if slow:
            self.next_slow = now + self.section.slow_interval_s
        s = self.stats
        s.runs += 1
        s.fired += len(applied.fired)
        s.resolved += len(applied.resolved)
        s.last_run_at = now
        s.last_duration_s = time.monotonic() - began
        s.last_cpu_s = time.process_time() - cpu
        for c in found.fire:
            log.warning("alert firing: %s %s: %s", c.rule, c.key, c.summary)
        for a in found.resolve:
            log.info("alert resolved: %s %s (alert %d)", a.rule, a.key, a.alert_id)
        return applied


class AlertRunner:
    """The alerts service of ``fleet-server serve`` (see the module docstring); attaches
    its :class:`AlertBoard` as ``ctx.alerts``."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.section: AlertsSection = ctx.config.alerts
        self.board = AlertBoard()
        sources = Sources(
            issued=lambda serial: ctx.ca.issued(serial).not_after,
            server_certs=lambda: server_cert_files(ctx.config, ctx.ca.cert_path),
            roles=lambda: repository_roles(ctx.repository),
        )
        self.evaluator = Evaluator(ctx.engine, self.section, ctx.leader, sources)
        self.deliverer: Deliverer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.board_failures = 0
        self.delivery_failures = 0

    def start(self) -> None:
        """Read the webhooks' secrets, then start the loops.

        Raises:
            FleetError: a webhook's secret is missing or too short.
        """
        self.deliverer = Deliverer(self.ctx.engine, self.section, secrets_of(self.section))
        self.ctx.alerts = self.board
        self.ctx.health.register(PROBE, self.health)
        if not self.section.enabled:
            log.info("alerts: disabled ([alerts] enabled = false)")
            return
        for name, target in (
            ("alerts", self._evaluate_loop),
            ("alert-delivery", self._deliver_loop),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(JOIN_S)
            if thread.is_alive():
                log.error("alerts: thread %s still running %.0f s after stop", thread.name, JOIN_S)
        self.ctx.health.unregister(PROBE)
        self.ctx.alerts = None

    def evaluate_once(self) -> store.Applied | None:
        """One evaluation and a refresh of the badge; a failure is logged and counted."""
        applied = None
        try:
            applied = self.evaluator.run_once()
        except (SQLAlchemyError, FleetError) as exc:
            self.evaluator.stats.failures += 1
            self.evaluator.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("alerts: evaluation failed")
        self.refresh_board()
        return applied

    def refresh_board(self) -> None:
        try:
            self.board.set(store.firing_counts(self.ctx.engine), time.time())
        except SQLAlchemyError:
            self.board_failures += 1
            log.exception("alerts: reading the firing counts failed")

    def _evaluate_loop(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            began = time.monotonic()
            self.evaluate_once()
            wait = max(0.0, self.section.interval_s - (time.monotonic() - began))

    def _going_on(self) -> bool:
        return not self._stop.is_set() and self.ctx.leader.is_leader()

    def _deliver_loop(self) -> None:
        deliverer = self.deliverer
        assert deliverer is not None  # noqa: S101 (started in start())
        while not self._stop.wait(self.section.delivery.poll_s):
            if not self.ctx.leader.is_leader():
                continue
            try:
                while deliverer.run_once(self._going_on) >= self.section.delivery.batch:
                    pass  # a full batch: more may be due
            except (SQLAlchemyError, FleetError):
                self.delivery_failures += 1
                log.exception("alerts: delivery pass failed")

    def detail(self) -> dict[str, Any]:
        """The probe's figures."""
        s = self.evaluator.stats
        d = self.deliverer.stats if self.deliverer is not None else None
        total, worst = self.board.badge()
        return {
            "leader": self.ctx.leader.is_leader(),
            "firing": total,
            "firing_by_severity": self.board.counts(),
            "worst": worst,
            "evaluations": s.runs,
            "evaluation_failures": s.failures,
            "skipped_not_leader": s.skipped,
            "fenced": s.fenced,
            "fired": s.fired,
            "resolved": s.resolved,
            "last_run_at": s.last_run_at,
            "last_duration_s": s.last_duration_s,
            "last_cpu_s": s.last_cpu_s,
            "last_error": s.last_error,
            "certificates_read": self.evaluator.cache.reads,
            "delivered": 0 if d is None else d.sent,
            "delivery_failed_tries": 0 if d is None else d.failed_tries,
            "dead_letters": 0 if d is None else d.dead,
            "delivery_failures": self.delivery_failures,
            "webhooks": {} if d is None else dict(d.by_webhook),
        }

    def health(self) -> PartHealth:
        """OK while the loops run (a failed pass is in the detail, not a failed part)."""
        dead = [t.name for t in self._threads if not t.is_alive()]
        ok = not dead or self._stop.is_set()
        detail = self.detail()
        if dead:
            detail["dead_threads"] = dead
        return PartHealth(ok, detail)


__all__ = [
    "PROBE",
    "AlertBoard",
    "AlertRunner",
    "Evaluator",
    "repository_roles",
    "server_cert_files",
]
