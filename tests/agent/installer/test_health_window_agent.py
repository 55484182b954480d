"""The health window in a running agent: its own probe (:class:`AgentProbe`) switches the
pipelines to the new bundle and reads their counters since that switch.

A bundle whose every live inference fails, or never completes, is rolled back while the
machine is loaded, and the line decides with the previous bundle again. A line whose
camera delivers nothing commits, marked idle (docs/adr/0019-health-window-idle-line.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.app import Agent
from agent.config import parse_config
from agent.directives.service import AgentProbe
from agent.installer import Installer
from agent.installer.errors import InstallError
from agent.pipeline.runner import Decision
from tests.agent.installer.installer_helpers import (
    PROFILE,
    make_bright_fails_bundle,
    make_bright_hangs_bundle,
    make_bundle,
)

WINDOW = {"health_window_s": 2.0, "health_poll_s": 0.2, "run_timeout_s": 2.0, "benchmark_runs": 5}


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@contextmanager
def _cpu_load() -> Iterator[None]:
    """A busy process on every core for the duration (ended, and reaped, after)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for p in hogs:
            p.kill()
        for p in hogs:
            p.wait(10)


def _config(state: Path, camera: dict[str, Any]) -> Any:
    return parse_config(
        {
            "agent": {"device_id": "gw-health-1", "state_dir": str(state), "profile": PROFILE},
            "runtime": {"workers": 1, "pin": False},
            "decision_log": {"thumbnails": "none"},
            "cameras": [camera],
            "pipelines": [{"name": "p", "source": "c1", "installed": "cls"}],
            "bundles": {"installer": WINDOW},
        }
    )


class _Versions:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, d: Decision, _id: str) -> None:
        with self.lock:
            self.seen.append(d.record.model_version)

    def since(self, n: int) -> list[str]:
        with self.lock:
            return self.seen[n:]

    def count(self) -> int:
        with self.lock:
            return len(self.seen)


def _installer(agent: Agent) -> Installer:
    assert agent.installer is not None
    return agent.installer


def _active_digest(inst: Installer) -> str | None:
    rows = [s for s in inst.status() if s.active and s.bundle is not None]
    return rows[0].bundle.digest if rows and rows[0].bundle else None


@pytest.mark.parametrize(
    ("make_bad", "why"),
    [
        (make_bright_fails_bundle, "inference error"),
        (make_bright_hangs_bundle, "no inference completed since the switch"),
    ],
    ids=["every-inference-fails", "no-inference-completes"],
)
def test_a_bundle_whose_every_inference_fails_under_load_is_rolled_back(
    tmp_path: Path, make_bad: Callable[..., Any], why: str
) -> None:
    """The camera's noise is bright: the candidate passes its self-benchmark (a dark
    frame) and then fails, or hangs on, every live frame."""
    good = make_bundle(tmp_path, version="1.1.0", release=1)
    bad = make_bad(tmp_path, version="1.2.0", release=2)
    versions = _Versions()
    camera = {"name": "c1", "kind": "synthetic", "fps": 30, "pattern": "noise"}
    agent = Agent(_config(tmp_path / "state", camera), http=False, on_decision=versions)
    agent.start()
    try:
        inst = _installer(agent)
        first = inst.install(good.path, source="test", health_probe=AgentProbe(agent, "cls"))
        assert first.outcome == "committed", first
        assert _wait(lambda: "1.1.0" in versions.since(0), 30), "not deciding with 1.1.0"

        with _cpu_load(), pytest.raises(InstallError) as err:
            inst.install(bad.path, source="test", health_probe=AgentProbe(agent, "cls"))
        assert err.value.step == "health"
        assert why in err.value.reason, err.value.reason
        assert _active_digest(inst) == good.digest

        assert agent.reload_if_changed()  # what the directives service does after a failure
        n = versions.count()
        assert _wait(lambda: versions.since(n).count("1.1.0") >= 3, 60), "not back on 1.1.0"
        assert "1.2.0" not in versions.since(n)
    finally:
        agent.stop()


def test_a_line_whose_camera_delivers_nothing_commits_marked_idle(tmp_path: Path) -> None:
    """An RTSP camera nothing answers at: no frame reaches the bundle during the window."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the camera dials it: refused
    good = make_bundle(tmp_path, version="1.1.0", release=1)
    camera = {"name": "c1", "kind": "rtsp", "uri": f"rtsp://127.0.0.1:{port}/none"}
    agent = Agent(_config(tmp_path / "state", camera), http=False)
    agent.start()
    try:
        reports: list[dict[str, Any]] = []
        inst = _installer(agent)
        inst.on_report = reports.append
        result = inst.install(good.path, source="test", health_probe=AgentProbe(agent, "cls"))
        assert result.outcome == "committed"
        assert result.health is not None
        assert (result.health["frames"], result.health["inferences"]) == (0.0, 0.0)
        assert reports[-1]["status"] == "committed"
        assert reports[-1]["health_idle"] is True
        assert _active_digest(inst) == good.digest
    finally:
        agent.stop()
