"""A GigE Vision camera on a link of its own: ``arv-fake-gv-camera-0.8`` (Aravis's GigE
Vision camera simulator) in a network namespace, joined to this machine's namespace by a
veth pair, so an agent running here reaches it at an address over a real link, as on a
line (GVCP commands, GVSP stream packets, a heartbeat).

The host end of the pair gets the first address of a free /24 (picked the way the HIL
LANs are, under :data:`hil.netns.SUBNET_LOCK`, so a LAN made at the same time never
takes the same one), the camera the second. Deleting the namespace removes the pair.
Names start with ``efgv`` (not ``efhil``: the HIL's stale cleanup leaves them alone).
Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and Debian's aravis-tools (``make sysdeps``).

Example::

    with GigeCamera(serial="GVLINE01") as camera:
        camera.set_user_id("press-3")
        ...  # a [[cameras]] entry with kind = "genicam", uri = camera.ip (or "press-3")
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from hil.errors import HilError
from hil.netns import SUBNET_LOCK, pick_subnet

SIMULATOR = "arv-fake-gv-camera-0.8"
TOOL = "arv-tool-0.8"
USER_ID_ADDRESS = 0xE8
"""The GigE Vision bootstrap register of the device's user-defined name (16 bytes): what
a camera's ``DeviceUserID`` is on GigE Vision, and what its discovery answer carries."""
USER_ID_SIZE = 16
START_S = 15.0


def _ip(*args: str) -> None:
    run = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if run.returncode:
        raise HilError(f"ip {' '.join(args)}: {run.stderr.strip()}")


class GigeCamera:
    """The simulator with serial number ``serial`` in namespace ``efgv-<tag>``."""

    def __init__(self, serial: str = "GVLINE01", log: Path | None = None) -> None:
        if len(serial) >= USER_ID_SIZE * 2:
            raise HilError(f"serial {serial!r}: at most 31 characters")
        self.serial = serial
        self.log = log
        tag = uuid.uuid4().hex[:6]
        self.namespace = f"efgv-{tag}"
        self.host_end = f"efgv{tag}h"
        self.camera_end = f"efgv{tag}c"
        self.ip = ""
        """The camera's address (set by :meth:`start`)."""
        self.host_ip = ""
        """This machine's address on the link."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._made = False

    def start(self) -> GigeCamera:
        """Make the namespace and the link, start the simulator and wait until it answers.

        Raises:
            HilError: not root, the simulator is not installed, or it did not answer
                within :data:`START_S`.
        """
        if shutil.which(SIMULATOR) is None:
            raise HilError(f"{SIMULATOR} is not installed (Debian's aravis-tools: make sysdeps)")
        SUBNET_LOCK.parent.mkdir(parents=True, exist_ok=True)
        with SUBNET_LOCK.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            net = pick_subnet()
            self.host_ip, self.ip = str(net.network_address + 1), str(net.network_address + 2)
            _ip("netns", "add", self.namespace)
            self._made = True
            _ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.camera_end,
                "netns", self.namespace)  # fmt: skip
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_end)
            _ip("link", "set", self.host_end, "up")
        for args in (
            ("addr", "add", f"{self.ip}/24", "dev", self.camera_end),
            ("link", "set", self.camera_end, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", self.namespace, *args)
        self.run()
        return self

    def run(self) -> None:
        """Start the simulator (again, after :meth:`kill`) and wait until it answers."""
        out = self.log.open("ab") if self.log is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, SIMULATOR, "-i", self.camera_end,
                 "-s", self.serial],
                stdout=out, stderr=out,
            )  # fmt: skip
        finally:
            if self.log is not None and not isinstance(out, int):
                out.close()
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HilError(f"{SIMULATOR} exited with {self.proc.returncode}")
            if self._answers():
                return
            time.sleep(0.1)
        raise HilError(f"{SIMULATOR} did not answer at {self.ip} within {START_S:g} s")

    def _answers(self) -> bool:
        run = subprocess.run(
            [TOOL, "-a", self.ip, "control", "DeviceModelName"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        return run.returncode == 0 and "Fake" in run.stdout

    def control(self, *settings: str) -> str:
        """``arv-tool-0.8 -a IP control SETTING...`` (features or ``R[address]=value``);
        its output.

        Raises:
            HilError: the tool failed.
        """
        run = subprocess.run(
            [TOOL, "-a", self.ip, "control", *settings],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        if run.returncode:
            raise HilError(f"{TOOL} control {' '.join(settings)}: {run.stderr.strip()}")
        return run.stdout

    def set_user_id(self, name: str) -> None:
        """Write ``name`` as the camera's user-defined name (its ``DeviceUserID`` on GigE
        Vision), as an integrator's tool would."""
        raw = name.encode("ascii")
        if not 0 < len(raw) < USER_ID_SIZE:
            raise HilError(f"user id {name!r}: 1 to {USER_ID_SIZE - 1} ASCII characters")
        raw = raw.ljust(USER_ID_SIZE, b"\0")
        self.control(
            *(
                f"R[{USER_ID_ADDRESS + i:#x}]={int.from_bytes(raw[i : i + 4], 'big'):#010x}"
                for i in range(0, USER_ID_SIZE, 4)
            )
        )

    def kill(self) -> None:
        """Kill the simulator (a camera unplugged); :meth:`run` starts it again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """Kill the simulator and remove the namespace and the link (idempotent)."""
        self.kill()
        if self._made:
            run = subprocess.run(
                ["ip", "netns", "pids", self.namespace],
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
            for pid in run.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True,
                           timeout=10, check=False)  # fmt: skip
            subprocess.run(["ip", "link", "del", self.host_end], capture_output=True,
                           timeout=10, check=False)  # fmt: skip
            self._made = False

    def __enter__(self) -> GigeCamera:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
