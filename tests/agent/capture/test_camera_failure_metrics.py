"""A camera's failures reach its metrics by reason word: a real RTSP camera pointed at a
port where nothing listens is counted as ``refused`` in ``edgefleet_camera_failures``."""

from __future__ import annotations

import socket
import time

import pytest
from prometheus_client import generate_latest

from agent.capture import Camera
from agent.capture.config import CameraConfig
from agent.metrics import AgentMetrics
from agent.status import update_camera_metrics


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_rtsp_camera_is_counted_under_refused(closed_port: int) -> None:
    config = CameraConfig(
        name="door", kind="rtsp", uri=f"rtsp://127.0.0.1:{closed_port}/main",
        open_timeout_s=1.0, backoff_initial_s=0.2, backoff_max_s=0.5,
    )  # fmt: skip
    camera = Camera(config)
    camera.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and camera.stats().failures.get("refused", 0) < 2:
            time.sleep(0.05)
        stats = camera.stats()
    finally:
        camera.stop()
    assert stats.failures.get("refused", 0) >= 2, stats.failures
    metrics = AgentMetrics()
    update_camera_metrics(metrics, "door", stats)
    text = generate_latest(metrics.registry).decode()
    line = 'edgefleet_camera_failures_total{camera="door",reason="refused"} '
    (value,) = [ln[len(line) :] for ln in text.splitlines() if ln.startswith(line)]
    assert float(value) == stats.failures["refused"]
    assert 'edgefleet_camera_up{camera="door"} 0.0' in text
