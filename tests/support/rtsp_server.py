"""A small RTSP server for the capture tests, run by Debian's ``/usr/bin/python3``.

GStreamer's RTSP server (``gir1.2-gst-rtsp-server-1.0``) through ``python3-gi``, which
only the system Python has; the tests start this script as a subprocess
(:mod:`tests.support.rtsp`). It serves pre-encoded MP4 (or MPEG-TS, ``.ts``) files, each
at its mount point::

    /usr/bin/python3 rtsp_server.py --port 8554 --mount /cam=cam.mp4:h264 \
        [--mount /hevc=cam265.mp4:h265] [--user U --password P]

Every client gets its own pipeline that plays the file from the start, in real time.
Once listening it prints ``ready PORT`` on stdout. Commands, one a line on stdin, answered
``ok COMMAND``:

- ``pause``: block every stream (and every stream opened afterwards) before the RTP
  payloader: the sessions and sockets stay open, no data flows (a stalled camera).
- ``resume``: let the streams flow again.
- ``quit``: stop. End of stdin stops too.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

_PIPELINES = {
    "h264": "h264parse ! rtph264pay name=pay0 pt=96 config-interval=1",
    "h265": "h265parse ! rtph265pay name=pay0 pt=96 config-interval=1",
}


def _demuxer(file_name: str) -> str:
    """MPEG-TS (``.ts``, which may change resolution midway) or MP4."""
    return "tsdemux" if file_name.endswith(".ts") else "qtdemux"


class Gate:
    """Blocks and unblocks the payloaders' input of every live media."""

    def __init__(self) -> None:
        self.paused = False
        self._pads: dict[Any, int | None] = {}

    def add(self, media: GstRtspServer.RTSPMedia) -> None:
        pay = media.get_element().get_by_name("pay0")
        pad = pay.get_static_pad("sink")
        self._pads[pad] = None
        if self.paused:
            self._block(pad)
        media.connect("unprepared", lambda _m: self._pads.pop(pad, None))

    def _block(self, pad: Any) -> None:
        self._pads[pad] = pad.add_probe(
            Gst.PadProbeType.BLOCK_DOWNSTREAM, lambda *_a: Gst.PadProbeReturn.OK
        )

    def pause(self) -> None:
        self.paused = True
        for pad, probe in list(self._pads.items()):
            if probe is None:
                self._block(pad)

    def resume(self) -> None:
        self.paused = False
        for pad, probe in list(self._pads.items()):
            if probe is not None:
                pad.remove_probe(probe)
                self._pads[pad] = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--mount", action="append", required=True, help="/PATH=FILE:CODEC")
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    args = parser.parse_args()

    Gst.init(None)
    loop = GLib.MainLoop()
    gate = Gate()
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    for spec in args.mount:
        path, _, rest = spec.partition("=")
        file_name, _, codec = rest.rpartition(":")
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(
            f"( filesrc location={file_name} ! {_demuxer(file_name)} ! {_PIPELINES[codec]} )"
        )
        factory.set_shared(False)
        factory.connect("media-configure", lambda _f, media: gate.add(media))
        if args.user:
            factory.add_role_from_structure(
                Gst.Structure.from_string(
                    "user, media.factory.access=(boolean)true, "
                    "media.factory.construct=(boolean)true"
                )[0]
            )
        mounts.add_factory(path, factory)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password), token)
        server.set_auth(auth)
    if server.attach(None) == 0:
        print(f"can't listen on {args.address}:{args.port}", file=sys.stderr, flush=True)
        return 1

    pending = bytearray()

    def on_stdin(_channel: Any, _condition: Any) -> bool:
        data = os.read(0, 4096)
        if not data:
            loop.quit()
            return False
        pending.extend(data)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            command = line.decode().strip()
            if command == "quit":
                loop.quit()
                return False
            if command == "pause":
                gate.pause()
            elif command == "resume":
                gate.resume()
            print(f"ok {command}", flush=True)
        return True

    GLib.io_add_watch(
        GLib.IOChannel.unix_new(0), GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP, on_stdin
    )
    print(f"ready {args.port}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
