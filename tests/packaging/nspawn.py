"""A booted Debian bookworm in a systemd-nspawn container, for the package tests.

The root filesystem is made by ``mmdebstrap`` from Debian's archive with exactly the
Debian packages the tests name (the .debs' declared dependencies among them), cached as a
tarball under ``.cache/packaging/`` keyed by that list. Each test module unpacks it into a
temporary directory and boots it with ``systemd-nspawn --boot`` on a private network
(loopback only: the container reaches neither PyPI nor Debian's archive, so what installs
there installs from the .deb alone). Commands run inside through ``nsenter`` into the
container's namespaces, with a bound on every wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hil import procs

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "packaging"
SUITE = "bookworm"
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "ca-certificates", "procps")
"""What any booted test system has, before the packages under test and their depends."""
BOOT_S = 60.0
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class ContainerError(AssertionError):
    """A step inside the container failed; the message carries its output."""


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    """A bound on a wait, not a timing: fails only when ``cond`` never holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise ContainerError(f"timed out after {timeout_s:g} s waiting for {what}")


def can_boot() -> str | None:
    """``None`` when this machine can boot a container, else why not."""
    if os.geteuid() != 0:
        return f"needs root (running as uid {os.geteuid()})"
    for tool in ("mmdebstrap", "systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make package-test installs it)"
    return None


def rootfs_tarball(packages: Sequence[str]) -> Path:
    """A bookworm root filesystem with ``packages`` installed (cached by the package list)."""
    wanted = sorted(set(BASE_PACKAGES) | set(packages))
    key = hashlib.sha256(" ".join([SUITE, *wanted]).encode()).hexdigest()[:16]
    tarball = CACHE / f"rootfs-{SUITE}-{key}.tar"
    if tarball.is_file():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial.tar")
    cmd = [
        "mmdebstrap",
        "--variant=apt",
        "--include=" + ",".join(wanted),
        # No recommends: the test system has only what the packages declare they need.
        "--aptopt=APT::Install-Recommends false",
        SUITE,
        str(partial),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise ContainerError(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.replace(tarball)
    return tarball


@dataclass
class Container:
    """A booted system in ``root``; :meth:`run` executes a command inside it."""

    root: Path
    name: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _init_pid: int = field(default=0, init=False)

    def boot(self) -> None:
        """Boot the system and wait until systemd reports it running (or degraded)."""
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                "systemd-nspawn",
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
                f"--machine={self.name}",
                "-D",
                str(self.root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for(self._find_init, BOOT_S, f"the container's systemd ({self.log_tail()})")
        wait_for(self._booted, BOOT_S, f"the container to finish booting ({self.log_tail()})")

    def _find_init(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise ContainerError(f"systemd-nspawn exited: {self.log_tail()}")
        for pid in sorted(procs.descendants(self.proc.pid)):
            if procs.name(pid) == "systemd":
                self._init_pid = pid
                return True
        return False

    def _booted(self) -> bool:
        state = self.run(["systemctl", "is-system-running"], check=False).stdout.strip()
        return state in ("running", "degraded")

    def run(
        self,
        cmd: Sequence[str],
        *,
        check: bool = True,
        timeout_s: float = 120.0,
        input_text: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the container as root; ``check`` raises on a non-zero exit."""
        if not self._init_pid:
            raise ContainerError("the container is not booted")
        full = ["nsenter", "-t", str(self._init_pid), "-a", "--", "env", "-i"]
        full += [f"{k}={v}" for k, v in (ENV | (env or {})).items()]
        done = subprocess.run(
            [*full, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            check=False,
        )
        if check and done.returncode != 0:
            raise ContainerError(
                f"{' '.join(cmd)} exited {done.returncode}:\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
        return done

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside the container (``sh -ec``)."""
        return self.run(["sh", "-ec", script], **kw)  # type: ignore[arg-type]

    def path(self, inside: str) -> Path:
        """Where the container's path ``inside`` is on the host."""
        return self.root / inside.lstrip("/")

    def put(self, src: Path, inside: str) -> str:
        """Copy a host file or directory into the container; its path inside."""
        dest = self.path(inside)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
        return inside

    def install(self, deb: Path) -> None:
        """``apt-get install ./X.deb`` inside (no network there: nothing can be downloaded).

        How long it took is appended to ``.cache/packaging/installs.jsonl`` (the README's
        install times come from there; no test asserts a time).
        """
        inside = self.put(deb, f"/root/debs/{deb.name}")
        started = time.monotonic()
        self.run(
            ["apt-get", "install", "-y", "--no-install-recommends", inside],
            timeout_s=600,
            env={"DEBIAN_FRONTEND": "noninteractive"},
        )
        took = time.monotonic() - started
        record = {"deb": deb.name, "bytes": deb.stat().st_size, "install_s": round(took, 1)}
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / "installs.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")

    def active(self, unit: str) -> bool:
        """``systemctl is-active`` says active."""
        state = self.run(["systemctl", "is-active", unit], check=False).stdout.strip()
        return state == "active"

    def unit(self, unit: str, prop: str) -> str:
        """One property of a unit (``systemctl show -p PROP --value``)."""
        return self.run(["systemctl", "show", "-p", prop, "--value", unit]).stdout.strip()

    def journal(self, unit: str, lines: int = 60) -> str:
        return self.run(
            ["journalctl", "-u", unit, "-n", str(lines), "--no-pager"], check=False
        ).stdout

    def log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no console log)"

    def shutdown(self) -> None:
        """Power the container off (SIGKILL to nspawn's group after a bound)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError, ContainerError):
            self.run(["systemctl", "poweroff", "--no-block"], check=False, timeout_s=10)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def booted(tarball: Path, workdir: Path, name: str) -> Iterator[Container]:
    """Unpack ``tarball`` under ``workdir`` and boot it; powered off and removed after."""
    root = workdir / "rootfs"
    root.mkdir(parents=True)
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(root)], check=True, timeout=300)
    box = Container(root=root, name=name, log_path=workdir / "console.log")
    try:
        box.boot()
        yield box
    finally:
        box.shutdown()
        shutil.rmtree(root, ignore_errors=True)
