"""The fault injectors that act inside a device: disk full, camera stream loss and the
clock jump (which must say when libfaketime can't do it)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hil import shell
from hil.errors import FaultUnavailable
from hil.faults_device import (
    CAMERA_PORT,
    FAKETIME_LIBS,
    CameraServer,
    CameraStreamLoss,
    ClockJump,
    DiskFull,
    mount_state_tmpfs,
)
from hil.sim import SimDevice
from tests.hil.conftest import run_in, wait_listening

READ_STREAM = f"""
import urllib.request
with urllib.request.urlopen("http://127.0.0.1:{CAMERA_PORT}/cam", timeout=10) as r:
    print(b"\\xff\\xd8" in r.read(20000))  # a JPEG starts in the multipart stream
"""


def _mounted(path: str) -> bool:
    return any(line.split()[1] == path for line in Path("/proc/mounts").read_text().splitlines())


def test_disk_full_fills_the_state_directory_to_enospc_and_clear_frees_it(sim: SimDevice) -> None:
    mount_state_tmpfs(sim, 4)
    state = Path(sim.state_dir)
    assert _mounted(str(state))
    fault = DiskFull(sim)
    with fault:
        with pytest.raises(OSError, match="No space left") as info:
            (state / "more").write_bytes(b"x" * 65536)
        assert info.value.errno == errno.ENOSPC
        assert fault.figures["free_kib_full"] == 0
    (state / "more").write_bytes(b"x" * 65536)
    assert fault.figures["free_kib_after"] > 3000
    sim.umount(str(state))
    assert not _mounted(str(state))


@pytest.fixture
def video(tmp_path: Path) -> Path:
    out = tmp_path / "clip.avi"
    subprocess.run(
        ["ffmpeg", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
         "testsrc=size=160x120:rate=15", "-t", "2", "-c:v", "mjpeg", str(out)],
        check=True,
        timeout=60,
    )  # fmt: skip
    return out


def test_camera_loss_takes_the_stream_away_and_back(sim: SimDevice, video: Path) -> None:
    server = CameraServer(sim, str(video))
    server.start()
    assert server.proc is not None
    wait_listening(sim, CAMERA_PORT, server.proc)
    assert run_in(sim, READ_STREAM).strip() == "True"
    fault = CameraStreamLoss(server)
    fault.apply()
    assert not sim.listening(CAMERA_PORT)
    with pytest.raises(subprocess.CalledProcessError) as info:
        run_in(sim, READ_STREAM)
    assert "Connection refused" in str(info.value.stderr)
    fault.clear()
    assert server.proc is not None
    wait_listening(sim, CAMERA_PORT, server.proc)
    assert run_in(sim, READ_STREAM).strip() == "True"
    server.stop()


def _sleep_works_under_faketime(lib: str, stamp: Path) -> bool:
    stamp.write_text("+0\n")
    env = {**os.environ, "LD_PRELOAD": lib, "FAKETIME_TIMESTAMP_FILE": str(stamp),
           "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.01)"],
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def test_clock_jump_is_available_exactly_when_libfaketime_keeps_sleep_working(
    sim: SimDevice, tmp_path: Path
) -> None:
    fault = ClockJump(sim, 3600)
    why = fault.unavailable()
    lib = next((x for x in FAKETIME_LIBS if Path(x).exists()), None)
    if lib is None:
        assert why is not None
        assert "not installed" in why
        return
    if not _sleep_works_under_faketime(lib, tmp_path / "stamp"):
        assert why is not None
        assert "time.sleep() fails" in why
        with pytest.raises(FaultUnavailable, match="clock-jump unavailable"):
            fault.prepare()
        return
    assert why is None
    fault.prepare()
    code = (
        "import time\nfor _ in range(100):\n    print(time.time(), flush=True)\n    time.sleep(0.1)"
    )
    proc = sim.spawn([sys.executable, "-c", code], name="clock", env=sim.agent_env)
    shell.wait_for(lambda: len(proc.tail(3).split()) >= 2, 10, "the clock reader")
    before = float(proc.tail(1))
    fault.apply()
    shell.wait_for(lambda: float(proc.tail(1)) > before + 3000, 10, "the jump")
    fault.clear()
    proc.stop(5)
