"""The store-and-forward drain bench at a small size, run as `make bench` runs it, with the
agent as `edge-agent run` in two processes and in one: every backlog decision reaches the
fleet database once, and both latency phases have figures from the device's decision log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.agent.installer.installer_helpers import make_bundle

BACKLOG = 1000  # 10 batches of 100: the exactly-once and batching checks hold at any size


def _video(path: Path, frames: int = 30) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10.0, (64, 48))
    for i in range(frames):
        writer.write(np.full((48, 64, 3), (i * 8) % 256, np.uint8))
    writer.release()
    return path


def _bench(*args: str, timeout_s: float = 110) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hil.cli", "bench", "drain", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize("mode", ["two-process", "single-process"])
def test_the_backlog_is_stored_once_and_both_phases_have_latency_figures(
    tmp_path: Path, mode: str
) -> None:
    bundle = make_bundle(tmp_path)
    out = tmp_path / "drain.json"
    proc = _bench(
        "--bundle", str(bundle.path), "--source", str(_video(tmp_path / "line.avi")),
        "--backlog", str(BACKLOG), "--duration", "2", "--workers", "1",
        "--drain-timeout", "60", "--set", "decisions_batch=100", "--json", str(out), "-q",
        *(["--single-process"] if mode == "single-process" else []),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["mode"] == mode
    assert r["agent_exit_code"] == 0  # stopped by SIGTERM, in order
    # the CPU of each of edge-agent run's processes, by role
    roles = set(r["cpu_drain"]["processes_cores"])
    expected = {"supervisor", "hotpath", "companion"} if mode == "two-process" else {"agent"}
    assert expected <= roles, roles
    assert r["drained"] is True, r
    assert r["backlog_written"] == BACKLOG
    assert r["backlog_decided_offline"] >= r["idle_decisions"] > 0
    assert r["backlog_decisions"] == BACKLOG + r["backlog_decided_offline"]
    # the fleet's copy is the device's backlog, each decision once
    assert r["stored_decisions"] == r["backlog_decisions"]
    assert r["missing"] == 0
    assert r["not_in_device_log"] == 0
    assert r["stored_twice"] == 0
    assert r["ingest_duplicates"] == 0
    assert r["ingest_quarantined"] == 0
    assert r["ingest_stored"] >= r["backlog_records"]
    assert r["backlog_outbox_records"] >= 1  # the health report queued while offline
    assert r["records_stored"] == r["backlog_records"]
    assert r["uplink"]["decisions_uploaded"] >= r["backlog_decisions"]
    assert r["records_per_s"] > 0
    assert r["drain_s"] > 0
    assert r["idle_p99_ms"] > 0
    assert r["drain_p99_ms"] > 0
    assert r["drain_decisions"] > 0
    assert r["p99_ratio"] > 0
    assert r["machine"]["cores"] >= 1
    assert r["settings"]["decisions_batch"] == 100
    assert r["uplink"]["decision_batches"] >= r["backlog_decisions"] / 100
    assert f"= {r['backlog_records']} records" in proc.stdout
    assert "records/s" in proc.stdout
    assert "p99" in proc.stdout


def test_a_bad_uplink_setting_is_refused_naming_the_field(tmp_path: Path) -> None:
    proc = _bench(
        "--bundle", str(tmp_path / "none"), "--set", "drain_window=0", timeout_s=30
    )  # fmt: skip
    assert proc.returncode == 2
    assert "drain_window" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_bundle_is_named_in_one_line(tmp_path: Path) -> None:
    video = _video(tmp_path / "line.avi")
    proc = _bench("--bundle", str(tmp_path / "nope"), "--source", str(video), timeout_s=30)
    assert proc.returncode == 2
    assert "nope" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_shows_an_example() -> None:
    proc = _bench("--help", timeout_s=30)
    assert proc.returncode == 0
    assert "example: hil bench drain" in proc.stdout
