"""Why an HTTP (MJPEG) camera does not open, as a reason word: a real HTTP server on
loopback that asks for a password (Basic, then Digest), has no such path, or serves a page
instead of a stream; and a port with nothing listening. The stream that opens is
tests/agent/capture/test_capture_stream.py's."""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from agent.capture import Camera, CameraConfig
from tests.agent.capture.camera_watch import wait_for
from tests.support.broker import free_port

PASSWORD = secrets.token_hex(8)  # made at test time
LOGIN_VAR = "GATE_LOGIN"  # the environment variable that holds the password


class _Camera(BaseHTTPRequestHandler):
    """/secret wants Basic user:PASSWORD, /digest a Digest login (never given here),
    /page is an HTML page; anything else is 404. It never sends a stream."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization", "")
        self.seen.append(f"{self.path} {auth.split(' ', 1)[0]}".strip())
        if self.path == "/secret":
            good = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
            if auth != good:
                return self._answer(401, 'Basic realm="cam"')
            return self._answer(500)  # logged in: this camera is broken anyway
        if self.path == "/digest":
            return self._answer(401, 'Digest realm="cam", nonce="abc", qop="auth"')
        if self.path == "/page":
            body = b"<html><body>camera setup page</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        return self._answer(404)

    def _answer(self, status: int, challenge: str = "") -> None:
        self.send_response(status)
        if challenge:
            self.send_header("WWW-Authenticate", challenge)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def server() -> Iterator[str]:
    _Camera.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _first_failure(cameras: list[Camera], uri: str, **fields: object) -> tuple[str, str]:
    config = CameraConfig.model_validate(
        {"name": "gate", "kind": "http", "uri": uri, "open_timeout_s": 5, **fields}
    )
    camera = Camera(config)
    cameras.append(camera)
    camera.start()
    wait_for(lambda: camera.stats().errors >= 1, 15, "the first failure")
    stats = camera.stats()
    assert stats.failure in stats.failures, stats
    assert not camera.up
    return stats.failure, stats.last_error


def test_a_wrong_password_is_unauthorized_after_the_login_was_tried(
    server: str, cameras: list[Camera], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOGIN_VAR, "wrong-password")
    failure, error = _first_failure(
        cameras, f"{server}/secret", username="user", password_env=LOGIN_VAR
    )
    assert failure == "unauthorized"
    assert "HTTP 401" in error
    assert "/secret Basic" in _Camera.seen, _Camera.seen  # the probe logged in, and failed
    assert "wrong-password" not in error


def test_the_right_password_gets_past_the_login_and_the_servers_own_error_is_named(
    server: str, cameras: list[Camera], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOGIN_VAR, PASSWORD)
    failure, error = _first_failure(
        cameras, f"{server}/secret", username="user", password_env=LOGIN_VAR
    )
    assert failure == "unknown"
    assert "HTTP 500" in error


def test_a_digest_login_refused_is_unauthorized(
    server: str, cameras: list[Camera], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOGIN_VAR, PASSWORD)
    failure, error = _first_failure(
        cameras, f"{server}/digest", username="user", password_env=LOGIN_VAR
    )
    assert failure == "unauthorized"
    assert "/digest Digest" in _Camera.seen, _Camera.seen
    assert "HTTP 401" in error


def test_a_wrong_path_is_not_found(server: str, cameras: list[Camera]) -> None:
    failure, error = _first_failure(cameras, f"{server}/no-such-stream")
    assert failure == "not_found"
    assert "HTTP 404" in error


def test_a_page_instead_of_a_stream_is_named_with_its_content_type(
    server: str, cameras: list[Camera]
) -> None:
    failure, error = _first_failure(cameras, f"{server}/page")
    assert failure == "unknown"
    assert "HTTP 200 with text/html" in error


def test_nothing_listening_is_refused(cameras: list[Camera]) -> None:
    failure, _ = _first_failure(cameras, f"http://127.0.0.1:{free_port()}/stream")
    assert failure == "refused"
