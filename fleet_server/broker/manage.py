"""Mosquitto as a child process of fleet-server: configuration written, started, reloaded.

:class:`ManagedBroker` writes ``mosquitto.conf`` and the ACL into the state directory,
starts Mosquitto, forwards its log lines to this process's log (the last ones are kept
for error messages) and waits until the listener accepts connections. :meth:`reload`
(SIGHUP) makes Mosquitto re-read its configuration, ACL, certificates and CRL without
dropping anyone; :meth:`restart` also cuts every live connection, a revoked device's
included.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from fleet_server.broker.acl import acl_text
from fleet_server.broker.config import MosquittoConfig, mosquitto_conf
from fleet_server.errors import FleetError
from fleet_server.repository._files import make_dirs, write_durable

log = logging.getLogger(__name__)

LOG_TAIL = 200
PID_NAME = "mosquitto.pid"
"""Mosquitto log lines kept for error messages and :meth:`ManagedBroker.log_tail`."""
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
_READY = " running"
_RELOADED = "Reloading config"


class BrokerError(FleetError):
    """The managed broker can't be started, reloaded or stopped.

    Attributes:
        reason: what failed.
        log_tail: Mosquitto's last log lines.
    """

    def __init__(self, reason: str, log_tail: list[str] | None = None) -> None:
        self.reason = reason
        self.log_tail = log_tail or []
        tail = "; mosquitto said: " + " | ".join(self.log_tail[-5:]) if self.log_tail else ""
        super().__init__(f"broker: {reason}{tail}")


def find_mosquitto(binary: str) -> Path:
    """The mosquitto executable ``binary`` names (a path, or a name on PATH or in sbin).

    Raises:
        BrokerError: not found or not executable.
    """
    if "/" in binary:
        path = Path(binary)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BrokerError(f"{binary} is not an executable file")
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN])
    found = shutil.which(binary, path=search)
    if found is None:
        raise BrokerError(f"{binary!r} is not on PATH nor in {', '.join(_SBIN)}; install mosquitto")
    return Path(found)


class ManagedBroker:
    """One Mosquitto process run from a :class:`MosquittoConfig`."""

    def __init__(self, config: MosquittoConfig, services: Sequence[str] = ()) -> None:
        """``services``: the fleet services that connect with their own identity
        (:func:`fleet_server.broker.acl.service_grant`), written into the ACL."""
        self.config = config
        self.services = list(services)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._tail: deque[str] = deque(maxlen=LOG_TAIL)
        self._ready_seen = False
        self._reloads_seen = 0

    @property
    def running(self) -> bool:
        """Whether the Mosquitto process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The Mosquitto process id while it runs."""
        return self._proc.pid if self.running and self._proc else None

    def log_tail(self) -> list[str]:
        """Mosquitto's last log lines (at most :data:`LOG_TAIL`)."""
        with self._cond:
            return list(self._tail)

    def write_files(self) -> None:
        """Write mosquitto.conf and the ACL file (durably) into the state directory.

        Raises:
            BrokerError: a write failed.
        """
        cfg = self.config
        try:
            make_dirs(cfg.state_dir, mode=0o700)
            make_dirs(cfg.data_dir, mode=0o700)
            write_durable(
                cfg.acl_path, acl_text(cfg.fleet_identity, self.services).encode(), mode=0o600
            )
            conf = mosquitto_conf(cfg, run_as=pwd.getpwuid(os.geteuid()).pw_name)
            write_durable(cfg.conf_path, conf.encode(), mode=0o600)
        except OSError as exc:
            raise BrokerError(f"cannot write the configuration in {cfg.state_dir}: {exc}") from exc

    def _check_tls_files(self) -> None:
        cfg = self.config
        for what, path in (
            ("cafile", cfg.cafile),
            ("certfile", cfg.certfile),
            ("keyfile", cfg.keyfile),
            ("crlfile", cfg.crlfile),
        ):
            if not path.is_file():
                raise BrokerError(f"{what} {path} does not exist (issue it with the fleet CA)")
            if not os.access(path, os.R_OK):
                raise BrokerError(f"{what} {path} is not readable")

    def start(self) -> None:
        """Write the configuration, start Mosquitto and wait until it runs (it says so
        once every listener is open).

        Raises:
            BrokerError: already running, a TLS file missing, Mosquitto exited (its last
                log lines are in the error: a port in use, a bad certificate), or not
                running within ``start_timeout_s``.
        """
        if self.running:
            raise BrokerError("already running")
        self._check_tls_files()
        self._stop_orphan()
        self.write_files()
        binary = find_mosquitto(self.config.binary)
        with self._cond:
            self._tail.clear()
            self._ready_seen = False
            self._reloads_seen = 0
        try:
            proc = subprocess.Popen(
                [str(binary), "-c", str(self.config.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise BrokerError(f"cannot run {binary}: {exc}") from exc
        self._proc = proc
        self._reader = threading.Thread(
            target=self._read_log, args=(proc,), name="mosquitto-log", daemon=True
        )
        self._reader.start()
        try:
            self._pid_path.write_text(f"{proc.pid}\n")
        except OSError as exc:
            log.warning("mosquitto: can't write %s: %s", self._pid_path, exc)
        try:
            # "running" comes once every listener is open; a failed bind ends the process.
            self._wait("start", lambda: self._ready_seen, self.config.start_timeout_s)
        except BrokerError:
            self.stop()
            raise
        log.info("mosquitto %d listening on %s:%d", proc.pid, self.config.host, self.config.port)

    @property
    def _pid_path(self) -> Path:
        return self.config.state_dir / PID_NAME

    def _stop_orphan(self) -> None:
        """Stop a Mosquitto that a previous, killed, server left running on this
        configuration (its pid file names it, and its command line has our config)."""
        try:
            pid = int(self._pid_path.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if str(self.config.conf_path).encode() not in cmdline:
            return  # the pid is another process now
        log.warning("mosquitto %d left running by an earlier server: stopping it", pid)
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.config.stop_timeout_s
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise BrokerError(
                f"mosquitto {pid} left by an earlier server can't be stopped: {exc}"
            ) from exc

    def reload(self) -> None:
        """Rewrite the configuration and make Mosquitto re-read it, with the ACL, the
        certificates and the CRL (SIGHUP). Live connections stay up.

        Raises:
            BrokerError: not running, or no reload seen within ``start_timeout_s``.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise BrokerError("not running", self.log_tail())
        self.write_files()
        with self._cond:
            before = self._reloads_seen
        proc.send_signal(signal.SIGHUP)
        # Mosquitto reloads in its single event loop: once it says so, no client is
        # served with the old ACL or CRL.
        self._wait("reload", lambda: self._reloads_seen > before, self.config.start_timeout_s)
        log.info("mosquitto %d reloaded its configuration", proc.pid)

    def restart(self) -> None:
        """Stop and start again: every client is disconnected and must reconnect (and
        present a certificate the current CRL accepts).

        Raises:
            BrokerError: as :meth:`start` and :meth:`stop`.
        """
        self.stop()
        self.start()

    def stop(self) -> None:
        """Stop Mosquitto (SIGTERM; SIGKILL after ``stop_timeout_s``). Idempotent.

        Raises:
            BrokerError: the process did not end even after SIGKILL.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("mosquitto %d ignored SIGTERM; killing it", proc.pid)
                proc.kill()
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired as exc:
                    raise BrokerError(f"mosquitto {proc.pid} survived SIGKILL") from exc
        if proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
            log.warning("mosquitto %d exited with status %s", proc.pid, proc.returncode)
        self._pid_path.unlink(missing_ok=True)
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.join(5.0)
            if reader.is_alive():
                log.warning("mosquitto log reader still running after the process ended")
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> ManagedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _read_log(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None  # noqa: S101 (set by Popen above)
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            if line.startswith("Error"):
                log.error("mosquitto: %s", line)
            elif line.startswith("Warning"):
                log.warning("mosquitto: %s", line)
            else:
                log.info("mosquitto: %s", line)
            with self._cond:
                self._tail.append(line)
                if line.startswith("mosquitto version") and line.endswith(_READY):
                    self._ready_seen = True
                if line.startswith(_RELOADED):
                    self._reloads_seen += 1
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not done():
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerError(f"{what}: nothing within {timeout_s} s", list(self._tail))
                self._cond.wait(min(left, 0.5))
            else:
                return
        code = proc.returncode if proc else None
        if self._reader is not None:
            self._reader.join(2.0)  # the reader ends at EOF, with mosquitto's last words
        raise BrokerError(f"mosquitto exited (status {code}) during {what}", self.log_tail())
