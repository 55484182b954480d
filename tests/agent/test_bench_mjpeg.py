"""``edge-agent bench --source http://...`` on an MJPEG camera that serves one client only
(ffmpeg's HTTP server, as some cheap cameras): the decode step reads it, the camera is
gone when the load step opens it again, and the bench fails naming the camera and why,
instead of reporting a run with nothing in it."""

from __future__ import annotations

from pathlib import Path

from agent.kernel.bundle import init_bundle
from tests.agent.test_bench_rtsp import TINY_TFLITE, edge_agent_bench
from tests.support.streams import MjpegServer


def test_a_camera_gone_after_the_decode_step_fails_the_bench_with_its_reason(
    tmp_path: Path,
) -> None:
    server = MjpegServer(tmp_path, size="320x240", rate=15)
    server.start()
    try:
        bundle = init_bundle(TINY_TFLITE, tmp_path / "tiny")
        done = edge_agent_bench(
            "--bundle", str(bundle.path), "--source", server.url, "--duration", "1",
            "--workers", "1", "--json", str(tmp_path / "out.json"),
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode != 0, done.stdout
    assert "nothing to measure" in done.stderr, done.stderr[-2000:]
    assert f"can't open {server.url}" in done.stderr
    assert "(refused)" in done.stderr
    assert not (tmp_path / "out.json").exists()  # no report with zeros in it
