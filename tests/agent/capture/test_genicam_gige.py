"""GenICam over a real GigE Vision link: ``arv-fake-gv-camera-0.8`` (Aravis's GigE Vision
camera simulator) in a network namespace of the test's own, joined by a veth pair to a
second namespace where the agent's code runs (``ip netns exec``): the camera found by its
serial number through GigE Vision discovery (broadcast on the link), software triggers
answered one frame each, the camera killed (reason word) and started again (recovery),
and the link losing stream packets to nftables (lost packets and incomplete frames
counted, no incomplete frame handed on). And a hardware-triggered camera found by its
user id (the simulator on a link to this namespace, :mod:`hil.gige_camera`), which sends
nothing while its line is idle: not a stall, and a camera gone meanwhile still noticed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.capture import Camera, CameraConfig
from hil.gige_camera import GigeCamera

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[3]
FAKE = "arv-fake-gv-camera-0.8"
SERIAL = "GVTEST01"
AGENT_IP, CAMERA_IP = "192.0.2.1", "192.0.2.2"


@dataclass
class Link:
    agent_ns: str
    camera_ns: str
    camera_if: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


@pytest.fixture
def link() -> Iterator[Link]:
    """Two namespaces joined by a veth pair: the agent's (``ga``, 192.0.2.1/24) and the
    camera's (``gc``, 192.0.2.2/24)."""
    assert shutil.which(FAKE), f"{FAKE} missing: make sysdeps"
    tag = uuid.uuid4().hex[:6]
    agent_ns, camera_ns = f"ef-gva-{tag}", f"ef-gvc-{tag}"
    _ip("netns", "add", agent_ns)
    _ip("netns", "add", camera_ns)
    try:
        _ip("-n", agent_ns, "link", "add", "ga", "type", "veth", "peer", "gc", "netns", camera_ns)
        for ns, dev, addr in ((agent_ns, "ga", AGENT_IP), (camera_ns, "gc", CAMERA_IP)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "brd", "+", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield Link(agent_ns, camera_ns, "gc")
    finally:
        for ns in (agent_ns, camera_ns):
            subprocess.run(
                ["ip", "netns", "pids", ns], check=False, capture_output=True, timeout=10
            )
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=10)


def start_camera(link: Link) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["ip", "netns", "exec", link.camera_ns, FAKE, "-i", link.camera_if, "-s", SERIAL],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop_camera(camera: subprocess.Popen[bytes]) -> None:
    camera.kill()
    camera.wait(10)


@pytest.fixture
def gv_camera(link: Link) -> Iterator[subprocess.Popen[bytes]]:
    camera = start_camera(link)
    yield camera
    stop_camera(camera)


def in_agent_ns(link: Link, script: str, *args: str, timeout: float = 90) -> dict[str, Any]:
    """Run ``script`` with Python in the agent's namespace; its last line is JSON."""
    run = subprocess.run(
        ["ip", "netns", "exec", link.agent_ns, sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    return result


# A software-triggered camera read by serial number; the camera process is killed and
# started again between two rounds of triggers (by the test, through a file it waits on).
_TRIGGERS = """
import json, sys, time
from pathlib import Path
from agent.capture import Camera, CameraConfig
serial, rounds, handshake = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
camera = Camera(CameraConfig.model_validate({
    "name": "gv", "kind": "genicam", "uri": serial, "trigger_mode": "software",
    "stall_timeout_s": 1.0, "backoff_initial_s": 0.1, "backoff_max_s": 0.5,
    "genicam": {"pixel_format": "BayerRG8", "exposure_us": 1000, "roi": [0, 0, 256, 128]},
}))
camera.start()

def triggers(n, wait_s):
    got = []
    deadline = time.monotonic() + wait_s
    while len(got) < n and time.monotonic() < deadline:
        fired = time.perf_counter_ns()
        camera.software_trigger()
        frame = camera.latest(2.0)
        if frame is not None:
            got.append({"seq": frame.seq, "shape": list(frame.image.shape),
                        "after_trigger": frame.t_capture_ns >= fired})
    return got

out = {"first": triggers(5, 30)}
handshake.write_text("kill")
deadline = time.monotonic() + 30
while camera.stats().failure == "" and time.monotonic() < deadline:
    camera.software_trigger()
    time.sleep(0.1)
out["down"] = {"failure": camera.stats().failure, "error": camera.stats().last_error}
handshake.write_text("start")
out["after"] = triggers(3, 40)
camera.stop(timeout_s=5)
s = camera.stats()
out["failures"] = dict(s.failures)
out["genicam"] = s.genicam
print(json.dumps(out))
"""


def test_software_triggers_over_gige_and_a_killed_camera_is_reported_and_reopened(
    link: Link, tmp_path: Path
) -> None:
    camera = start_camera(link)
    handshake = tmp_path / "handshake"
    handshake.write_text("")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", link.agent_ns, sys.executable, "-c", _TRIGGERS, SERIAL, "5",
         str(handshake)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while handshake.read_text() != "kill" and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        stop_camera(camera)
        while handshake.read_text() != "start" and time.monotonic() < deadline + 30:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        camera = start_camera(link)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
        stop_camera(camera)
    assert proc.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.splitlines()[-1])
    first = out["first"]
    assert [f["seq"] for f in first] == [0, 1, 2, 3, 4]
    assert all(f["shape"] == [128, 256, 3] and f["after_trigger"] for f in first)
    assert out["down"]["failure"] in ("timeout", "unreachable"), out["down"]
    assert len(out["after"]) == 3, out  # reopened once the camera came back
    g = out["genicam"]
    assert g["device"] == f"Aravis Fake {SERIAL}"
    assert g["frames"] == g["software_triggers"] - g["missed_triggers"]
    assert sum(out["failures"].values()) >= 1


# A free-running camera (128x128 Mono8: 12 stream packets a frame) on a link that loses
# 3 % of its large UDP packets (the stream's; control packets are small): frames read until
# some came incomplete, then the counters. The simulator does not resend (it does not
# announce the capability), so resent packets stay 0 here.
_LOSSY = """
import dataclasses, json, sys, time
from agent.capture import Camera, CameraConfig
camera = Camera(CameraConfig.model_validate({
    "name": "gv", "kind": "genicam", "uri": sys.argv[1], "fps": 1000,
    "genicam": {"pixel_format": "Mono8", "frame_rate": 100, "packet_size": 1400,
                "roi": [0, 0, 128, 128]},
}))
camera.start()
published = 0
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    frame = camera.latest(1.0)
    published += frame is not None
    g = camera.stats().genicam
    if published >= 20 and g.get("incomplete_frames", 0) >= 5:
        break
camera.stop(timeout_s=5)
s = camera.stats()
print(json.dumps({"published": s.frames_captured, "skipped": s.frames_skipped,
                  "genicam": s.genicam,
                  "damage": dataclasses.asdict(s.damage)}))
"""


def test_a_lossy_link_is_counted_and_no_incomplete_frame_is_handed_on(
    link: Link, gv_camera: subprocess.Popen[bytes]
) -> None:
    rules = (
        "table inet loss {\n chain output {\n type filter hook output priority 0;"
        " policy accept;\n meta l4proto udp meta length > 1000 numgen random mod 100 < 3"
        " drop\n }\n}\n"
    )
    subprocess.run(
        ["ip", "netns", "exec", link.camera_ns, "nft", "-f", "-"],
        input=rules.encode(), check=True, timeout=30,
    )  # fmt: skip
    out = in_agent_ns(link, _LOSSY, CAMERA_IP)
    g = out["genicam"]
    assert g["missing_packets"] > 0, g
    assert g["incomplete_frames"] > 0, g
    assert g["incomplete_by_status"]["missing_packets"] > 0
    # every frame handed on came complete: the published ones are the complete ones (less
    # any the camera skipped as closer than 1/fps to the last, by their camera times)
    assert out["published"] + out["skipped"] == g["frames"]
    assert out["published"] >= 20
    assert out["damage"]["damaged_frames"] == out["damage"]["skipped_frames"]
    assert out["damage"]["damaged_frames"] == g["incomplete_frames"]


def agent_cli(link: Link, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` in the agent's namespace."""
    return subprocess.run(
        ["ip", "netns", "exec", link.agent_ns, str(Path(sys.executable).parent / "edge-agent"),
         *args],
        capture_output=True, text=True, timeout=90, check=False, cwd=tmp_path,
    )  # fmt: skip


def test_cameras_and_setup_find_the_gige_camera_by_broadcast_and_write_its_section(
    link: Link, gv_camera: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    run = agent_cli(
        link, tmp_path, "cameras", "--json", "--timeout", "0.5", "--interface", "ga", "--ip", "4"
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)["genicam"]
    assert found["error"] == ""
    [cam] = found["cameras"]
    assert (cam["vendor"], cam["model"], cam["serial"]) == ("Aravis", "Fake", SERIAL)
    assert (cam["interface"], cam["address"]) == ("GigEVision", CAMERA_IP)
    assert cam["user_id"] == ""  # the simulator has no DeviceUserID
    assert cam["note"] == ""  # opened and asked
    listed = agent_cli(
        link, tmp_path, "setup", "--list-cameras", "--sysfs-root", str(tmp_path / "no-sysfs"),
        "--discover-timeout", "0.5", "--discover-interface", "ga", "--discover-ip", "4",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert f"Aravis Fake serial {SERIAL}  [GigEVision {CAMERA_IP}]" in listed.stdout
    assert f"choose: --camera genicam:{SERIAL}" in listed.stdout
    setup = agent_cli(
        link, tmp_path, "setup", "--config", str(tmp_path / "agent.toml"),
        "--state-dir", str(tmp_path / "state"), "--credentials-dir", str(tmp_path / "creds"),
        "--systemd-dropin-dir", "", "--sysfs-root", str(tmp_path / "no-sysfs"),
        "--profile", "x86-gateway", "--device-id", "gw-1",
        "--camera", f"genicam:{SERIAL}",
    )  # fmt: skip
    assert setup.returncode == 0, setup.stdout + setup.stderr
    text = (tmp_path / "agent.toml").read_text()
    assert 'kind = "genicam"' in text
    assert f'uri = "{SERIAL}"' in text
    check = agent_cli(link, tmp_path, "check-config", "--config", str(tmp_path / "agent.toml"))
    assert check.returncode == 0, check.stdout + check.stderr
    missing = agent_cli(
        link, tmp_path, "setup", "--config", str(tmp_path / "b.toml"),
        "--state-dir", str(tmp_path / "state-b"), "--systemd-dropin-dir", "",
        "--sysfs-root", str(tmp_path / "no-sysfs"), "--profile", "x86-gateway",
        "--device-id", "gw-1", "--camera", "genicam:NOSUCH",
    )  # fmt: skip
    assert missing.returncode != 0
    assert f"no GenICam camera 'NOSUCH' found (found: {SERIAL})" in missing.stderr


def test_a_hardware_triggered_camera_found_by_its_user_id_is_not_stalled_by_an_idle_line(
    tmp_path: Path,
) -> None:
    # The simulator in hardware trigger mode sends nothing: its input line stays idle.
    stall_s = 0.5
    with GigeCamera(serial="GVIDLE01", log=tmp_path / "camera.log") as gige:
        gige.set_user_id("press-3")  # what an integrator names the camera (DeviceUserID)
        camera = Camera(
            CameraConfig.model_validate(
                {
                    "name": "hw", "kind": "genicam", "uri": "press-3",
                    "trigger_mode": "hardware", "stall_timeout_s": stall_s,
                    "backoff_initial_s": 0.1, "backoff_max_s": 0.5,
                    "genicam": {"trigger_source": "Line0", "pixel_format": "Mono8"},
                }
            )
        )  # fmt: skip
        camera.start()
        try:
            deadline = time.monotonic() + 30
            while not camera.stats().genicam["read_back"] and time.monotonic() < deadline:
                time.sleep(0.05)
            opened = camera.stats()
            assert opened.genicam["read_back"]["TriggerSource"] == "Line0", opened.last_error
            assert opened.genicam["device"] == "Aravis Fake GVIDLE01"  # found by user id
            time.sleep(6 * stall_s)  # idle for six stall timeouts
            idle = camera.stats()
            assert idle.frames_captured == 0
            assert (idle.errors, idle.reopens, idle.failures) == (0, 0, {}), idle.last_error
            gige.kill()  # unplugged while the line is idle: the agent's probe notices
            deadline = time.monotonic() + 30
            while camera.stats().failure == "" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert camera.stats().failure in ("timeout", "unreachable"), camera.stats()
        finally:
            camera.stop(timeout_s=5)
