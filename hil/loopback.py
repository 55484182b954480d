"""Loopback scaffolding the tools and the tests share: a free TCP port, and a real
Mosquitto on one (the demo's local broker, the benches' and the tests' ``mosquitto``
fixture). One copy, used by scripts/, hil/ and tests/."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str:
    """The Mosquitto executable (``/usr/sbin`` is not on every user's PATH)."""
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if found is None:
        raise RuntimeError("mosquitto is not installed: run `make sysdeps`")
    return found


@dataclass
class Broker:
    """A running Mosquitto; ``stop()`` and ``start()`` let a test take it away and back."""

    host: str
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Run Mosquitto on ``host:port`` and return once it accepts connections."""
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} {self.host}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "log_dest stderr\n"
            "max_packet_size 1048576\n"
        )
        log = (self.workdir / "mosquitto.log").open("ab")
        self.proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mosquitto exited: {(self.workdir / 'mosquitto.log').read_text()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port}")

    def stop(self) -> None:
        """Terminate Mosquitto (killed after 5 s); ``start()`` may run it again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def start_broker(workdir: Path, host: str = "127.0.0.1") -> Broker:
    """A Mosquitto of its own on a free port of ``host``, its files in ``workdir``."""
    broker = Broker(host, free_port(host), workdir)
    broker.start()
    return broker
