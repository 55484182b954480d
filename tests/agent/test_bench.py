"""``edge-agent bench`` end to end on a tiny model: the report's keys and their sense
(no timed assertions: benches report figures, tests check they are there)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from agent import bench
from agent.benchreport import format_report
from agent.kernel.bundle import init_bundle

REPO = Path(__file__).resolve().parents[2]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"


def write_video(path: Path, frames: int = 20) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25, (64, 48))
    rng = np.random.default_rng(5)
    for _ in range(frames):
        writer.write(rng.integers(0, 255, (48, 64, 3), np.uint8))
    writer.release()
    return path


def test_bench_with_two_cameras_reports_each_camera_each_process_and_each_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "CALIBRATE_S", 0.5)
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    video = write_video(tmp_path / "line.avi")
    r = bench.run_agent_bench(
        bundle.path, str(video), duration_s=0.6, workers=2, progress=False, cameras=2
    )
    assert r["cameras"] == 2
    assert (r["source_kind"], r["live"]) == ("file", False)
    assert 0 < r["frames_decoded"] <= 20
    assert r["decode_ms_p50"] > 0
    assert r["decode_ms_basis"] == "wall per read"
    assert r["decode_cpu_per_frame_ms"] > 0
    assert r["stream_fps"] == pytest.approx(25)
    assert r["cameras_full_at_stream_fps"] > 0
    assert r["frames_in_flight"] == 2
    assert r["capacity_offered_fps"] == pytest.approx(
        min(bench.MAX_FPS, bench.OFFER_OVER_BARE * 2 * r["bare_rps"]), rel=0.01
    )
    assert set(r["per_camera_p99_ms"]) == {"cam1", "cam2"}
    assert set(r["staggered_per_camera_p99_ms"]) == {"cam1", "cam2"}
    assert all(v > 0 for v in r["per_camera_p99_ms"].values())
    assert r["single_camera_p99_ms"] == r["e2e_p99_ms"] > 0
    assert r["per_camera_p99_over_single_max"] > 0
    for cam in r["per_camera"].values():
        assert cam["decisions_per_s"] > 0
        assert cam["starved"] is False
    assert set(r["rss_mb_by_process"]) == {"agent", "worker 0", "worker 1"}
    assert r["rss_mb"] == pytest.approx(sum(r["rss_mb_by_process"].values()), abs=0.2)
    assert r["cold_start_to_first_decision_s"] > 0
    assert {"take", "submit", "wait", "postprocess", "emit", "e2e"} <= set(r["stages_ms"])
    assert "inference" in r["pool_stages_ms"]
    text = format_report(r)
    assert "cam2" in text
    assert "phases staggered" in text
    assert "CPU" in text


def test_bench_refuses_zero_cameras(tmp_path: Path) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    video = write_video(tmp_path / "line.avi")
    with pytest.raises(bench.AgentError, match="at least one camera"):
        bench.run_agent_bench(bundle.path, str(video), cameras=0, progress=False)
