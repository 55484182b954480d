"""``edge-agent bench --shadow``: the same load without and with a shadow candidate, and
the report's keys (no timed assertions: benches report figures, tests check they are
there and make sense together)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent import bench
from agent.benchreport import format_report
from agent.errors import AgentError
from agent.kernel.bundle import init_bundle

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
EDGE_AGENT = str(Path(sys.executable).parent / "edge-agent")


def write_video(path: Path, frames: int = 20) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25, (64, 48))
    rng = np.random.default_rng(5)
    for _ in range(frames):
        writer.write(rng.integers(0, 255, (48, 64, 3), np.uint8))
    writer.release()
    return path


def test_bench_with_a_shadow_reports_both_p99s_their_ratio_and_the_shadow_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "CALIBRATE_S", 0.5)
    live = init_bundle(TINY_TFLITE, tmp_path / "live", name="tiny", version="1.0.0")
    cand = init_bundle(TINY_TFLITE, tmp_path / "cand", name="tiny", version="2.0.0")
    video = write_video(tmp_path / "line.avi")
    r = bench.run_agent_bench(
        live.path,
        str(video),
        duration_s=1.0,
        workers=1,
        progress=False,
        shadow=cand.path,
        shadow_sample=0.5,
    )
    for key in (
        "e2e_p99_ms",
        "e2e_p99_ms_baseline",
        "p99_ratio",
        "shadow_frames",
        "shadow_skipped",
        "load",
        "load_share_of_capacity",
        "capacity_fps",
    ):
        assert key in r, key
    assert r["load"] == 0.6
    assert r["shadow_sample"] == 0.5
    assert r["e2e_p99_ms"] > 0
    assert r["e2e_p99_ms_baseline"] > 0
    assert r["p99_ratio"] == pytest.approx(r["e2e_p99_ms"] / r["e2e_p99_ms_baseline"], rel=1e-3)
    assert r["shadow_frames"] > 0
    assert r["shadow_skipped"] >= 0
    assert r["load_share_of_capacity"] > 0
    assert "with the shadow on 50% of the frames" in format_report(r)


def test_bench_without_a_shadow_has_no_shadow_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "CALIBRATE_S", 0.3)
    live = init_bundle(TINY_TFLITE, tmp_path / "live", name="tiny")
    video = write_video(tmp_path / "line.avi")
    r = bench.run_agent_bench(live.path, str(video), duration_s=0.3, workers=1, progress=False)
    assert "p99_ratio" not in r
    assert "e2e_p99_ms_baseline" not in r


@pytest.mark.parametrize("sample", [-0.1, 1.5])
def test_bench_refuses_a_shadow_sample_outside_0_1(tmp_path: Path, sample: float) -> None:
    live = init_bundle(TINY_TFLITE, tmp_path / "live", name="tiny")
    video = write_video(tmp_path / "line.avi")
    with pytest.raises(AgentError, match="shadow-sample"):
        bench.run_agent_bench(
            live.path, str(video), shadow=live.path, shadow_sample=sample, progress=False
        )


def test_bench_cli_with_a_missing_shadow_bundle_is_a_one_line_error(tmp_path: Path) -> None:
    live = init_bundle(TINY_TFLITE, tmp_path / "live", name="tiny")
    video = write_video(tmp_path / "line.avi")
    out = subprocess.run(
        [
            EDGE_AGENT,
            "bench",
            "--bundle",
            str(live.path),
            "--source",
            str(video),
            "--shadow",
            str(tmp_path / "nowhere"),
            "--quiet",
            "--json",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "nowhere" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
