"""A tiny real enrollment endpoint for the agent's tests: ``http.server`` on 127.0.0.1,
``POST /api/v1/enroll`` signed by a real :class:`fleet_server.ca.FleetCA`.

It stands in for the fleet's HTTP API (written elsewhere) with the same contract
(:mod:`agent.wire.enroll`): one-time tokens, 400 for a malformed request, 403 with
``{"detail": ...}`` for a refused one. ``tamper`` lets a test make it lie.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from agent.wire.enroll import ENROLL_PATH, BrokerInfo, EnrollRequest, EnrollResponse
from fleet_server.ca import CAError, FleetCA

MAX_BODY = 64 * 1024


@dataclass
class Grant:
    device_id: str
    labels: dict[str, str]
    profile: str


class EnrollServer:
    """Enrolls devices with ``ca``; tells them the broker at 127.0.0.1:``broker_port``."""

    def __init__(self, ca: FleetCA, broker_port: int, trust_root: bytes) -> None:
        self.ca = ca
        self.broker_port = broker_port
        self.trust_root = trust_root
        self.tokens: dict[str, Grant] = {}
        self.bodies: list[bytes] = []
        self.tamper: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def issue(self, device_id: str, labels: dict[str, str] | None = None, profile: str = "") -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self.tokens[token] = Grant(device_id, labels or {}, profile)
        return token

    def start(self) -> EnrollServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)

    def answer(self, body: bytes) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.bodies.append(body)
        try:
            request = EnrollRequest.model_validate_json(body)
        except ValidationError as exc:
            return 400, {"detail": f"malformed: {exc.error_count()} errors"}
        with self._lock:
            grant = self.tokens.pop(request.token, None)
        if grant is None:
            return 403, {"detail": "token unknown, used or expired"}
        try:
            issued = self.ca.sign_device_csr(request.csr.encode(), grant.device_id)
        except CAError as exc:
            return 403, {"detail": f"CSR refused: {exc.reason}"}
        response = EnrollResponse(
            device_id=grant.device_id,
            certificate=issued.cert_pem.decode(),
            ca=self.ca.cert_path.read_text(),
            broker=BrokerInfo(host="127.0.0.1", port=self.broker_port),
            trust_root=self.trust_root.decode(),
            labels=grant.labels,
            profile=grant.profile,
        ).model_dump(mode="json")
        if self.tamper is not None:
            response = self.tamper(response)
        return 200, response

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != ENROLL_PATH:
                    status, data = 404, {"detail": f"no {self.path}"}
                elif not 0 < length <= MAX_BODY:
                    status, data = 400, {"detail": "body missing or too large"}
                else:
                    status, data = server.answer(self.rfile.read(length))
                out = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
