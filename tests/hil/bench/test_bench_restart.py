"""The restart bench at its smallest (one kill of each process), run as `make bench` runs
it: `edge-agent run` recovers from each kill, and the JSON has every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

from tests.agent.installer.installer_helpers import make_bundle


def _video(path: Path, frames: int = 30) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10.0, (64, 48))
    for i in range(frames):
        writer.write(np.full((48, 64, 3), (i * 8) % 256, np.uint8))
    writer.release()
    return path


def _bench(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hil.cli", "bench", "restart", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_one_kill_of_each_process_is_measured_and_the_agent_recovers(tmp_path: Path) -> None:
    out = tmp_path / "restart.json"
    proc = _bench(
        "--bundle", str(make_bundle(tmp_path).path), "--source", str(_video(tmp_path / "v.avi")),
        "--kills", "1", "--fps", "10", "--workers", "1", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["kills"] == 1
    assert r["companion_kills"] == 1
    for key in ("hotpath_to_decision_s", "hotpath_to_logged_s",
                "hotpath_start_to_decision_s",
                "companion_to_healthz_s", "companion_respawn_s"):  # fmt: skip
        assert len(r[key]) == 1, key
        assert r[key][0] > 0, (key, r[key])
    # the profile keeps a standby hot path, started before the kill: it took over
    assert r["hotpath_standby_takeovers"] == 1
    assert r["hotpath_respawn_s"][0] < 0
    assert r["hotpath_exec_to_start_s"] == []
    assert r["hotpath_to_decision_median_s"] == r["hotpath_to_decision_max_s"] > 0
    assert r["companion_to_healthz_median_s"] == r["companion_to_healthz_max_s"] > 0
    # the decision is in the log after it was made; the companion waits out its backoff
    assert r["hotpath_to_logged_s"][0] >= r["hotpath_to_decision_s"][0]
    assert r["companion_respawn_s"][0] >= 1.0
    assert isinstance(r["target_met"], bool)
    assert r["target_s"] == 2.0
    assert r["log_integrity"] == "ok"
    assert r["agent_exit"] == 0
    assert r["machine"]["cores"] >= 1
    assert r["settings"]["workers"] == 1
    assert "hot path SIGKILLed x1" in proc.stdout
    assert "kill 1/1" in proc.stderr


def test_a_missing_bundle_is_named_in_one_line(tmp_path: Path) -> None:
    proc = _bench("--bundle", str(tmp_path / "nope"), "--source", str(tmp_path), timeout_s=30)
    assert proc.returncode == 2
    assert "nope" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_shows_an_example() -> None:
    proc = _bench("--help", timeout_s=30)
    assert proc.returncode == 0
    assert "example: hil bench restart" in proc.stdout
