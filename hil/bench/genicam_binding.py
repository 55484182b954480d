"""What each way of reading a GenICam camera costs the agent's process: the figures of
docs/adr/0025-genicam-through-aravis.md.

Against ``arv-fake-gv-camera-0.8`` on loopback (started here), free-running at ``--fps``
for ``--seconds``, Mono8 at the simulator's 512x512, each way receives frames and takes
their bytes (no colour conversion, which is the same for all):

- ``ctypes``: the agent's binding (:mod:`agent.capture.genicam.aravis`), the bytes viewed
  in Aravis's buffer;
- ``pygobject``: Debian's python3-gi on the same library (``buffer.get_data()`` copies
  each frame into a Python bytes object), run by Debian's ``/usr/bin/python3``;
- ``aravissrc``: ``gst-launch-1.0 aravissrc ! fdsink`` as a child writing the frames to a
  pipe the parent reads, the way the RTSP decoder children hand frames over.

CPU is the process's (and its children's) user + system time over frames received.

    python -m hil.bench.genicam_binding --fps 100 --seconds 5
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import cast

WIDTH = HEIGHT = 512
_GI = r"""
import json, resource, sys, time
import gi
gi.require_version("Aravis", "0.8")
from gi.repository import Aravis
fps, seconds = float(sys.argv[1]), float(sys.argv[2])
cam = Aravis.Camera.new("127.0.0.1")
cam.set_pixel_format_from_string("Mono8")
cam.set_frame_rate(fps)
stream = cam.create_stream(None, None)
size = cam.get_payload()
for _ in range(8):
    stream.push_buffer(Aravis.Buffer.new_allocate(size))
r0 = resource.getrusage(resource.RUSAGE_SELF)
cam.start_acquisition()
frames, total, end = 0, 0, time.monotonic() + seconds
while time.monotonic() < end:
    buf = stream.timeout_pop_buffer(200000)
    if buf is None:
        continue
    if buf.get_status() == Aravis.BufferStatus.SUCCESS:
        total += len(buf.get_data())
        frames += 1
    stream.push_buffer(buf)
cam.stop_acquisition()
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print(json.dumps({"frames": frames, "cpu_s": cpu}))
"""


def _ctypes(fps: float, seconds: float) -> dict[str, float]:
    import ctypes  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from agent.capture.genicam import aravis  # noqa: PLC0415

    cam = aravis.ArvCamera("127.0.0.1")
    cam.call("set_pixel_format_from_string", b"Mono8")
    cam.call("set_frame_rate", fps)
    stream = aravis.ArvStream(cam, 8, int(cam.call("get_payload")))
    lib = aravis.library()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    cam.call("start_acquisition")
    frames, total, end = 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        buf = stream.pop(200_000)
        if buf is None:
            continue
        f = aravis.filled(lib, buf)
        if f.status == "success":
            view = np.frombuffer(
                memoryview((ctypes.c_uint8 * f.size).from_address(f.data)), np.uint8
            )
            total += int(view[0]) + view.size
            frames += 1
        stream.push(buf)
    cam.call("stop_acquisition")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    stream.close()
    cam.close()
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return {"frames": frames, "cpu_s": cpu}


def _pygobject(fps: float, seconds: float) -> dict[str, float]:
    run = subprocess.run(
        ["/usr/bin/python3", "-c", _GI, str(fps), str(seconds)],
        capture_output=True, text=True, timeout=seconds + 30, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(run.stdout.splitlines()[-1])
    return result


def _aravissrc(fps: float, seconds: float) -> dict[str, float]:
    frame = WIDTH * HEIGHT
    argv = ["gst-launch-1.0", "-q", "aravissrc", "camera-name=127.0.0.1",
            f"features=AcquisitionFrameRate={fps:g}", "!", f"video/x-raw,format=GRAY8,"
            f"width={WIDTH},height={HEIGHT}", "!", "fdsink", "fd=1"]  # fmt: skip
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s0 = resource.getrusage(resource.RUSAGE_SELF)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    stdout = cast(io.BufferedReader, child.stdout)
    buf = bytearray(frame)
    view = memoryview(buf)
    frames, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        got = 0
        while got < frame:
            n = stdout.readinto(view[got:])
            if not n:
                break
            got += n
        if got < frame:
            break
        frames += 1
    child.terminate()
    child.wait(10)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    s1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = sum(
        (b.ru_utime + b.ru_stime) - (a.ru_utime + a.ru_stime) for a, b in ((c0, c1), (s0, s1))
    )
    return {"frames": frames, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fps", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    fake = shutil.which("arv-fake-gv-camera-0.8")
    if fake is None:
        print("arv-fake-gv-camera-0.8 is not installed (make sysdeps)", file=sys.stderr)
        return 2
    sim = subprocess.Popen([fake, "-i", "127.0.0.1", "-s", "BENCH"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # the simulator binds its GVCP socket
        out = {}
        for name, way in (("ctypes", _ctypes), ("pygobject", _pygobject),
                          ("aravissrc", _aravissrc)):  # fmt: skip
            r = way(args.fps, args.seconds)
            out[name] = {
                "frames": r["frames"],
                "expected": int(args.fps * args.seconds),
                "cpu_ms_per_frame": round(1000 * r["cpu_s"] / max(1, r["frames"]), 3),
            }
    finally:
        sim.terminate()
        sim.wait(10)
    print(json.dumps({"fps": args.fps, "seconds": args.seconds, "cpu_count": os.cpu_count(),
                      "results": out}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
