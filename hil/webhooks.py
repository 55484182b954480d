"""A webhook receiver on loopback for the tests and the demo: it checks every alert
POST as docs/alerts.md tells a receiver to (the HMAC-SHA256 signature over the
timestamp and the body, the timestamp within a tolerance of its clock, each delivery id
once), keeps what it accepted, what it refused and why, and answers as told (a status,
or not at all: :meth:`WebhookReceiver.stop` takes it off its port).

Without a secret it keeps every JSON body as it came (Alertmanager's webhook).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleet_server.alerts.webhook import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    TOLERANCE_S,
    SignatureRefused,
    verify,
)

MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Received:
    """One accepted POST."""

    delivery_id: str
    event: str
    """``firing`` or ``resolved`` (the header's ``alert.`` taken off)."""
    body: dict[str, Any]
    timestamp: int
    at: float

    @property
    def alert(self) -> dict[str, Any]:
        alert: dict[str, Any] = self.body.get("alert", {})
        return alert


class WebhookReceiver:
    """An HTTP server on ``host`` (a free port unless given) in a thread."""

    def __init__(
        self,
        secret: bytes | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tolerance_s: float = TOLERANCE_S,
        clock: Callable[[], float] = time.time,
        path: str = "/hooks/edgefleet",
    ) -> None:
        self.secret = secret
        self.host = host
        self.port = port
        self.tolerance_s = tolerance_s
        self.clock = clock
        self.path = path
        self.status = 204
        """What an accepted POST is answered (set 500 to make the sender retry)."""
        self.received: list[Received] = []
        self.bodies: list[dict[str, Any]] = []
        """Every JSON body taken (without a secret: all of them)."""
        self.refused: list[str] = []
        self.duplicates = 0
        self.posts = 0
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(min(length, MAX_BODY))
                status = receiver.take(dict(self.headers.items()), data, self.path)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and free the port (a sender then gets connection refused)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def take(self, headers: dict[str, str], data: bytes, path: str) -> int:
        """Judge one POST; the status to answer."""
        now = self.clock()
        with self._cond:
            self.posts += 1
            if path != self.path:
                self.refused.append(f"path {path!r}")
                self._cond.notify_all()
                return 404
            if self.secret is None:
                self.bodies.append(json.loads(data))
                self._cond.notify_all()
                return self.status
            lower = {k.lower(): v for k, v in headers.items()}
            try:
                timestamp = verify(self.secret, headers, data, now=now,
                                   tolerance_s=self.tolerance_s)  # fmt: skip
            except SignatureRefused as exc:
                self.refused.append(exc.reason)
                self._cond.notify_all()
                return 401
            delivery = lower.get(DELIVERY_HEADER.lower(), "")
            for old in [d for d, t in self._seen.items() if now - t > 2 * self.tolerance_s]:
                del self._seen[old]  # older than any timestamp still taken
            if delivery in self._seen:
                self.duplicates += 1  # a retry whose answer was lost, or a replay: once
                self._cond.notify_all()
                return self.status
            if self.status >= 300:
                self._cond.notify_all()
                return self.status
            self._seen[delivery] = now
            doc = json.loads(data)
            event = lower.get(EVENT_HEADER.lower(), "").removeprefix("alert.")
            self.received.append(Received(delivery, event, doc, timestamp, now))
            self.bodies.append(doc)
            self._cond.notify_all()
            return self.status

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait until ``predicate()`` (called under the receiver's lock) holds.

        Raises:
            AssertionError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    got = [
                        (r.event, r.alert.get("rule"), r.alert.get("key")) for r in self.received
                    ]
                    raise AssertionError(
                        f"timed out after {timeout_s} s waiting for {what}; received {got}, "
                        f"refused {self.refused}"
                    )
                self._cond.wait(min(left, 0.5))

    def events(self) -> list[tuple[str, str, str]]:
        """(event, rule, key) of every accepted delivery, in order."""
        with self._lock:
            return [(r.event, r.alert["rule"], r.alert["key"]) for r in self.received]

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["Received", "WebhookReceiver"]
