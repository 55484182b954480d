"""The running agent's side of bundle delivery: a retained directive arrives on the
device's topic, is applied (:func:`agent.directives.link.apply_directive`) with the
agent's own pipelines as the health probe, and the install report is published back
(retained) for the rollout controller."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import paho.mqtt.client as mqtt

from agent.directives.config import BundlesConfig
from agent.directives.host import RunningAgent
from agent.directives.link import Report, apply_directive, make_client
from agent.enrollment.identity import Identity
from agent.installer import Installer
from agent.installer.errors import InstallError
from agent.kernel.mqtt import MqttSession, SessionOptions
from agent.update.fetchers import MqttFetcher
from agent.uplink.session import fleet_session
from agent.wire import topics

log = logging.getLogger(__name__)


class AgentProbe:
    """Health of a bundle on trial in the running agent: the first call switches the
    pipelines to it (the installer's lock is held, so the trial slot resolves); every
    call reads worker restarts, inference errors and inference p95 of its models."""

    def __init__(self, agent: RunningAgent, bundle: str) -> None:
        self.agent = agent
        self.bundle = bundle
        self._started = False

    def __call__(self) -> Mapping[str, float]:
        if not self._started:
            self._started = True
            self.agent.reload()
        return self.agent.bundle_health(self.bundle)


class DirectivesService:
    """Subscribes to the device's directive topic; applies the newest directive on a
    thread of its own (never on the hot path); publishes each report."""

    def __init__(
        self,
        agent: RunningAgent,
        cfg: BundlesConfig,
        installer: Installer,
        *,
        hardware_class: str,
        identity: Identity | None = None,
        on_report: Callable[[Report], None] | None = None,
        session: MqttSession | None = None,
    ) -> None:
        self.agent = agent
        self.cfg = cfg
        self.installer = installer
        self.hw = hardware_class
        self.identity = identity
        self.on_report = on_report
        self.device_id = agent.device_id
        self.state_dir: Path = agent.state_dir
        self.reports: list[Report] = []
        self._pending: bytes | None = None
        self._cleared = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Enrolled: the device's one fleet session (the uplink's, when it runs; else one
        # of our own). Not enrolled: [bundles] mqtt, a plain broker (development, tests).
        self._owns_session = session is None
        if session is None and identity is not None:
            session = fleet_session(identity, will=False)
        elif session is None:
            m = cfg.mqtt
            session = MqttSession(
                "directives",
                SessionOptions(
                    host=m.host,
                    port=m.port,
                    client_id=f"{m.client_id_prefix}-{self.device_id}-updates",
                    keepalive_s=m.keepalive_s,
                    username=m.username,
                    password=m.password(),
                ),
            )
        self.session = session
        self.guard = session.guard
        self._topic = topics.directive(self.device_id)
        # One fetcher for the service's life: the remote actions service refreshes the
        # same trusted metadata through it (a session holds one subscription a topic).
        self.fetcher = MqttFetcher.on_session(
            session, device_id=self.device_id, timeout_s=cfg.fetch_timeout_s
        )

    def start(self) -> None:
        self.session.subscribe(self._topic, self._on_message, qos=1)
        if self._owns_session:
            self.session.start()
        self._thread = threading.Thread(target=self._loop, name="fleet-updates", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.session.unsubscribe([self._topic])
        self.fetcher.close()
        if self._owns_session:
            self.session.stop(timeout_s)

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:  # the fleet cleared the retained directive
            log.info("directive cleared on %s", msg.topic)
            with self._lock:
                self._cleared, self._pending = True, None
            self._wake.set()
            return
        with self._lock:
            self._pending = bytes(msg.payload)  # only the newest directive matters
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            with self._lock:
                directive, self._pending = self._pending, None
                cleared, self._cleared = self._cleared, False
            if cleared and not self._stop.is_set():
                self._end_shadows()
            if directive is None or self._stop.is_set():
                continue
            try:
                report = self.apply(directive)
            except Exception as e:  # the update thread must outlive a bug: log, report
                log.exception("applying a directive failed")
                report = {"outcome": "failed", "step": "internal", "reason": str(e)}
            self.reports.append(report)
            if self.on_report is not None:
                self.on_report(report)
            delivery = self.session.publish(
                topics.install_state(self.device_id), json.dumps(report), qos=1, retain=True
            )
            if not delivery.queued:
                log.error("install report not sent: %s", mqtt.error_string(delivery.rc))

    def _end_shadows(self) -> None:
        """The fleet cleared the directive (it reverts a device that ran no signed bundle
        before): no candidate runs without a directive naming it, so every shadow slot is
        emptied. Nothing that acts changes; the report (outcome ``removed``) tells the
        companion, which republishes the state."""
        for d in sorted(p for p in self.installer.root.glob("*") if p.is_dir()):
            try:
                removed = self.installer.clear_shadow(d.name)
            except InstallError as e:
                log.error("the shadow slot of %s was not emptied: %s", d.name, e.reason)  # noqa: TRY400
                continue
            if removed is None:
                continue
            log.info("directive cleared: shadow %s release %d removed", d.name, removed.release)
            report: Report = {
                "outcome": "removed",
                "mode": "shadow",
                "step": "shadow",
                "bundle": d.name,
                "release": removed.release,
                "version": removed.version,
                "reason": "the fleet cleared the directive",
            }
            self.reports.append(report)
            if self.on_report is not None:
                self.on_report(report)
        self.agent.reload_if_changed()

    def apply(self, directive: bytes) -> Report:
        # Fetches go through the directives' session: one connection to the broker.
        self.fetcher.start()
        client = make_client(
            self.cfg, self.state_dir, self.fetcher, device_id=self.device_id, hw=self.hw
        )
        report = apply_directive(
            client,
            self.installer,
            directive,
            staging_root=self.state_dir / "staging",
            source="mqtt",
            probe_factory=lambda name: AgentProbe(self.agent, name),
        )
        report["stale"] = client.stale
        # Committed: the trial slot is now the committed one. Failed: back to the old.
        self.agent.reload_if_changed()
        log.info("directive: %s", report)
        return report
