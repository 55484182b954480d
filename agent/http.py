"""The agent's local HTTP endpoint: ``/healthz``, ``/readyz`` and ``/metrics``.

A stdlib ``ThreadingHTTPServer`` in a daemon thread, on loopback unless told otherwise.
Health and readiness answer 200 with ``{"status": "ok", ...}`` or 503 with the details;
``/metrics`` is the Prometheus text format. Other paths: 404; other methods: 405.

Slow clients can't make it unanswerable: at most :data:`MAX_CONNECTIONS` are served at
once, each must send its whole request head within :data:`HEAD_DEADLINE_S` (from its
connect, or from the end of its last answer on a kept-alive connection; a client that
trickles a byte at a time is cut off too), and when every place is taken a new
connection takes the place of the one that has waited longest for its request head.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import Field, model_validator

from agent.errors import AgentError
from agent.kernel.configbase import Section
from agent.metrics import CONTENT_TYPE, AgentMetrics

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, dict[str, Any]]]

MAX_CONNECTIONS = 16  # connections served at once (see the module docstring)
HEAD_DEADLINE_S = 2.0  # a connection's whole request head must come within this
REQUEST_TIMEOUT_S = 5.0  # any one read or write on a connection (answers are sent in it)
_TAKE_OVER_WAIT_S = 1.0  # how long a new connection waits for the place it freed
_POLL_S = 0.2


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (no name lookup)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpConfig(Section):
    """Where the local HTTP endpoint listens."""

    host: str = Field("127.0.0.1", description="Address to bind; loopback unless allow_remote.")
    port: int = Field(9464, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    allow_remote: bool = Field(
        False,
        description="Allow a non-loopback host (exposes health and metrics to the network).",
    )

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> HttpConfig:
        if not self.allow_remote and not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address; set allow_remote = true to bind it"
            )
        return self


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        render: Callable[[], bytes],
        health: Probe,
        ready: Probe,
    ) -> None:
        self.render = render
        self.probes = {"/healthz": health, "/readyz": ready}
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.cut_off = 0
        """Connections closed for not sending their request head in time, or for a new one."""
        self._waiting: dict[socket.socket, float] = {}  # waiting for a request head, since
        self._waiting_lock = threading.Lock()
        host = address[0]
        if host != "localhost" and ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        taken = self.slots.acquire(blocking=False) or (
            self._cut_off_oldest() and self.slots.acquire(timeout=_TAKE_OVER_WAIT_S)
        )
        if not taken:
            log.warning("local HTTP: %d requests in progress, closing a new one", MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.answered(request)
            self.slots.release()

    # -- connections waiting for their request head ------------------------------------
    def waiting(self, conn: socket.socket) -> None:
        """``conn`` waits for its (next) request head from now on."""
        with self._waiting_lock:
            self._waiting[conn] = time.monotonic()

    def answered(self, conn: socket.socket) -> None:
        """``conn``'s request head is in (or the connection is closed)."""
        with self._waiting_lock:
            self._waiting.pop(conn, None)

    def _cut(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # its thread's read ends; the thread closes it
            conn.shutdown(socket.SHUT_RDWR)
        self.cut_off += 1

    def _cut_off_oldest(self) -> bool:
        """Cut off the connection that has waited longest for its request head, if any."""
        with self._waiting_lock:
            if not self._waiting:
                return False
            conn = min(self._waiting, key=self._waiting.__getitem__)
            del self._waiting[conn]
        self._cut(conn)
        return True

    def service_actions(self) -> None:
        """Cut off every connection past :data:`HEAD_DEADLINE_S` without its request head
        (called by ``serve_forever`` every poll)."""
        now = time.monotonic()
        with self._waiting_lock:
            late = [c for c, since in self._waiting.items() if now - since > HEAD_DEADLINE_S]
            for conn in late:
                del self._waiting[conn]
        for conn in late:
            self._cut(conn)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "edgefleet-agent"
    protocol_version = "HTTP/1.1"

    def handle_one_request(self) -> None:
        self.server.waiting(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server.answered(self.connection)

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers: the request head is in
        self.server.answered(self.connection)
        return ok

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("local HTTP %s: %s", self.client_address[0], format % args)

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, body: dict[str, Any], **headers: str) -> None:
        data = json.dumps(body, default=str, sort_keys=True).encode("utf-8") + b"\n"
        self._send(status, data, "application/json", **headers)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(HTTPStatus.OK, self.server.render(), CONTENT_TYPE)
            return
        probe = self.server.probes.get(path)
        if probe is None:
            self._json(HTTPStatus.NOT_FOUND, {"status": "not found", "path": path})
            return
        try:
            ok, details = probe()
        except Exception as exc:  # a failing probe is an unhealthy agent, not a dead server
            log.exception("local HTTP: %s probe failed", path)
            ok, details = False, {"error": f"{type(exc).__name__}: {exc}"}
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._json(status, {**details, "status": "ok" if ok else "fail"})

    def _not_allowed(self) -> None:
        self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"status": "method not allowed"}, Allow="GET")

    def do_POST(self) -> None:
        self._not_allowed()

    def do_PUT(self) -> None:
        self._not_allowed()

    def do_DELETE(self) -> None:
        self._not_allowed()

    def do_PATCH(self) -> None:
        self._not_allowed()

    def do_HEAD(self) -> None:
        self._not_allowed()

    def do_OPTIONS(self) -> None:
        self._not_allowed()


class LocalHttpServer:
    """Serves health, readiness and metrics in a daemon thread. ``/metrics`` is
    ``render()`` (default: ``metrics.render``; the companion joins its part and the hot
    path's).

    Raises:
        ValueError: ``host`` is not loopback and ``allow_remote`` is false.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: AgentMetrics,
        *,
        health: Probe,
        ready: Probe,
        allow_remote: bool = False,
        render: Callable[[], bytes] | None = None,
    ) -> None:
        if not allow_remote and not is_loopback(host):
            raise ValueError(
                f"local HTTP: host {host!r} is not a loopback address; pass allow_remote=True"
            )
        self.host = host
        self._requested_port = port
        self._render = render or metrics.render
        self._health = health
        self._ready = ready
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port listened on (the one picked when 0 was asked for)."""
        if self._server is None:
            return self._requested_port
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind and serve.

        Raises:
            AgentError: already started, or the address can't be bound.
        """
        if self._server is not None:
            raise AgentError("local HTTP server already started")
        try:
            server = _Server(
                (self.host, self._requested_port), self._render, self._health, self._ready
            )
        except OSError as exc:
            raise AgentError(
                f"local HTTP: can't listen on {self.host}:{self._requested_port}: {exc}"
            ) from exc
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(_POLL_S,), name="local-http", daemon=True
        )
        self._thread.start()
        log.info("local HTTP on http://%s:%d", self.host, self.port)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop serving and close the socket; requests in progress are not waited for."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        if thread.is_alive():
            server.shutdown()  # returns within _POLL_S: serve_forever is running
            thread.join(timeout_s)
        server.server_close()
        self._server = self._thread = None
