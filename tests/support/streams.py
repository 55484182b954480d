"""Test stream servers run by ffmpeg: an HTTP/MJPEG stream on a loopback port.

``ffmpeg -listen 1`` serves one client and exits when that client goes; a test that
kills the server (``stop()``) starts it again with ``start()`` on the same port.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support.broker import free_port


def ffmpeg_binary() -> str:
    found = shutil.which("ffmpeg")
    if found is None:
        raise RuntimeError("ffmpeg is not installed: run `make sysdeps`")
    return found


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP socket listens on host:port (read from /proc/net/tcp, no probe:
    a probing connection would use up the single client ``-listen 1`` serves)."""
    a, b, c, d = (int(x) for x in host.split("."))
    want = f"{d:02X}{c:02X}{b:02X}{a:02X}:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want and fields[3] == "0A":  # 0A: LISTEN
            return True
    return False


class MjpegServer:
    """ffmpeg serving a test pattern as multipart JPEG at ``url``."""

    def __init__(
        self,
        log_dir: Path,
        *,
        port: int | None = None,
        size: str = "320x240",
        rate: int = 15,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.size = size
        self.rate = rate
        self.log_path = log_dir / f"ffmpeg-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/stream"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start ffmpeg and wait until it listens."""
        argv = [
            ffmpeg_binary(),
            "-nostdin",
            "-hide_banner",
            "-loglevel",
            "error",
            "-re",
            "-f",
            "lavfi",
            "-i",
            f"testsrc=size={self.size}:rate={self.rate}",
            "-f",
            "mpjpeg",
            "-q:v",
            "5",
            "-listen",
            "1",
            self.url,
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ffmpeg exited: {self.log_path.read_text()}")
            if listening(self.port, self.host):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"ffmpeg did not listen on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        """Kill ffmpeg (as a crashed camera server would go) and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.proc = None

    def pause(self) -> None:
        """Freeze ffmpeg (SIGSTOP): the connection stays open, no frame comes."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> MjpegServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.resume()
        self.stop()
