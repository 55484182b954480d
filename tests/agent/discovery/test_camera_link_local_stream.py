"""An RTSP camera at a zoned IPv6 link-local address, as ``edge-agent cameras`` and
``setup`` write it (RFC 6874: ``rtsp://[fe80::1%25ea]:PORT/...``), is opened by the agent
over a real veth link and its failed open is probed there too. FFmpeg itself does not
open that form ("Port missing in uri"); the agent hands it ``[fe80::1%ea]``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.agent.discovery.onvif_camera import REPO, onvif_camera
from tests.support.rtsp import SERVER_SCRIPT, SYSTEM_PYTHON, make_video

PORT = 8554  # in the camera's own namespace: nothing else listens there

# Run in the gateway's namespace: a camera on the stream, one on a wrong path.
_GATEWAY = """
import json, sys, time
from agent.capture import Camera, CameraConfig
uri = sys.argv[1]
good = Camera(CameraConfig(name="dock", kind="rtsp", uri=uri + "/h264", fps=5))
bad = Camera(CameraConfig(name="gate", kind="rtsp", uri=uri + "/nothing"))
good.start(); bad.start()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    if good.stats().frames_captured >= 5 and bad.stats().errors >= 1:
        break
    time.sleep(0.1)
print(json.dumps({
    "frames": good.stats().frames_captured,
    "failure": bad.stats().failure,
    "error": bad.stats().last_error,
}), flush=True)
good.stop(timeout_s=10.0); bad.stop(timeout_s=10.0)
"""


def test_a_camera_at_a_zoned_link_local_address_captures_and_its_failure_is_probed(
    tmp_path: Path,
) -> None:
    video = make_video(tmp_path / "h264.mp4", "h264", seconds=30)
    with onvif_camera(families="6") as cam:
        uri = f"rtsp://[{cam.cam6}%25ea]:{PORT}"
        # FFmpeg alone: the RFC 6874 form is not opened, the plain zone is
        probe = textwrap.dedent(f"""
            import cv2
            for uri in ("{uri}/h264", "rtsp://[{cam.cam6}%ea]:{PORT}/h264"):
                cap = cv2.VideoCapture(uri, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 5000])
                print(cap.isOpened(), flush=True)
                cap.release()
        """)
        server = subprocess.Popen(
            ["ip", "netns", "exec", cam.ns, SYSTEM_PYTHON, str(SERVER_SCRIPT),
             "--port", str(PORT), "--address", "::", "--mount", f"/h264={video}:h264"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == f"ready {PORT}"
            bare = subprocess.run(
                ["ip", "netns", "exec", cam.gw, sys.executable, "-c", probe],
                capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
            )  # fmt: skip
            run = subprocess.run(
                ["ip", "netns", "exec", cam.gw, sys.executable, "-c", _GATEWAY, uri],
                capture_output=True, text=True, timeout=90, check=False, cwd=REPO,
            )  # fmt: skip
        finally:
            server.kill()
            server.communicate(timeout=10)
    assert bare.stdout.split() == ["False", "True"], bare.stdout + bare.stderr[-2000:]
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    assert seen["frames"] >= 5, seen
    assert seen["failure"] == "not_found", seen
    assert "RTSP 404" in seen["error"]
