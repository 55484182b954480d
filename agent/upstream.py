"""The agent's side toward the fleet: the uplink (state, health, decisions and events
through the outbox) with the enrolled identity, the directives service (signed bundles,
with the running agent as the health probe), the install reports it hands the uplink, the
remote actions service (the fleet's signed requests for logs, a restart, a reload or
diagnostics: :mod:`agent.remote.service`), and alarms of the agent's parts reported as
rate-limited ``alarm`` events.

Nothing here is on the hot path; a part that can't start is a problem on /healthz and the
rest of the agent runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.config import AgentConfig
from agent.decisionlog import DecisionLog
from agent.directives.host import RunningAgent
from agent.directives.report import configured_bundles, reported_state
from agent.directives.service import DirectivesService
from agent.enrollment.identity import Identity
from agent.installer import Installer
from agent.kernel.errors import EdgefleetError
from agent.livelatency import LoadSource
from agent.metrics import AgentMetrics
from agent.planning import Problem
from agent.remote.service import ActionsService, Controls
from agent.uplink.service import Uplink
from agent.uplink.sysinfo import SysInfo

log = logging.getLogger(__name__)

ALARM_EVENT_INTERVAL_S = 60.0
"""An alarm of one kind reaches the fleet as an event at most this often (a full disk
raises one per failed write)."""


class Upstream:
    """The uplink and the directives service of one agent, built from its config at
    :meth:`start`; either is None when it is off or could not start."""

    def __init__(
        self, config: AgentConfig, *, metrics: AgentMetrics, problems: list[Problem]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.problems = problems
        self.identity: Identity | None = None
        self.uplink: Uplink | None = None
        self.updates: DirectivesService | None = None
        self.remote: ActionsService | None = None
        self._own_fetcher: Any = None
        self._alarm_lock = threading.Lock()
        self._alarm_sent: dict[str, tuple[float | None, int]] = {}

    def start(
        self,
        agent: RunningAgent,
        *,
        decision_log: DecisionLog,
        installer: Installer | None,
        profile_name: str,
        health: Callable[[], dict[str, Any]],
        worker_pids: Callable[[], list[int]],
        load: LoadSource | None = None,
        controls: Controls | None = None,
    ) -> None:
        """Start the uplink, then (with ``[bundles]`` enabled and an installer) the
        directives service, then (with ``controls`` and ``[remote]`` enabled) the remote
        actions service on the same session."""
        self._start_uplink(
            decision_log=decision_log,
            installer=installer,
            profile_name=profile_name,
            health=health,
            worker_pids=worker_pids,
            load=load,
        )
        if self.config.bundles.enabled and installer is not None:
            bundles = self.config.bundles
            self.updates = DirectivesService(
                agent,
                bundles,
                installer,
                hardware_class=bundles.hardware_class or profile_name,
                identity=self.identity,
                on_report=self._install_report,
                # one connection to the fleet broker: the uplink's session, when it runs
                session=self.uplink.session if self.uplink is not None else None,
            )
            self.updates.start()
        if controls is not None and self.config.remote.enabled:
            self._start_remote(controls, profile_name)

    def _start_remote(self, controls: Controls, profile_name: str) -> None:
        """The remote actions service on the device's fleet session (or the directives'
        plain broker when not enrolled), verifying with the bundles' trust root."""
        from agent.directives.link import make_client  # noqa: PLC0415 - only with remote actions
        from agent.update.fetchers import MqttFetcher  # noqa: PLC0415

        session = (
            self.uplink.session
            if self.uplink is not None
            else self.updates.session
            if self.updates is not None
            else None
        )
        if session is None:
            log.info("remote actions: no fleet session (not enrolled, no [bundles])")
            return
        bundles = self.config.bundles
        fetcher = (
            self.updates.fetcher
            if self.updates is not None
            else MqttFetcher.on_session(
                session, device_id=self.config.agent.device_id, timeout_s=bundles.fetch_timeout_s
            )
        )
        try:
            client = make_client(
                bundles,
                self.config.agent.state_dir,
                fetcher,
                device_id=self.config.agent.device_id,
                hw=bundles.hardware_class or profile_name,
            )
            self.remote = ActionsService(
                self.config, session=session, client=client, controls=controls
            )
        except EdgefleetError as e:
            self.problems.append(Problem("remote", f"remote actions off: {e}"))
            return
        self._own_fetcher = None if self.updates is not None else fetcher
        self.remote.start()

    def _start_uplink(
        self,
        *,
        decision_log: DecisionLog,
        installer: Installer | None,
        profile_name: str,
        health: Callable[[], dict[str, Any]],
        worker_pids: Callable[[], list[int]],
        load: LoadSource | None,
    ) -> None:
        """Report to the fleet with the enrolled identity (TLS); without one, say so."""
        cfg = self.config.uplink
        state_dir = self.config.agent.state_dir
        try:
            self.identity = Identity.load(state_dir, cfg.identity_dir)
        except EdgefleetError as e:
            self.problems.append(Problem("uplink", f"{e} (enroll again: edge-agent enroll)"))
            return
        if not cfg.enabled:
            return
        if self.identity is None:
            self.problems.append(Problem("uplink", "not enrolled: run edge-agent enroll"))
            return
        labels = dict(self.identity.labels)
        configured = configured_bundles(self.config)
        try:
            self.uplink = Uplink(
                self.config.agent.device_id,
                self.identity,
                cfg,
                state=lambda: reported_state(profile_name, installer, labels, configured),
                health=health,
                decision_log=decision_log,
                sysinfo=SysInfo(
                    state_dir, pids=worker_pids, budget_mb=self.config.agent.disk_budget_mb
                ),
                state_dir=state_dir,
                on_alarm=self.count_alarm,
                load=load,
            )
        except EdgefleetError as e:
            self.problems.append(Problem("uplink", str(e)))
            return
        self.uplink.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        if self.remote is not None:
            self.remote.stop(timeout_s=timeout_s)
            if self._own_fetcher is not None:
                self._own_fetcher.close()
        if self.updates is not None:
            self.updates.stop(timeout_s=timeout_s)
        if self.uplink is not None:
            self.uplink.stop(timeout_s=timeout_s)

    def _install_report(self, report: dict[str, Any]) -> None:
        if self.uplink is not None:
            try:
                self.uplink.event("install", report)
                self.uplink.publish_state()
            except EdgefleetError as e:
                log.warning("install report not sent: %s", e)

    def alarm(self, kind: str, message: str) -> None:
        """An alarm of a part (the decision log): counted, logged, and reported to the
        fleet as an ``alarm`` event through the outbox (in order, also when offline), at
        most one per kind every :data:`ALARM_EVENT_INTERVAL_S`; the next one says how
        many were folded into it (``repeated``)."""
        self.count_alarm(kind, message)
        log.error("alarm %s: %s", kind, message)
        uplink = self.uplink
        if uplink is None:
            return
        now = time.monotonic()
        with self._alarm_lock:
            last, folded = self._alarm_sent.get(kind, (None, 0))
            if last is not None and now - last < ALARM_EVENT_INTERVAL_S:
                self._alarm_sent[kind] = (last, folded + 1)
                return
            self._alarm_sent[kind] = (now, 0)
        try:
            uplink.event("alarm", {"alarm": kind, "message": message, "repeated": folded})
        except EdgefleetError as e:
            log.error("alarm %s not queued for the fleet: %s", kind, e)  # noqa: TRY400

    def count_alarm(self, kind: str, _message: str) -> None:
        self.metrics.alarms.labels(kind=kind).inc()
