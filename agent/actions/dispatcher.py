"""Run the actions off the hot path: a bounded queue and a thread per action.

``dispatch()`` never blocks: it puts the event on each matching action's queue, or
counts it dropped when that queue is full. Each action's thread delivers its events one
by one, so a slow webhook delays only itself. Every event ends up counted exactly once
as sent, failed, timeout or dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.actions.config import ActionConfig, MqttAction, WebhookAction
from agent.actions.errors import ActionError, ActionTimeout
from agent.actions.event import ActionEvent
from agent.actions.mqtt import MqttPublisher, MqttSender
from agent.actions.webhook import WebhookSender
from agent.errors import AgentError
from agent.kernel.errors import ConfigError
from agent.metrics import AgentMetrics
from agent.mqtt_config import LocalMqttConfig

__all__ = ["ActionDispatcher", "ActionEvent"]

log = logging.getLogger(__name__)

RESULTS = ("sent", "failed", "dropped", "timeout")
_POLL_S = 0.1  # how often an idle worker looks at the stop flag
_LOG_EVERY_S = 10.0


class _Sender(Protocol):
    name: str

    def send(self, event: ActionEvent) -> None: ...


class _RateLimitedLog:
    """At most one warning per key every ``interval_s``; says how many it held back."""

    def __init__(self, interval_s: float = _LOG_EVERY_S) -> None:
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def warning(self, key: tuple[str, str], message: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, held = self._last.get(key, (-self._interval_s, 0))
            if now - last < self._interval_s:
                self._last[key] = (last, held + 1)
                return
            self._last[key] = (now, 0)
        suffix = f" ({held} more like it not logged)" if held else ""
        log.warning("%s%s", message, suffix)


@dataclass
class _Worker:
    sender: _Sender
    action: ActionConfig
    bound: int
    metrics: AgentMetrics | None
    warn: _RateLimitedLog
    queue: queue.Queue[tuple[float, ActionEvent]] = field(init=False)
    counts: dict[str, int] = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.queue = queue.Queue(maxsize=self.bound)
        self.counts = dict.fromkeys(RESULTS, 0)
        if self.metrics is not None:
            for result in RESULTS:
                self.metrics.actions.labels(action=self.name, result=result)
            depth = self.metrics.queue_depth.labels(queue=f"action:{self.name}")
            depth.set_function(self.queue.qsize)

    @property
    def name(self) -> str:
        return self.sender.name

    def count(self, result: str, n: int = 1) -> None:
        with self.lock:
            self.counts[result] += n
        if self.metrics is not None:
            self.metrics.actions.labels(action=self.name, result=result).inc(n)

    def offer(self, event: ActionEvent) -> None:
        try:
            self.queue.put_nowait((time.monotonic(), event))
        except queue.Full:
            self.count("dropped")
            self.warn.warning(
                (self.name, "full"), f"action '{self.name}': queue full ({self.bound}), dropped"
            )

    def drain(self) -> int:
        """Take every queued event off and count it dropped; how many there were."""
        n = 0
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
            n += 1
        if n:
            self.count("dropped", n)
        return n

    def run(self, stop: threading.Event, stop_by: list[float]) -> None:
        max_age_s = self.action.max_age_s
        while True:
            if stop.is_set() and time.monotonic() >= stop_by[0]:
                if self.drain():
                    log.warning("action '%s': stopped with events left, dropped", self.name)
                return
            try:
                queued_at, event = self.queue.get(timeout=_POLL_S)
            except queue.Empty:
                if stop.is_set():
                    return
                continue
            if max_age_s is not None and time.monotonic() - queued_at > max_age_s:
                self.count("dropped")
                self.warn.warning(
                    (self.name, "stale"),
                    f"action '{self.name}': event waited over {max_age_s:g} s, dropped",
                )
                continue
            self.deliver(event)

    def deliver(self, event: ActionEvent) -> None:
        try:
            self.sender.send(event)
        except ActionTimeout as exc:
            self.count("timeout")
            self.warn.warning((self.name, "timeout"), str(exc))
        except ActionError as exc:
            self.count("failed")
            self.warn.warning((self.name, "failed"), str(exc))
        except Exception:  # a bug must not kill the action's thread: count it, log it
            self.count("failed")
            log.exception("action '%s': unexpected error delivering %s", self.name, event)
        else:
            self.count("sent")


class ActionDispatcher:
    """Hands decisions to their actions without ever blocking the caller.

    Raises:
        ConfigError: two actions share a name, an MQTT action has no local broker
            configured, or a webhook's token is not set.
    """

    def __init__(
        self,
        actions: Sequence[ActionConfig],
        mqtt: LocalMqttConfig | None,
        *,
        queue_bound: int = 1000,
        metrics: AgentMetrics | None = None,
    ) -> None:
        if queue_bound < 1:
            raise ConfigError("", "actions.queue_bound", f"must be >= 1, got {queue_bound}")
        self._publisher: MqttPublisher | None = None
        self._warn = _RateLimitedLog()
        self._workers: list[_Worker] = []
        self._stop = threading.Event()
        self._stop_by = [0.0]
        self._state = "new"
        names: set[str] = set()
        for action in actions:
            if action.name in names:
                raise ConfigError("", "actions", f"action name {action.name!r} is used twice")
            names.add(action.name)
            sender: _Sender
            if isinstance(action, MqttAction):
                if mqtt is None:
                    raise ConfigError(
                        "", "mqtt", f"action '{action.name}' publishes but no local broker is set"
                    )
                if self._publisher is None:
                    self._publisher = MqttPublisher(mqtt, max_in_flight=queue_bound)
                sender = MqttSender(action, self._publisher)
            elif isinstance(action, WebhookAction):
                sender = WebhookSender(action)
            else:  # pragma: no cover - the union is closed
                raise ConfigError("", "actions", f"unknown action {action!r}")
            self._workers.append(_Worker(sender, action, queue_bound, metrics, self._warn))

    @property
    def names(self) -> list[str]:
        """The actions' names, in configuration order."""
        return [w.name for w in self._workers]

    @property
    def mqtt_connected(self) -> bool | None:
        """Whether the local broker is connected; None when no action uses MQTT."""
        return None if self._publisher is None else self._publisher.connected

    def start(self) -> None:
        """Connect (in the background) and start one thread per action.

        Raises:
            AgentError: started twice, or after stop().
        """
        if self._state != "new":
            raise AgentError(f"action dispatcher can't start: it is {self._state}")
        self._state = "running"
        if self._publisher is not None:
            self._publisher.start()
        for worker in self._workers:
            worker.thread = threading.Thread(
                target=worker.run,
                args=(self._stop, self._stop_by),
                name=f"action-{worker.name}",
                daemon=True,
            )
            worker.thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Deliver what can be delivered within ``timeout_s``; count the rest dropped.

        A delivery in progress at the deadline finishes in the background (bounded by its
        own timeout) and is counted then.
        """
        if self._state == "stopped":
            return
        was_running = self._state == "running"
        self._state = "stopped"
        deadline = time.monotonic() + timeout_s
        self._stop_by[0] = deadline
        self._stop.set()
        for worker in self._workers:
            if worker.thread is not None:
                worker.thread.join(max(deadline - time.monotonic(), 0.0))
                if worker.thread.is_alive():
                    log.warning("action '%s' still delivering at stop", worker.name)
            worker.drain()
        if self._publisher is not None and was_running:
            self._publisher.stop()

    def dispatch(self, event: ActionEvent) -> None:
        """Queue ``event`` for every action that wants its outcome; never blocks."""
        stopped = self._state == "stopped"
        for worker in self._workers:
            if not worker.action.wants(event.outcome):
                continue
            if stopped:
                worker.count("dropped")
                self._warn.warning(
                    (worker.name, "stopped"), f"action '{worker.name}': stopped, dropped"
                )
            else:
                worker.offer(event)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per action: sent, failed, dropped, timeouts, queued."""
        out: dict[str, dict[str, int]] = {}
        for w in self._workers:
            with w.lock:
                c = dict(w.counts)
            out[w.name] = {
                "sent": c["sent"],
                "failed": c["failed"],
                "dropped": c["dropped"],
                "timeouts": c["timeout"],
                "queued": w.queue.qsize(),
            }
        return out
