"""The companion's remote actions: the fleet's signed requests arrive retained on the
device's request topic, are verified (:mod:`agent.remote.request`: the director's
signature through the repository's trusted metadata, refreshed first), judged
(:mod:`agent.remote.counter`: counter, expiry, replay), carried out on a thread of their
own, and answered (:mod:`agent.remote.upload`).

- ``logs``: the newest lines of the agent's log (:mod:`agent.remote.logread`), secrets
  taken out (:mod:`agent.remote.redact`), within ``[remote]`` max_lines, max_bytes_kb and
  rate_kb_s; with ``follow_s``, new lines for that long;
- ``diagnostics``: the archive of :mod:`agent.remote.diagnostics`;
- ``restart``: the agent's processes, by the supervisor (under systemd, the unit);
- ``reload``: the configuration file read and checked here first (a file that does not
  load is answered ``failed`` and nothing changes), then the hot path and companion
  restarted with it by the supervisor.

A restart or reload is answered ``accepted`` before it happens and ``ok`` by the
companion that starts after it (a marker in ``<state_dir>/remote/pending.json`` says
what was asked and what ran before). Nothing here runs on the hot path.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from agent.errors import AgentError
from agent.kernel.durable import write_durable
from agent.kernel.errors import EdgefleetError
from agent.kernel.mqtt import MqttSession
from agent.remote.counter import REFUSE, SILENT, Handled, HandledCounter, decide
from agent.remote.diagnostics import Sources, build
from agent.remote.logread import LogQuery, LogReadError, LogSource, source_for
from agent.remote.redact import Redactor
from agent.remote.request import ActionRequest, claimed_request_id, verify_action
from agent.remote.upload import Publish, TokenBucket, Upload, UploadFailed, session_publisher
from agent.update.client import BundleClient
from agent.update.errors import DirectiveRefused, UpdateError
from agent.wire import topics
from agent.wire.actions import (
    ACTION_DIAGNOSTICS,
    ACTION_LOGS,
    ACTION_RELOAD,
    ACTION_RESTART,
    STATUS_ACCEPTED,
    STATUS_FAILED,
    STATUS_OK,
    STATUS_REFUSED,
    STATUS_RUNNING,
)

log = logging.getLogger(__name__)

PENDING_FILE = Path("remote") / "pending.json"
"""Under the state directory: the restart or reload asked for, answered after it."""
FOLLOW_POLL_S = 1.0


@dataclass
class Controls:
    """What the actions service needs of the agent it runs in.

    Attributes:
        health, ready, hello: the companion's health, the hot path's readiness, and the
            hot path's process (pid, boot, starts).
        restart: ask the supervisor to restart the agent's processes (None: not
            possible here, e.g. ``--single-process``).
        reload: ask the supervisor to restart the hot path and companion with the
            configuration file (None: not possible here).
        config_path: the configuration file (a reload reads and checks it first).
        config_digest: the digest of the configuration running now.
    """

    health: Callable[[], Any]
    ready: Callable[[], Any]
    hello: Callable[[], Any]
    restart: Callable[[], None] | None = None
    reload: Callable[[], None] | None = None
    config_path: Path | None = None
    config_digest: str = ""


@dataclass
class RemoteStats:
    """Counters of the service (``/healthz`` shows them)."""

    received: int = 0
    carried_out: int = 0
    refused: int = 0
    failed: int = 0
    busy: int = 0
    bytes_sent: int = 0
    last: dict[str, Any] = field(default_factory=dict)


class ActionsService:
    """Verifies, carries out and answers the fleet's action requests (see the module).

    Args:
        config: the agent's configuration (``[remote]``, ``[logs]``, the state directory).
        session: the device's fleet session (or the plain broker of ``[bundles] mqtt``).
        client: the update client whose trusted metadata verifies requests.
        controls: what it asks of the agent.
        publish: how an answer is sent (default: QoS 1 on ``session``, acknowledged).
        logs: where the log is read (default: :func:`agent.remote.logread.source_for`).
    """

    def __init__(
        self,
        config: Any,
        *,
        session: MqttSession,
        client: BundleClient,
        controls: Controls,
        publish: Publish | None = None,
        logs: LogSource | None = None,
    ) -> None:
        self.config = config
        self.cfg = config.remote
        self.device_id: str = config.agent.device_id
        self.state_dir = Path(config.agent.state_dir)
        self.session = session
        self.client = client
        self.controls = controls
        self.counter = HandledCounter(client.trust_dir)
        self.logs = logs or source_for(config.remote, config.logs, self.state_dir)
        self.stats = RemoteStats()
        self._stop = threading.Event()
        self._publish = publish or session_publisher(session, self._stop)
        self._queue: queue.Queue[tuple[bytes, bool]] = queue.Queue(maxsize=self.cfg.queue)
        self._bucket = TokenBucket(self.cfg.rate_kb_s * 1024, self.cfg.chunk_kb * 1024)
        self._thread: threading.Thread | None = None
        self._topic = topics.action_request(self.device_id)

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self.session.subscribe(self._topic, self._on_message, qos=1)
        self._thread = threading.Thread(target=self._loop, name="remote-actions", daemon=True)
        self._thread.start()
        log.info("remote actions: listening on %s (the log is read from the %s)",
                 self._topic, self.logs.name)  # fmt: skip

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self.session.unsubscribe([self._topic])
        if self._thread is not None:
            self._thread.join(timeout_s)

    def health(self) -> dict[str, Any]:
        """The counters and the last request's outcome."""
        s = self.stats
        return {
            "received": s.received,
            "carried_out": s.carried_out,
            "refused": s.refused,
            "failed": s.failed,
            "busy": s.busy,
            "bytes_sent": s.bytes_sent,
            "log_source": self.logs.name,
            "last": dict(s.last),
            "thread_alive": self._thread is not None and self._thread.is_alive(),
        }

    # -- the network thread -------------------------------------------------------------
    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:  # the fleet cleared an answered request
            return
        self.stats.received += 1
        payload = bytes(msg.payload)
        try:
            self._queue.put_nowait((payload, bool(msg.retain)))
        except queue.Full:
            self.stats.busy += 1
            request_id = claimed_request_id(payload)
            why = f"busy: {self.cfg.queue} requests wait already"
            log.warning("action request %s refused: %s", request_id, why)
            up = self._upload(request_id, "", None)
            up.publish = self._publish_nowait  # never wait on the network thread
            up.answer(STATUS_REFUSED, why)

    def _publish_nowait(self, topic: str, payload: bytes) -> None:
        self.session.publish(topic, payload, qos=1)

    # -- the service's thread -------------------------------------------------------------
    def _loop(self) -> None:
        pending_done = False
        while not self._stop.is_set():
            if not pending_done:
                pending_done = self._answer_pending()
            try:
                payload, retained = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.handle(payload, retained=retained)
            except Exception:  # the thread outlives a bug: log, count, answer
                self.stats.failed += 1
                log.exception("an action request failed")

    def _upload(self, request_id: str, action: str, counter: int | None) -> Upload:
        return Upload(
            publish=self._publish,
            device_id=self.device_id,
            request_id=request_id,
            action=action,
            counter=counter,
            chunk_bytes=self.cfg.chunk_kb * 1024,
            bucket=self._bucket,
            stop=self._stop,
        )

    def handle(self, payload: bytes, *, retained: bool = False) -> None:
        """Verify, judge, carry out and answer one request (a failure to send the answer
        is logged: the fleet shows the request unanswered until it expires)."""
        claimed = claimed_request_id(payload)
        up = self._upload(claimed, "", None)
        try:
            self._handle(payload, retained, up)
        except UploadFailed as exc:
            self.stats.failed += 1
            log.error("action request %s: an answer was not sent: %s", up.request_id, exc.reason)  # noqa: TRY400
        finally:
            self.stats.bytes_sent += up.sent_bytes

    def _refuse(self, up: Upload, reason: str) -> None:
        self.stats.refused += 1
        self.stats.last = {"request_id": up.request_id, "status": STATUS_REFUSED, "reason": reason}
        log.warning("action request %s refused: %s", up.request_id, reason)
        up.answer(STATUS_REFUSED, reason)

    def _fail(self, up: Upload, reason: str, **detail: Any) -> None:
        self.stats.failed += 1
        self.stats.last = {"request_id": up.request_id, "status": STATUS_FAILED, "reason": reason}
        log.error("action request %s (%s) failed: %s", up.request_id, up.action, reason)
        up.answer(STATUS_FAILED, reason, **detail)

    def _handle(self, payload: bytes, retained: bool, up: Upload) -> None:
        try:
            targets = self.client.trusted_targets()
        except UpdateError as exc:
            self._fail(up, f"cannot verify the request: {exc.step}: {exc.reason}")
            return
        try:
            req = verify_action(payload, targets, device_id=self.device_id)
        except DirectiveRefused as exc:
            self._refuse(up, exc.reason)
            return
        up.request_id, up.action, up.counter = req.request_id, req.action, req.counter
        decision = decide(
            req, self.counter.read(), retained=retained, now=self.client.time_floor.now()
        )
        if decision.record:
            try:
                self.counter.write(Handled(req.counter, req.digest))
            except OSError as exc:
                self._fail(up, f"cannot record the request's counter: {exc.strerror or exc}")
                return
        if decision.what == SILENT:
            log.debug("action request %s: the retained copy of the last handled", req.request_id)
            return
        if decision.what == REFUSE:
            self._refuse(up, decision.reason)
            return
        log.info("action request %s: %s %s", req.request_id, req.action, req.params)
        up.answer(STATUS_ACCEPTED, f"{req.action}: accepted", params=req.params)
        self.stats.carried_out += 1
        run = {
            ACTION_LOGS: self._logs,
            ACTION_DIAGNOSTICS: self._diagnostics,
            ACTION_RESTART: self._restart,
            ACTION_RELOAD: self._reload,
        }[req.action]
        run(req, up)

    # -- the actions ------------------------------------------------------------------
    def _logs(self, req: ActionRequest, up: Upload) -> None:
        p = req.params
        lines = min(int(p["lines"]), self.cfg.max_lines)
        query = LogQuery(since=time.time() - int(p["since_s"]), lines=lines, grep=str(p["grep"]))
        budget = self.cfg.max_bytes_kb * 1024
        redact = Redactor()
        try:
            entries = self.logs.tail(query)
        except LogReadError as exc:
            self._fail(up, f"the {self.logs.name} could not be read: {exc}")
            return
        sent, cut = up.text((redact(e.text) for e in entries), budget)
        follow_s = min(int(p["follow_s"]), self.cfg.max_follow_s)
        if follow_s and not cut:
            up.answer(STATUS_RUNNING, f"following new lines for {follow_s} s", lines=sent)
            end = time.monotonic() + follow_s
            while not cut and not self._stop.wait(FOLLOW_POLL_S) and time.monotonic() < end:
                try:
                    new = self.logs.follow(query)
                except LogReadError as exc:
                    self._fail(up, f"the {self.logs.name} could not be read: {exc}", lines=sent)
                    return
                more, cut = up.text((redact(e.text) for e in new), budget - up.sent_bytes)
                sent += more
        why = f"; the rest is over the {self.cfg.max_bytes_kb} KiB limit" if cut else ""
        self.stats.last = {"request_id": req.request_id, "status": STATUS_OK, "lines": sent}
        up.answer(
            STATUS_OK,
            f"{sent} lines ({up.sent_bytes} bytes) from the {self.logs.name}{why}",
            lines=sent,
            truncated=cut,
            source=self.logs.name,
            redacted=redact.replaced,
            follow_s=follow_s,
        )

    def _diagnostics(self, req: ActionRequest, up: Upload) -> None:
        c = self.config
        budget = self.cfg.max_bytes_kb * 1024
        redact = Redactor()
        sources = Sources(
            config=c.model_dump(mode="json"),
            health=self.controls.health,
            ready=self.controls.ready,
            hello=self.controls.hello,
            state_dir=self.state_dir,
            decision_log=self.state_dir / c.decision_log.path,
            disk_budget_mb=c.agent.disk_budget_mb,
            logs=self.logs,
            profile=str(c.agent.profile),
        )
        archive, manifest = build(
            sources,
            redact,
            log_lines=min(int(req.params["lines"]), self.cfg.max_lines),
            max_bytes=budget,
        )
        if len(archive) > budget:
            self._fail(up, f"the archive is {len(archive)} bytes, over the {budget} limit")
            return
        up.binary(archive)
        self.stats.last = {"request_id": req.request_id, "status": STATUS_OK}
        up.answer(
            STATUS_OK,
            f"diagnostics archive of {len(archive)} bytes, {len(manifest) + 1} files",
            files=manifest,
            redacted=redact.replaced,
        )

    def _pending_path(self) -> Path:
        return self.state_dir / PENDING_FILE

    def _mark(self, req: ActionRequest, **what: Any) -> None:
        path = self._pending_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"request_id": req.request_id, "action": req.action, "counter": req.counter,
                  "at": time.time(), **what}  # fmt: skip
        write_durable(path, json.dumps(record, default=str).encode())

    def _hello(self) -> dict[str, Any]:
        try:
            hello = self.controls.hello()
        except Exception as exc:  # noqa: BLE001 - said in the answer
            return {"error": str(exc)}
        return dict(hello) if isinstance(hello, dict) else {}

    def _restart(self, req: ActionRequest, up: Upload) -> None:
        if self.controls.restart is None:
            self._fail(up, "this agent can't restart itself (one process, no supervisor)")
            return
        self._handover(req, up, self.controls.restart, before=self._hello())

    def _reload(self, req: ActionRequest, up: Upload) -> None:
        from agent.config import load_config  # noqa: PLC0415 - the companion's own import

        path = self.controls.config_path
        if self.controls.reload is None or path is None:
            self._fail(up, "this agent can't reload (one process, no supervisor)")
            return
        try:
            new = load_config(path)
        except EdgefleetError as exc:
            self._fail(up, f"the configuration does not load; nothing changed: {exc}")
            return
        if new.agent.device_id != self.device_id:
            self._fail(
                up,
                f"{path} names device {new.agent.device_id!r}, this is {self.device_id!r}; "
                "nothing changed (a device id changes by enrolling again)",
            )
            return
        digest = new.digest()
        self._handover(
            req, up, self.controls.reload, before=self._hello(),
            config_before=self.controls.config_digest, config_after=digest,
        )  # fmt: skip

    def _handover(
        self, req: ActionRequest, up: Upload, ask: Callable[[], None], **what: Any
    ) -> None:
        """Mark the request, answer that it goes ahead, and ask the supervisor."""
        try:
            self._mark(req, **what)
        except OSError as exc:
            self._fail(up, f"cannot write {self._pending_path()}: {exc.strerror or exc}")
            return
        up.answer(STATUS_RUNNING, f"{req.action}: the supervisor restarts the agent's processes")
        try:
            ask()
        except (OSError, AgentError) as exc:
            self._pending_path().unlink(missing_ok=True)
            self._fail(up, f"the supervisor could not be asked: {exc}")

    def _answer_pending(self) -> bool:
        """Answer the restart or reload the companion before this one was asked for;
        whether nothing is left to answer (False: try again later)."""
        path = self._pending_path()
        try:
            record = json.loads(path.read_bytes()[:65536])
        except FileNotFoundError:
            return True
        except (OSError, ValueError) as exc:
            log.error("cannot read %s: %s; removed", path, exc)  # noqa: TRY400
            path.unlink(missing_ok=True)
            return True
        if not isinstance(record, dict) or not self.session.connected:
            return not isinstance(record, dict)
        up = self._upload(
            str(record.get("request_id", "unknown")),
            str(record.get("action", "")),
            record.get("counter") if isinstance(record.get("counter"), int) else None,
        )
        now = self._hello()
        kept = record.get("before")
        before: dict[str, Any] = kept if isinstance(kept, dict) else {}
        took = max(0.0, time.time() - float(record.get("at") or time.time()))
        if up.action == ACTION_RELOAD:
            reason = (
                f"reloaded: configuration {self.controls.config_digest} runs "
                f"(was {record.get('config_before')}), {took:.1f} s after the request"
            )
        else:
            reason = (
                f"restarted: the hot path is pid {now.get('pid')} (was {before.get('pid')}), "
                f"the companion pid {os.getpid()}, {took:.1f} s after the request"
            )
        try:
            up.answer(STATUS_OK, reason, before=before, after=now, took_s=round(took, 3),
                      config_digest=self.controls.config_digest,
                      config_before=record.get("config_before"))  # fmt: skip
        except UploadFailed as exc:
            log.warning("the %s answer waits: %s", up.action, exc.reason)
            return False
        path.unlink(missing_ok=True)
        self.stats.last = {"request_id": up.request_id, "status": STATUS_OK}
        log.info("action request %s: %s", up.request_id, reason)
        return True
