"""The control channel between the companion and the hot path: a real Unix socket, the
server's thread and the client; every refused message names what was wrong and reaches
no handler."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.control.client import ControlClient
from agent.control.link import HotPathLink, local_call
from agent.control.protocol import MAX_REQUEST_BYTES, ControlError, check_request
from agent.control.server import ControlServer


class Recorder:
    """A handler that records every call it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, op: str, args: dict[str, Any]) -> Any:
        with self.lock:
            self.calls.append((op, args))
        if op == "bundle_health":
            if args["bundle"] == "gone":
                raise ControlError("no running pipeline uses bundle 'gone'")
            return {"worker_crashes": 0, "inference_errors": 0, "p95_ms": 1.5, "inferences": 9}
        if op == "health":
            return (True, {"pool": "ok"})
        if op == "alarms":
            return {"alarms": [{"alarm": "disk", "message": "full"}], "dropped": 0}
        if op == "live":
            return {"p99_ms": 3.0, "baseline_p99_ms": 2.5, "count": 40, "window_s": 1.0}
        if op == "stats":
            raise ValueError("boom")
        return {"op": op}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlServer, Recorder]]:
    recorder = Recorder()
    server = ControlServer(tmp_path / "run" / "control.sock", recorder).start()
    try:
        yield server, recorder
    finally:
        server.stop()


def _raw(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(path))
    return sock


def _answer(sock: socket.socket) -> dict[str, Any]:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        assert chunk, "the server closed without answering"
        header += chunk
    (size,) = struct.unpack(">I", header)
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    answer = json.loads(body)
    assert isinstance(answer, dict)
    return answer


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_the_socket_and_its_directory_are_private_to_the_agents_user(
    served: tuple[ControlServer, Recorder],
) -> None:
    server, _ = served
    assert stat.S_IMODE(server.path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(server.path.stat().st_mode)


def test_a_request_is_answered_with_the_handlers_result(
    served: tuple[ControlServer, Recorder],
) -> None:
    server, recorder = served
    client = ControlClient(server.path)
    assert client.call("hello") == {"op": "hello"}
    assert client.call("bundle_health", bundle="cls")["inferences"] == 9
    assert recorder.calls == [("hello", {}), ("bundle_health", {"bundle": "cls"})]
    client.close()


def test_malformed_oversized_unknown_and_ill_typed_requests_are_refused_and_reach_no_handler(
    served: tuple[ControlServer, Recorder],
) -> None:
    server, recorder = served
    with _raw(server.path) as sock:
        sock.sendall(_frame(b"{not json"))
        refused = _answer(sock)
        assert refused["ok"] is False
        assert "not JSON" in refused["error"]
        sock.sendall(_frame(b"[1, 2]"))
        assert "not an object" in _answer(sock)["error"]
        sock.sendall(_frame(json.dumps({"op": "format_disk"}).encode()))
        assert "unknown operation 'format_disk'" in _answer(sock)["error"]
        sock.sendall(_frame(json.dumps({"op": "bundle_health", "args": {"bundle": 7}}).encode()))
        assert "argument 'bundle' must be str" in _answer(sock)["error"]
        sock.sendall(_frame(json.dumps({"op": "reload", "args": {"now": True}}).encode()))
        assert "unknown argument(s) now" in _answer(sock)["error"]
        # the same connection still serves a good request after the refusals
        sock.sendall(_frame(json.dumps({"op": "hello"}).encode()))
        assert _answer(sock) == {"ok": True, "result": {"op": "hello"}}
    with _raw(server.path) as sock:
        sock.sendall(struct.pack(">I", MAX_REQUEST_BYTES + 1))
        too_big = _answer(sock)
        assert too_big["ok"] is False
        assert (
            f"{MAX_REQUEST_BYTES + 1} bytes is over the limit of {MAX_REQUEST_BYTES}"
            in (too_big["error"])
        )
        assert sock.recv(1) == b"", "the stream is closed after an oversized frame"
    assert recorder.calls == [("hello", {})]
    assert server.refused == 6
    assert server.alive


def test_a_handlers_refusal_and_failure_are_answered_and_the_server_goes_on(
    served: tuple[ControlServer, Recorder],
) -> None:
    server, _ = served
    client = ControlClient(server.path)
    with pytest.raises(ControlError, match="no running pipeline uses bundle 'gone'"):
        client.call("bundle_health", bundle="gone")
    with pytest.raises(ControlError, match="stats failed: boom"):
        client.call("stats")
    assert client.call("ready") == {"op": "ready"}
    client.close()


def test_the_client_says_the_hot_path_is_unreachable_and_reconnects_when_it_is_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run" / "control.sock"
    client = ControlClient(path, timeout_s=0.5)
    with pytest.raises(ControlError, match="the hot path can't be reached"):
        client.call("hello")
    server = ControlServer(path, Recorder()).start()
    try:
        assert client.call("hello") == {"op": "hello"}
    finally:
        server.stop()
    with pytest.raises(ControlError):
        client.call("hello")
    server = ControlServer(path, Recorder()).start()  # a restarted hot path, same path
    try:
        assert client.call("hello") == {"op": "hello"}
    finally:
        server.stop()
        client.close()


def test_a_stale_socket_file_is_replaced_but_another_file_is_never_deleted(tmp_path: Path) -> None:
    path = tmp_path / "run" / "control.sock"
    ControlServer(path, Recorder()).start()  # never stopped: its socket file stays
    assert path.exists()
    second = ControlServer(path, Recorder()).start()
    second.stop()
    path.parent.mkdir(exist_ok=True)
    path.write_text("not a socket")
    with pytest.raises(ControlError, match="exists and is not a socket"):
        ControlServer(path, Recorder()).start()
    assert path.read_text() == "not a socket"


def test_the_link_gives_the_directives_service_a_running_agent_over_any_call(
    served: tuple[ControlServer, Recorder],
) -> None:
    server, recorder = served
    client = ControlClient(server.path)
    for call in (client.call, local_call(recorder)):
        link = HotPathLink(call, device_id="dev-1", state_dir=Path("/state"))
        assert link.device_id == "dev-1"
        assert link.bundle_health("cls")["p95_ms"] == 1.5
        with pytest.raises(RuntimeError, match="no running pipeline uses bundle 'gone'"):
            link.bundle_health("gone")
        assert link.health() == (True, {"pool": "ok"})
        assert link.alarms() == [{"alarm": "disk", "message": "full"}]
        live = link.live()
        assert live is not None
        assert live.p99_ms == 3.0
        assert live.count == 40
    client.close()


def test_check_request_names_each_kind_of_mistake() -> None:
    assert check_request({"op": "alarms", "args": {"max": 5}}) == ("alarms", {"max": 5})
    for message, reason in (
        ({}, "unknown operation None"),
        ({"op": "alarms", "args": []}, "args must be an object"),
        ({"op": "alarms"}, "argument 'max' is missing"),
        ({"op": "alarms", "args": {"max": True}}, "argument 'max' must be int"),
    ):
        with pytest.raises(ControlError, match=reason.replace("(", r"\(")):
            check_request(message)


def test_the_server_socket_is_not_left_behind_after_stop(tmp_path: Path) -> None:
    path = tmp_path / "run" / "control.sock"
    server = ControlServer(path, Recorder()).start()
    server.stop()
    assert not os.path.exists(path)
