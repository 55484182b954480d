"""The fleet side of the drain bench (:mod:`hil.bench.drain`), run in a child
process so that it shares the machine with the device but not its interpreter: a fleet
server (managed Mosquitto with TLS, one ingest worker, an SQLite fleet database) and in
front of its broker a TCP forwarder, the network link the bench cuts and restores
(:class:`hil.linkproxy.LinkProxy`). :class:`FleetSide` is the parent's handle on it.

The fleet side stands for a remote server: it runs at the lowest CPU priority (nice 19
and SCHED_IDLE where allowed, inherited by Mosquitto; :func:`lowest_priority`), so that
on a shared machine it takes only the CPU the device leaves.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import secrets
import signal
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

from fleet_server.config import parse_config
from fleet_server.db import sqlite_url, store
from fleet_server.errors import FleetError
from fleet_server.serve import FleetServer, Service
from fleet_server.services import IngestService
from hil.bench.fleet import (
    DEFAULT_MODEL,
    LABELS,
    PASSPHRASE_ENV,
    PROFILE,
    _make_repository,
    _recording,
)
from hil.linkproxy import LinkProxy
from hil.loopback import free_port

log = logging.getLogger(__name__)

DEVICE_ID = "drain-bench"
FLEET_START_S = 120.0
CALL_TIMEOUT_S = 30.0


class DrainBenchError(FleetError):
    """The drain bench can't set up or run.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"drain bench: {reason}")


# -- the fleet side (child process) -----------------------------------------------------


def fleet_process(spec: dict[str, Any], conn: Connection) -> None:
    """The child process: start the fleet server (ingest only) and the link, send
    ``{url, token, port, db, priority}``, then answer ``"cut"``, ``"restore"``, ``"status"``
    (each with the link's ``connections`` so far) and ``"stop"`` (with the ingest
    workers' counters) until stopped, the parent gone, or ``spec["max_s"]`` passed. A
    failure is sent as ``{"error": ...}``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    priority = lowest_priority() if spec.get("lowest", True) else "default priority (asked)"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops this in order
    signal.signal(signal.SIGTERM, _exit)  # terminated: leave the with-blocks (the broker)
    os.environ.setdefault(PASSPHRASE_ENV, spec["passphrase"])
    root = Path(spec["dir"])
    try:
        repo, keys = _make_repository(root, DEFAULT_MODEL)
        db = root / "fleet.db"
        cfg = parse_config(
            {
                "server": {"state_dir": str(root / "state"), "log_level": "warning"},
                "http": {"port": 0},
                "broker": {"mosquitto": {"port": free_port(), "persistence": False}},
                "database": {"url": sqlite_url(db)},
                "repository": {"path": str(repo), "keystore": str(keys)},
            }
        )
        built: list[Service] = []
        with FleetServer(cfg, services=_recording(built, [IngestService])) as server:
            ctx = server.context
            token = secrets.token_urlsafe(24)
            store.create_token(ctx.engine, store.hash_token(token), spec["device_id"],
                               labels=LABELS, profile=PROFILE, ttl_s=3600)  # fmt: skip
            link = LinkProxy(ctx.broker.host, ctx.broker.port).start()
            conn.send({"url": server.url, "token": token, "port": link.port, "db": str(db),
                       "priority": priority})  # fmt: skip
            deadline = time.monotonic() + float(spec["max_s"])
            while time.monotonic() < deadline:
                if not conn.poll(0.5):
                    continue
                command = conn.recv()
                if command == "stop":
                    break
                if command == "cut":
                    link.cut()
                elif command == "restore":
                    link.start()
                elif command != "status":
                    conn.send({"error": f"unknown command {command!r}"})
                    continue
                conn.send({"ok": command, "connections": link.connections})
            link.cut()
            workers = [w for s in built if isinstance(s, IngestService) for w in s.workers]
        conn.send({"ingest": [asdict(w.stats()) for w in workers]})
    except EOFError:
        return  # the parent is gone
    except Exception as exc:  # noqa: BLE001 - whatever failed goes to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def lowest_priority() -> str:
    """Put this process (and what it starts: Mosquitto, the ingest threads) at the lowest
    CPU priority, nice 19 and SCHED_IDLE where allowed: the fleet side stands for a
    remote server, so it takes only what the device leaves. What it got, in words."""
    got = []
    try:
        os.nice(19 - os.nice(0))
        got.append(f"nice {os.nice(0)}")
    except OSError as exc:
        got.append(f"nice refused ({exc.strerror})")
    sched_idle = getattr(os, "SCHED_IDLE", None)
    if sched_idle is not None:
        try:
            os.sched_setscheduler(0, sched_idle, os.sched_param(0))
            got.append("SCHED_IDLE")
        except OSError as exc:
            got.append(f"SCHED_IDLE refused ({exc.strerror})")
    return ", ".join(got)


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class FleetSide:
    """The parent's handle on :func:`fleet_process` (``lowest``: at the lowest CPU
    priority, see :func:`lowest_priority`)."""

    def __init__(self, directory: Path, max_s: float, *, lowest: bool = True) -> None:
        spawn = mp.get_context("spawn")
        self.conn, child = spawn.Pipe()
        spec = {"dir": str(directory), "device_id": DEVICE_ID, "max_s": max_s,
                "passphrase": secrets.token_urlsafe(24), "lowest": lowest}  # fmt: skip
        self.proc = spawn.Process(target=fleet_process, args=(spec, child), daemon=True)
        self.proc.start()
        try:
            self.hello = self._answer(FLEET_START_S, "start")
        except DrainBenchError:
            self.close()
            raise

    def _answer(self, timeout_s: float, what: str) -> dict[str, Any]:
        """The child's answer.

        Raises:
            DrainBenchError: no answer in time, the child exited, or it reports a failure.
        """
        try:
            if not self.conn.poll(timeout_s):
                raise DrainBenchError(f"the fleet side did not answer {what!r} in {timeout_s:g} s")
            answer: dict[str, Any] = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise DrainBenchError(f"the fleet side exited ({what!r}): {exc!r}") from exc
        if "error" in answer:
            raise DrainBenchError(f"fleet side: {answer['error']}")
        return answer

    def call(self, command: str) -> dict[str, Any]:
        """Send ``"cut"``, ``"restore"`` or ``"status"``; the answer.

        Raises:
            DrainBenchError: see :meth:`_answer`.
        """
        try:
            self.conn.send(command)
        except OSError as exc:
            raise DrainBenchError(f"the fleet side exited ({command!r}): {exc}") from exc
        return self._answer(CALL_TIMEOUT_S, command)

    def close(self) -> dict[str, Any]:
        """Stop the child; the ingest workers' counters (empty if it had failed)."""
        try:
            answer = self.call("stop") if self.proc.is_alive() else {}
        except DrainBenchError:
            answer = {}
        self.proc.join(CALL_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(CALL_TIMEOUT_S)
        return answer
