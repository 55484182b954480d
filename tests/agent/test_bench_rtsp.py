"""``edge-agent bench --source rtsp://...`` against a real RTSP server (GStreamer's, on
loopback) through the CLI: the stream's decode cost, the hot path from the live camera,
N streams on the same URL, and a stream that does not open named with its reason word.
No timed assertions: the figures are there and make sense."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent import bench
from agent.kernel.bundle import init_bundle

if TYPE_CHECKING:
    from tests.support.rtsp import RtspServer

pytest_plugins = ["tests.support.rtsp"]

REPO = Path(__file__).resolve().parents[2]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"
CLI_TIMEOUT_S = 90


def edge_agent_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "bench", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )


def test_bench_on_an_rtsp_stream_reports_decode_cost_and_each_of_two_streams_latency(
    rtsp_server: RtspServer, tmp_path: Path
) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    out = tmp_path / "rtsp.json"
    url = rtsp_server.url("/small")
    done = edge_agent_bench(
        "--bundle", str(bundle.path), "--source", url, "--duration", "1.5",
        "--workers", "1", "--cameras", "2", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert (r["source"], r["source_kind"], r["live"], r["transport"]) == (url, "rtsp", True, "tcp")
    assert r["frame_shape"] == [180, 320, 3]
    assert (r["frame_width"], r["frame_height"]) == (320, 180)
    assert r["frames_decoded"] > 0
    assert r["decode_ms_p50"] > 0
    assert r["decode_ms_basis"] == "process CPU per read"
    assert r["decode_cpu_per_frame_ms"] > 0
    assert r["stream_fps"] > 0
    assert r["cameras_full_at_stream_fps"] > 0
    # the load step ran from the live camera at its own rate
    assert r["frames_captured"] > 0
    assert r["decisions_per_s"] > 0
    assert r["e2e_p99_ms"] >= r["e2e_p50_ms"] > 0
    assert r["capacity_fps"] > 0
    # two RTSP sessions on the same URL, each camera's latency and what it captured
    assert r["cameras"] == 2
    assert set(r["per_camera"]) == {"cam1", "cam2"}
    for cam in r["per_camera"].values():
        assert cam["p99_ms"] > 0
        assert cam["frames_captured"] > 0
        assert cam["frames_expected"] == r["cameras_frames_expected"] > 0
    assert set(r["cameras_frames_captured"]) == {"cam1", "cam2"}
    assert isinstance(r["cameras_decode_kept_up"], bool)
    assert "staggered_per_camera" not in r  # a stream sets its own phase
    assert "cam2" in done.stdout
    assert "2 streams decoding" in done.stdout


def test_bench_on_a_wrong_rtsp_path_fails_naming_the_url_and_not_found(
    rtsp_server: RtspServer, tmp_path: Path
) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    url = rtsp_server.url("/no-such-stream")
    done = edge_agent_bench("--bundle", str(bundle.path), "--source", url, "--duration", "1")
    assert done.returncode != 0
    assert url in done.stderr
    assert "not_found" in done.stderr


def test_bench_refuses_a_password_in_the_url_without_repeating_it(tmp_path: Path) -> None:
    bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
    with pytest.raises(bench.AgentError, match="password in clear") as caught:
        bench.run_agent_bench(
            bundle.path, "rtsp://op:s3cret@127.0.0.1:1/cam", duration_s=1, progress=False
        )
    assert "s3cret" not in str(caught.value)
    assert "op:***@127.0.0.1:1/cam" in str(caught.value)
