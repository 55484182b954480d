"""The local HTTP endpoint, over real loopback HTTP, and the metrics it serves."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agent.errors import AgentError
from agent.http import HEAD_DEADLINE_S, MAX_CONNECTIONS, HttpConfig, LocalHttpServer
from agent.metrics import AgentMetrics

Probe = Callable[[], tuple[bool, dict[str, Any]]]


def fixed(ok: bool, **details: Any) -> Probe:
    return lambda: (ok, dict(details))


@pytest.fixture
def serve() -> Iterator[Callable[..., LocalHttpServer]]:
    started: list[LocalHttpServer] = []

    def make(
        metrics: AgentMetrics | None = None,
        *,
        health: Probe | None = None,
        ready: Probe | None = None,
    ) -> LocalHttpServer:
        server = LocalHttpServer(
            "127.0.0.1",
            0,
            metrics or AgentMetrics(),
            health=health or fixed(True),
            ready=ready or fixed(True),
        )
        server.start()
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop()


def get(
    server: LocalHttpServer, path: str, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_port_zero_binds_a_free_port_and_healthz_answers_ok(
    serve: Callable[..., LocalHttpServer],
) -> None:
    server = serve(health=fixed(True, pool="ok"))
    assert server.port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert json.loads(resp.read()) == {"status": "ok", "pool": "ok"}


def test_readyz_answers_503_with_the_details_when_not_ready(
    serve: Callable[..., LocalHttpServer],
) -> None:
    server = serve(ready=fixed(False, cameras={"cam1": False}))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
    assert err.value.code == 503
    assert json.loads(err.value.read()) == {"status": "fail", "cameras": {"cam1": False}}
    err.value.close()
    status, _, _ = get(server, "/healthz")  # health is its own probe
    assert status == 200


def test_a_probe_that_raises_gives_503_and_the_server_keeps_serving(
    serve: Callable[..., LocalHttpServer],
) -> None:
    def broken() -> tuple[bool, dict[str, Any]]:
        raise RuntimeError("decision log closed")

    server = serve(health=broken)
    status, _, body = get(server, "/healthz")
    assert status == 503
    assert "decision log closed" in json.loads(body)["error"]
    assert get(server, "/readyz")[0] == 200


def test_metrics_are_served_in_prometheus_text_format_with_observed_values(
    serve: Callable[..., LocalHttpServer],
) -> None:
    m = AgentMetrics()
    m.frames.labels(camera="cam1").inc(7)
    m.camera_up.labels(camera="cam1").set(1)
    m.fps.labels(camera="cam1").set(29.5)
    m.stage_latency.labels(pipeline="p1", stage="inference").observe(0.004)
    m.e2e_latency.labels(pipeline="p1").observe(0.012)
    m.decisions.labels(pipeline="p1", outcome="reject").inc(3)
    m.queue_depth.labels(queue="cls").set(2)
    m.actions.labels(action="plc", result="sent").inc()
    server = serve(m)

    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("edgefleet_frames_captured_total", (("camera", "cam1"),))] == 7
    assert samples[("edgefleet_camera_up", (("camera", "cam1"),))] == 1
    assert samples[("edgefleet_camera_fps", (("camera", "cam1"),))] == 29.5
    assert samples[("edgefleet_decisions_total", (("outcome", "reject"), ("pipeline", "p1")))] == 3
    assert samples[("edgefleet_queue_depth", (("queue", "cls"),))] == 2
    assert samples[("edgefleet_actions_total", (("action", "plc"), ("result", "sent")))] == 1
    stage = (("le", "0.005"), ("pipeline", "p1"), ("stage", "inference"))
    assert samples[("edgefleet_stage_latency_seconds_bucket", stage)] == 1
    below = (("le", "0.003"), ("pipeline", "p1"), ("stage", "inference"))
    assert samples[("edgefleet_stage_latency_seconds_bucket", below)] == 0
    assert samples[("edgefleet_e2e_latency_seconds_count", (("pipeline", "p1"),))] == 1


def test_two_agents_in_one_process_keep_separate_metrics() -> None:
    a, b = AgentMetrics(), AgentMetrics()
    a.alarms.labels(kind="disk").inc()
    assert b'edgefleet_alarms_total{kind="disk"} 1.0' in a.render()
    assert b'kind="disk"' not in b.render()


def test_set_counter_follows_a_running_total_and_never_goes_down() -> None:
    m = AgentMetrics()

    def value() -> float:
        families = text_string_to_metric_families(m.render().decode())
        f = next(f for f in families if f.name == "edgefleet_frames_dropped")
        return next(s.value for s in f.samples if s.name.endswith("_total"))

    m.set_counter(m.frames_dropped, 10, camera="c")
    m.set_counter(m.frames_dropped, 15, camera="c")
    assert value() == 15
    m.set_counter(m.frames_dropped, 4, camera="c")  # the camera restarted its count
    assert value() == 19


def test_update_decision_log_sets_queue_and_totals() -> None:
    m = AgentMetrics()
    m.update_decision_log({"queued": 3, "written": 100, "dropped": 2, "evicted": 0})
    m.update_decision_log({"queued": 1, "written": 120, "dropped": 2, "evicted": 5})
    text = m.render().decode()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert got["edgefleet_decision_log_queued"] == 1
    assert got["edgefleet_decision_log_written_total"] == 120
    assert got["edgefleet_decision_log_dropped_total"] == 2
    assert got["edgefleet_decision_log_evicted_total"] == 5


def test_unknown_path_is_404(serve: Callable[..., LocalHttpServer]) -> None:
    server = serve()
    assert get(server, "/nope")[0] == 404
    assert get(server, "/metrics/extra")[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
def test_methods_other_than_get_are_405(method: str, serve: Callable[..., LocalHttpServer]) -> None:
    server = serve()
    status, headers, body = get(server, "/metrics", method)
    assert status == 405
    assert headers["Allow"] == "GET"
    if method == "HEAD":
        assert body == b""


def test_query_string_is_ignored_for_routing(serve: Callable[..., LocalHttpServer]) -> None:
    assert get(serve(), "/metrics?name[]=edgefleet_alarms")[0] == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "", "edge.example"])  # noqa: S104
def test_non_loopback_host_is_refused_naming_it(host: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(host))):
        LocalHttpServer(host, 0, AgentMetrics(), health=fixed(True), ready=fixed(True))
    with pytest.raises(ValidationError, match="allow_remote"):
        HttpConfig(host=host)


def test_allow_remote_lets_a_non_loopback_host_past_the_check() -> None:
    # 192.0.2.10 (TEST-NET-1) is on no interface here: with allow_remote the refusal is
    # the operating system's, at bind time, not the loopback check; nothing is exposed.
    assert HttpConfig(host="192.0.2.10", allow_remote=True).host == "192.0.2.10"
    server = LocalHttpServer(
        "192.0.2.10", 0, AgentMetrics(), health=fixed(True), ready=fixed(True), allow_remote=True
    )
    with pytest.raises(AgentError, match=re.escape("can't listen on 192.0.2.10")):
        server.start()


def test_ipv6_loopback_is_served() -> None:
    server = LocalHttpServer("::1", 0, AgentMetrics(), health=fixed(True), ready=fixed(True))
    server.start()
    try:
        conn = http.client.HTTPConnection("::1", server.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.stop()


def test_stop_closes_the_port(serve: Callable[..., LocalHttpServer]) -> None:
    server = serve()
    port = server.port
    server.stop()
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", port), timeout=2),
    ):
        pass


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """A request head one byte at a time, never finished; ends when cut off or told."""
    head = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 400
    for byte in head:  # 400+ bytes at 0.1 s: far past any deadline, bounded all the same
        if stop.wait(0.1):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def _closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closed ``sock`` within ``timeout_s`` (a bound, not a timing)."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_local_connections_do_not_make_healthz_and_metrics_unanswerable(
    serve: Callable[..., LocalHttpServer],
) -> None:
    server = serve(health=fixed(True, pool="ok"))
    silent: list[socket.socket] = []
    slow: list[socket.socket] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        # more slow clients than the server has places: half say nothing, half trickle
        for i in range(MAX_CONNECTIONS + 4):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if i % 2:
                slow.append(sock)
                thread = threading.Thread(target=_trickle, args=(sock, stop), daemon=True)
                thread.start()
                threads.append(thread)
            else:
                silent.append(sock)
        for _ in range(3):  # answered while they hang on, every time
            status, _, body = get(server, "/healthz")
            assert status == 200
            assert json.loads(body)["pool"] == "ok"
            status, _, body = get(server, "/metrics")
            assert status == 200
            assert b"edgefleet_" in body
        # and none of them is held for as long as it likes: each is cut off, unanswered
        for sock in [*silent, *slow]:
            assert _closed_by_server(sock, HEAD_DEADLINE_S + 10)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for sock in [*silent, *slow]:
            sock.close()


def test_a_kept_alive_connection_is_answered_again_and_then_cut_off_when_idle(
    serve: Callable[..., LocalHttpServer],
) -> None:
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(2):
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
        assert conn.sock is not None
        assert _closed_by_server(conn.sock, HEAD_DEADLINE_S + 10)
    finally:
        conn.close()
