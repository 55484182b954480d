"""Damage in an RTSP camera's video is counted and, when asked, not decided on: the real
RTSP server and the agent's camera in a network namespace of the test's own, where
nftables drops 5 % of the UDP packets (this kernel has no netem); the camera's stats,
its ``/healthz`` entry and its metrics count the lost packets, decode errors and damaged
frames, and ``damaged_frames = "skip"`` keeps damaged frames from its consumers. And the
lines of ffmpeg's error output that say damage, one by one."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.capture import CameraConfig
from agent.capture.damage import Damage, classify
from tests.support.rtsp import make_video

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[3]
LOSS_PERCENT = 5

# Run in the namespace: the RTSP server, and a camera reading it over UDP.
_CAMERA = """
import dataclasses, json, sys, time
from pathlib import Path
from agent.capture import Camera, CameraConfig
from agent.metrics import AgentMetrics
from agent.status import camera_health, update_camera_metrics
from tests.support.rtsp import RtspServer

video, policy = Path(sys.argv[1]), sys.argv[2]
server = RtspServer({"/h264": (video, "h264")})
server.start()
camera = Camera(CameraConfig(
    name="dock", kind="rtsp", uri=server.url("/h264"), fps=15, transport="udp",
    damaged_frames=policy,
))
camera.start()
deadline = time.monotonic() + 60
damaged = 0
while time.monotonic() < deadline:  # bounded: until enough damage was seen
    d = camera.stats().damage
    if d.lost_packets and d.damaged_frames >= 5 and d.concealed_frames:
        break
    frame = camera.latest(0.5)
    time.sleep(0.01)
camera.stop(timeout_s=10.0)  # the counts settle: no frame between counted and skipped
stats = camera.stats()
metrics = AgentMetrics()
update_camera_metrics(metrics, "dock", stats)
print(json.dumps({
    "stats": dataclasses.asdict(stats),
    "health": camera_health(stats),
    "metrics": [l for l in metrics.render().decode().splitlines() if l.startswith("edgefleet_")],
}), flush=True)
server.stop()
"""


@pytest.fixture
def lossy_netns() -> Iterator[str]:
    """A network namespace whose loopback drops :data:`LOSS_PERCENT` % of UDP packets."""
    name = f"ef-loss-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        rules = (
            "table inet loss {\n chain input {\n type filter hook input priority 0;"
            f" policy accept;\n meta l4proto udp numgen random mod 100 < {LOSS_PERCENT}"
            " drop\n }\n}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", name, "nft", "-f", "-"],
            input=rules.encode(), check=True, timeout=30,
        )  # fmt: skip
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def run_camera(netns: str, video: Path, policy: str) -> dict[str, object]:
    run = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", _CAMERA, str(video), policy],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, object] = json.loads(run.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("damage") / "h264.mp4", seconds=90)


@pytest.mark.parametrize("policy", ["keep", "skip"])
def test_rtsp_over_udp_with_packet_loss_counts_the_damage_and_skip_keeps_it_from_decisions(
    lossy_netns: str, video: Path, policy: str
) -> None:
    out = run_camera(lossy_netns, video, policy)
    stats = out["stats"]
    assert isinstance(stats, dict)
    damage = stats["damage"]
    assert damage["counted"] is True, stats
    assert damage["lost_packets"] > 0, damage
    assert damage["decode_errors"] > 0, damage
    assert damage["concealed_frames"] > 0, damage
    assert damage["damaged_frames"] >= 5, damage
    assert stats["decoder"] == "software (ffmpeg)"
    assert stats["frames_captured"] > 0  # whole frames still go through
    health = out["health"]
    assert isinstance(health, dict)
    assert health["damage"] == damage
    metrics = out["metrics"]
    assert isinstance(metrics, list)
    lost = f'edgefleet_camera_lost_packets_total{{camera="dock"}} {float(damage["lost_packets"])}'
    assert lost in metrics
    skipped = damage["skipped_frames"]
    line = f'edgefleet_camera_damaged_frames_total{{action="skipped",camera="dock"}} {skipped:.1f}'
    assert line in metrics
    if policy == "skip":
        assert skipped == damage["damaged_frames"]  # none of them was published
    else:
        assert skipped == 0


def test_the_lines_of_ffmpegs_error_output_that_say_damage() -> None:
    assert classify("[rtsp @ 0x55c4fceb7400] RTP: missed 2 packets") == ("lost_packets", 2)
    assert classify("pipe:0: corrupt decoded frame in stream 0") == ("concealed_frames", 1)
    assert classify("[h264 @ 0x55c4fd062000] error while decoding MB 6 16") == (
        "decode_errors",
        1,
    )
    assert classify("[hevc @ 0x1] Could not find ref with POC 12") == ("decode_errors", 1)
    assert classify("[rtsp @ 0x55c4fceb7400] max delay reached. need to consume packet") is None
    assert classify("camera text [h264 @ 0x1] not at the start") is None
    damage = Damage()
    assert damage.frame() is False
    assert damage.line("[h264 @ 0x1] error while decoding MB 1 1")
    assert damage.frame() is True  # reported before this frame
    assert damage.frame() is False  # and not the next
    snap = damage.snapshot()
    assert (snap.decode_errors, snap.damaged_frames) == (1, 1)


def test_damaged_frames_on_a_camera_that_is_not_rtsp_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="damaged_frames applies to rtsp cameras only"):
        CameraConfig(name="f", kind="file", uri="a.mp4", damaged_frames="skip")
