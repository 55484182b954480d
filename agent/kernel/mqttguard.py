"""Keeps a paho client's network thread alive whatever a message does to a callback.

An exception that escapes a paho callback ends the client's network thread, silently:
the client stops reading, and nothing says so. Two rules, held here for every client
that reads untrusted input (the fleet's file server and ingest, an agent's MQTT sensor):

* every callback is wrapped by :meth:`MqttGuard.wrap`: an exception is caught, logged,
  counted per callback, and answered (the ``answer`` hook, where the peer waits for a
  reply); the thread goes on with the next packet;
* the network thread is supervised by :meth:`MqttGuard.start`: a watcher notices a dead
  thread (an exception no wrapper caught, a ``BaseException``), connects again (the
  owner's ``connect``, e.g. ``connect_async`` with its own arguments: a fresh connection
  resets paho's half-read packet state) and starts a new loop; each restart is counted.

The owner stops the guard (:meth:`MqttGuard.stop`) before it disconnects, so that a
disconnect on purpose (which ends paho's thread too) is not taken for a death.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, ParamSpec

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""How often the watcher looks at the network thread."""

P = ParamSpec("P")


class MqttGuard:
    """Callback wrapping and network-thread supervision for one paho client.

    Args:
        name: names the client in logs and health ("file-server", "sensor temp").
        check_s: seconds between two looks at the network thread.
    """

    def __init__(self, name: str, *, check_s: float = CHECK_S) -> None:
        self.name = name
        self.check_s = check_s
        self._lock = threading.Lock()
        self._errors: dict[str, int] = {}
        self._last_error = ""
        self._restarts = 0
        self._client: mqtt.Client | None = None
        self._connect: Callable[[], object] | None = None
        self._on_restart: Callable[[], object] | None = None
        self._loop_thread: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._restarted = threading.Condition(self._lock)

    # -- callbacks --------------------------------------------------------------------

    def wrap(
        self,
        callback: str,
        fn: Callable[P, None],
        *,
        answer: Callable[P, None] | None = None,
    ) -> Callable[P, None]:
        """``fn`` as a paho callback that never raises.

        ``answer`` is called with the same arguments after ``fn`` raised (to answer the
        peer with an error); an exception from it is logged and counted too.
        """

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 (the point: nothing ends the thread)
                self._count(callback, exc)
                if answer is None:
                    return
                try:
                    answer(*args, **kwargs)
                except Exception as again:  # noqa: BLE001 (as above)
                    self._count(f"{callback}.answer", again)

        return guarded

    def _count(self, callback: str, exc: Exception) -> None:
        with self._lock:
            self._errors[callback] = self._errors.get(callback, 0) + 1
            self._last_error = f"{callback}: {type(exc).__name__}: {exc}"[:300]
        log.error(
            "%s: %s callback failed (the thread goes on)",
            self.name,
            callback,
            exc_info=(type(exc), exc, exc.__traceback__),
        )

    def errors(self) -> dict[str, int]:
        """Exceptions caught, by callback name."""
        with self._lock:
            return dict(self._errors)

    @property
    def error_count(self) -> int:
        """Exceptions caught in every callback together."""
        with self._lock:
            return sum(self._errors.values())

    @property
    def last_error(self) -> str:
        """The last exception caught, with its callback ("" while none)."""
        with self._lock:
            return self._last_error

    # -- the network thread -----------------------------------------------------------

    def start(
        self,
        client: mqtt.Client,
        connect: Callable[[], object],
        on_restart: Callable[[], object] | None = None,
    ) -> None:
        """``connect()`` (e.g. ``client.connect_async(...)``), start paho's network
        thread and the watcher that restarts it when it dies; ``on_restart`` is called
        (on the watcher's thread) before each restart, e.g. to mark the owner not ready
        until it is subscribed again.

        Raises:
            RuntimeError: already started, or paho refused to start its thread.
        """
        if self._watcher is not None:
            raise RuntimeError(f"{self.name}: the MQTT guard is already started")
        self._client, self._connect = client, connect
        self._on_restart = on_restart
        self._stop.clear()
        self._start_loop()
        self._watcher = threading.Thread(
            target=self._watch, name=f"mqtt-watch-{self.name}", daemon=True
        )
        self._watcher.start()

    def _start_loop(self) -> None:
        client, connect = self._client, self._connect
        if client is None or connect is None:
            raise RuntimeError(f"{self.name}: the MQTT guard is not started")
        connect()
        if client.loop_start() != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise RuntimeError(f"{self.name}: paho's network thread is already running")
        # paho keeps its thread in a private attribute (paho-mqtt 2.x); it is read only.
        self._loop_thread = client._thread

    def stop(self) -> None:
        """Stop watching (before the owner disconnects); idempotent."""
        self._stop.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(self.check_s + 5.0)

    @property
    def thread_alive(self) -> bool:
        """Whether paho's network thread runs."""
        thread = self._loop_thread
        return thread is not None and thread.is_alive()

    @property
    def restarts(self) -> int:
        """Times the network thread was found dead and started again."""
        with self._lock:
            return self._restarts

    def wait_restarts(self, count: int, timeout_s: float) -> bool:
        """Wait until :attr:`restarts` reaches ``count``; whether it did."""
        with self._restarted:
            return self._restarted.wait_for(lambda: self._restarts >= count, timeout_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            if self.thread_alive:
                continue
            client = self._client
            if client is None or client._thread is not None:
                continue  # paho is still clearing its dead thread: next look
            log.error("%s: paho's network thread died; connecting again", self.name)
            try:
                if self._on_restart is not None:
                    self._on_restart()
                self._start_loop()
            except Exception:  # the watcher must outlive a failed restart: next look
                log.exception("%s: restarting the network thread failed", self.name)
                continue
            with self._restarted:
                self._restarts += 1
                self._restarted.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """Figures for a health probe: thread alive, restarts, callback errors."""
        with self._lock:
            errors = dict(self._errors)
            last = self._last_error
            restarts = self._restarts
        return {
            "thread_alive": self.thread_alive,
            "thread_restarts": restarts,
            "callback_errors": errors,
            "last_callback_error": last,
        }


__all__ = ["CHECK_S", "MqttGuard"]
