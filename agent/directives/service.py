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
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.directives.config import BundlesConfig
from agent.directives.host import RunningAgent
from agent.directives.link import Report, apply_directive, make_client
from agent.enrollment.identity import Identity
from agent.installer import Installer
from agent.kernel.clientid import secret_client_id
from agent.kernel.mqttguard import MqttGuard
from agent.update.fetchers import MqttFetcher
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
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        m = cfg.mqtt
        client_id = f"{m.client_id_prefix}-{self.device_id}-updates"
        if identity is not None:  # on the fleet broker: an id no other device can guess
            client_id = secret_client_id(client_id, identity.key_path)
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        if identity is not None:  # enrolled: the fleet broker with the device's certificate
            identity.tls_configure(self._client)
        elif m.username:
            self._client.username_pw_set(m.username, m.password())
        self.guard = MqttGuard("update link")
        self._client.on_connect = self.guard.wrap("on_connect", self._on_connect)
        self._client.on_message = self.guard.wrap("on_message", self._on_message)
        self._client.reconnect_delay_set(1, 10)

    def _broker(self) -> tuple[str, int]:
        if self.identity is not None:
            return self.identity.broker_host, self.identity.broker_port
        return self.cfg.mqtt.host, self.cfg.mqtt.port

    def start(self) -> None:
        host, port = self._broker()
        self.guard.start(
            self._client,
            lambda: self._client.connect_async(host, port, keepalive=self.cfg.mqtt.keepalive_s),
        )
        self._thread = threading.Thread(target=self._loop, name="fleet-updates", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.guard.stop()
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(
        self, client: mqtt.Client, _u: Any, _f: Any, rc: ReasonCode, _p: Properties | None
    ) -> None:
        if rc.is_failure:
            log.error("fleet broker refused the connection: %s", rc)
            return
        client.subscribe(topics.directive(self.device_id), qos=1)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:  # the fleet cleared the retained directive: nothing to do
            log.info("directive cleared on %s", msg.topic)
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
            self._client.publish(
                topics.install_state(self.device_id), json.dumps(report), qos=1, retain=True
            )

    def apply(self, directive: bytes) -> Report:
        if self.identity is not None:
            host, port = self._broker()
            fetcher = MqttFetcher(
                host,
                port,
                device_id=self.device_id,
                timeout_s=self.cfg.fetch_timeout_s,
                tls_ca=self.identity.ca_path,
                tls_cert=self.identity.cert_path,
                tls_key=self.identity.key_path,
            )
        else:
            fetcher = MqttFetcher.from_config(
                self.cfg.mqtt, device_id=self.device_id, timeout_s=self.cfg.fetch_timeout_s
            )
        fetcher.start()
        try:
            client = make_client(
                self.cfg, self.state_dir, fetcher, device_id=self.device_id, hw=self.hw
            )
            report = apply_directive(
                client,
                self.installer,
                directive,
                staging_root=self.state_dir / "staging",
                source="mqtt",
                probe_factory=lambda name: AgentProbe(self.agent, name),
            )
        finally:
            fetcher.close()
        report["stale"] = client.stale
        # Committed: the trial slot is now the committed one. Failed: back to the old.
        self.agent.reload_if_changed()
        log.info("directive: %s", report)
        return report
