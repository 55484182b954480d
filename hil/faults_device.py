"""Fault injectors that act inside the device: disk full, camera stream loss, clock jump.

- Disk full: the agent's state directory is a small tmpfs (mounted before the agent
  starts, :func:`mount_state_tmpfs`); the fault fills it with a filler file until the
  kernel says ENOSPC, and deletes the filler to clear.
- Camera stream loss: the camera is an MJPEG server (ffmpeg replaying the video) on the
  device's loopback (:class:`CameraServer`); the fault kills it and clears by starting
  it again.
- Clock jump: the agent runs under libfaketime (``LD_PRELOAD``, a timestamp file read on
  every call, monotonic clocks left alone); the fault writes an offset into the file. A
  probe first checks that libfaketime keeps ``time.sleep`` working in the device's
  Python: libfaketime 0.9.10 (Debian 12) fails it with EINVAL when monotonic clocks are
  not faked, and faking them as well would make every timeout jump, so the injector
  reports itself unavailable there instead of pretending.
"""

from __future__ import annotations

import shlex
from typing import Any

from hil.device import Device, RunningProc
from hil.errors import CommandFailed, FaultUnavailable
from hil.faults import Fault

CAMERA_PORT = 8090
FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
_FILLER = ".hil-filler"


def mount_state_tmpfs(device: Device, size_mb: int) -> None:
    """Make the device's state directory a ``size_mb`` MiB tmpfs (before enrolling and
    starting the agent).

    Raises:
        CommandFailed: mount refused.
    """
    device.mount_tmpfs(device.state_dir, size_mb)


def free_kib(device: Device, path: str) -> int:
    """Free KiB on the file system holding ``path`` (``df`` on the device)."""
    out = device.run(["df", "-Pk", path]).stdout.splitlines()
    return int(out[-1].split()[3])


class DiskFull(Fault):
    """The device's state directory filled to the last byte."""

    name = "disk-full"
    summary = "state directory full (a small tmpfs filled with a filler file)"

    def __init__(self, device: Device) -> None:
        super().__init__()
        self.device = device
        self.method = "tmpfs + filler file"

    def _apply(self) -> None:
        base = self.device.state_dir
        big, small = f"{base}/{_FILLER}", f"{base}/{_FILLER}.tail"
        before = free_kib(self.device, base)
        # dd ends with ENOSPC (exit 1) when the disk is full: that is the point
        for target, bs in ((big, "1M"), (small, "4k")):
            self.device.run(["dd", "if=/dev/zero", f"of={target}", f"bs={bs}"], check=False)
        self.figures["free_kib_before"] = before
        self.figures["free_kib_full"] = free_kib(self.device, base)

    def _clear(self) -> None:
        base = self.device.state_dir
        self.device.run(["rm", "-f", f"{base}/{_FILLER}", f"{base}/{_FILLER}.tail"])
        self.figures["free_kib_after"] = free_kib(self.device, base)


class CameraServer:
    """ffmpeg replaying a video as an MJPEG stream at ``url`` on the device's loopback,
    restarted whenever it ends (``-listen 1`` serves one client, then exits)."""

    def __init__(self, device: Device, video: str, *, port: int = CAMERA_PORT) -> None:
        self.device = device
        self.video = video
        self.port = port
        self.proc: RunningProc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cam"

    def start(self) -> None:
        """Start serving (a shell loop that restarts ffmpeg when its client goes).

        Raises:
            CommandFailed: it could not be started.
        """
        ffmpeg = shlex.join(
            [
                "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-re",
                "-stream_loop", "-1", "-i", self.video, "-f", "mpjpeg", "-q:v", "5",
                "-listen", "1", self.url,
            ]
        )  # fmt: skip
        loop = f"while true; do {ffmpeg}; sleep 0.2; done"
        self.proc = self.device.spawn(["sh", "-c", loop], name="camera")

    def stop(self) -> None:
        """Kill the loop and ffmpeg (its process group)."""
        if self.proc is not None:
            self.proc.stop(5.0)
            self.proc = None


class CameraStreamLoss(Fault):
    """The camera's stream server killed, then started again."""

    name = "camera-loss"
    summary = "camera stream loss (the MJPEG server killed, then restarted)"

    def __init__(self, server: CameraServer) -> None:
        super().__init__()
        self.server = server
        self.method = "kill the MJPEG server"

    def _apply(self) -> None:
        self.server.stop()

    def _clear(self) -> None:
        self.server.start()


_PROBE = """
import os, sys, time, threading
path = os.environ["FAKETIME_TIMESTAMP_FILE"]
t0, m0 = time.time(), time.monotonic()
with open(path, "w") as f:
    f.write("+3600\\n")
jumped = time.time() - t0
mono = time.monotonic() - m0
try:
    time.sleep(0.01)
    sleep = "ok"
except OSError as e:
    sleep = f"time.sleep() fails: {e}"
threading.Event().wait(0.01)
print(f"{jumped:.0f} {mono:.3f} {sleep}")
"""


class ClockJump(Fault):
    """The agent's wall clock jumped by ``seconds`` (libfaketime); monotonic untouched.

    :meth:`prepare` must run before the agent starts (it sets the agent's environment).
    """

    name = "clock-jump"
    summary = "wall-clock jump of the agent (libfaketime; probed first)"

    def __init__(self, device: Device, seconds: float) -> None:
        super().__init__()
        self.device = device
        self.seconds = seconds
        self.method = "libfaketime"
        self.figures["jump_s"] = seconds
        self._lib: str | None = None
        self._why: str | None = None
        self._probed = False

    @property
    def stamp_file(self) -> str:
        return self.device.path("faketime.txt")

    def env(self, lib: str, stamp: str) -> dict[str, str]:
        return {
            "LD_PRELOAD": lib,
            "FAKETIME_TIMESTAMP_FILE": stamp,
            "FAKETIME_NO_CACHE": "1",
            "DONT_FAKE_MONOTONIC": "1",
        }

    def unavailable(self) -> str | None:
        if self._probed:
            return self._why
        self._probed = True
        self._why = self._probe()
        return self._why

    def _probe(self) -> str | None:
        for lib in FAKETIME_LIBS:
            if self.device.run(["test", "-e", lib], check=False).returncode == 0:
                self._lib = lib
                break
        else:
            return "libfaketime is not installed on the device (Debian package faketime)"
        stamp = self.device.path("faketime-probe.txt")
        self.device.write_file(stamp, b"+0\n")
        env = [f"{k}={v}" for k, v in self.env(self._lib, stamp).items()]
        try:
            out = self.device.run(["env", *env, self.device.python, "-c", _PROBE], timeout_s=20)
        except CommandFailed as exc:
            return f"a Python under libfaketime failed: {exc.output or exc}"
        jumped, mono, sleep = out.stdout.strip().split(" ", 2)
        if sleep != "ok":
            return (
                f"{self._lib} with DONT_FAKE_MONOTONIC=1: {sleep} (clock_nanosleep on the "
                "monotonic clock is mis-faked); faking monotonic clocks too would make every "
                "agent timeout jump with the wall clock"
            )
        if abs(float(jumped) - 3600) > 5 or float(mono) > 5:
            return f"libfaketime did not jump only the wall clock (wall {jumped} s, mono {mono} s)"
        return None

    def prepare(self) -> None:
        """Set the agent's environment so that the jump can be applied later.

        Raises:
            FaultUnavailable: libfaketime does not work here (see the module docstring).
        """
        why = self.unavailable()
        if why is not None or self._lib is None:
            raise FaultUnavailable(self.name, why or "no libfaketime")
        self.device.write_file(self.stamp_file, b"+0\n")
        self.device.agent_env.update(self.env(self._lib, self.stamp_file))

    def _apply(self) -> None:
        self.device.write_file(self.stamp_file, f"{self.seconds:+g}\n".encode())

    def _clear(self) -> None:
        self.device.write_file(self.stamp_file, b"+0\n")

    def record(self) -> dict[str, Any]:
        return {**super().record(), "lib": self._lib}
