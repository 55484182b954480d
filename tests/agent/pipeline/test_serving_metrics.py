"""A camera's drop ratio and starved flag reach the agent's metrics (read from the
camera's stats when the registry is rendered)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.app import Agent
from agent.config import parse_config
from agent.kernel.bundle import init_bundle

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"


def test_a_served_camera_shows_as_not_starved_in_the_metrics(tmp_path: Path) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    cfg = parse_config(
        {
            "agent": {"device_id": "d", "state_dir": str(tmp_path / "state")},
            "runtime": {"workers": 1, "heartbeat_timeout_s": 30},
            "decision_log": {"thumbnails": "none"},
            "cameras": [{"name": "cam", "kind": "synthetic", "fps": 20, "width": 32, "height": 24}],
            "pipelines": [{"name": "p", "source": "cam", "bundle": str(bundle.path)}],
        }
    )
    agent = Agent(cfg, http=False)
    agent.start()
    try:
        deadline = time.monotonic() + 30
        while agent.first_decision_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.first_decision_at is not None, agent.problems
        text = agent.metrics.render().decode()
        assert 'edgefleet_camera_starved{camera="cam"} 0.0' in text
        assert 'edgefleet_camera_drop_ratio{camera="cam"}' in text
        assert agent.runners[0].in_flight == 1  # one per worker
    finally:
        agent.stop()
