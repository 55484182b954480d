"""The diagnostics archive: what a field engineer would gather on the device, in one
``.tar.gz`` the fleet keeps for the operator to download.

=====================  ==============================================================
``versions.json``      agent, Python, OS and the libraries the agent runs on
``config.json``        the configuration as loaded, secrets taken out
``health.json``        the companion's health (the hot path's, the uplink's, problems)
``ready.json``         readiness: each pipeline and camera, delivering or not
``processes.json``     the hot path's process: pid, starts, last exit, up time
``disk.json``          the state directory's file system, the disk budget and what
                       each part of the state directory takes
``decision-log.json``  the decision log's file sizes and ``PRAGMA quick_check``
``logs.txt``           the last lines of the agent's log, secrets taken out
``MANIFEST.json``      each file's size and sha256
=====================  ==============================================================

Every text goes through the :class:`agent.remote.redact.Redactor` before it is packed
(each JSON value by its key: :meth:`~agent.remote.redact.Redactor.value`).
Each part is bounded: the log lines by the request, ``quick_check`` by
:data:`QUICK_CHECK_S`, the state walk by its entry limit; a part that fails says why in
its file instead of stopping the archive.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import sqlite3
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from agent.remote.logread import LogQuery, LogSource
from agent.remote.redact import Redactor
from agent.uplink.sysinfo import disk_mb, tree_mb

QUICK_CHECK_S = 10.0
LIBRARIES = ("edgefleet", "numpy", "onnxruntime", "opencv-python-headless", "paho-mqtt",
             "pydantic", "tuf", "ai-edge-litert", "asyncua", "pymodbus")  # fmt: skip
_STATE_PARTS = ("bundles", "staging", "trust", "identity", "outbox", "logs", "thumbnails")


@dataclass
class Sources:
    """Where the archive's parts come from (the companion's views of the agent)."""

    config: dict[str, Any]
    health: Callable[[], Any]
    ready: Callable[[], Any]
    hello: Callable[[], Any]
    state_dir: Path
    decision_log: Path
    disk_budget_mb: float | None
    logs: LogSource
    profile: str = ""


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(profile: str) -> dict[str, Any]:
    """Agent, Python, OS and library versions."""
    return {
        "agent": _version("edgefleet"),
        "profile": profile,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "libraries": {name: _version(name) for name in LIBRARIES},
    }


def quick_check(path: Path, budget_s: float = QUICK_CHECK_S) -> dict[str, Any]:
    """The decision log's sizes and ``PRAGMA quick_check``, read only, stopped after
    ``budget_s`` (a large log on a slow card)."""
    out: dict[str, Any] = {"path": str(path)}
    for suffix in ("", "-wal"):
        try:
            out[f"bytes{suffix.replace('-', '_')}"] = (
                (path.parent / (path.name + suffix)).stat().st_size
            )
        except OSError:
            out[f"bytes{suffix.replace('-', '_')}"] = None
    if out["bytes"] is None:
        out["quick_check"] = "no decision log"
        return out
    deadline = time.monotonic() + budget_s
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error as exc:
        out["quick_check"] = f"cannot open: {exc}"
        return out
    try:
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        rows = conn.execute("PRAGMA quick_check(20)").fetchall()
        out["quick_check"] = [str(r[0]) for r in rows]
        out["ok"] = out["quick_check"] == ["ok"]
    except sqlite3.OperationalError as exc:
        why = "interrupted" if "interrupt" in str(exc) else str(exc)
        out["quick_check"] = f"not finished in {budget_s:g} s" if why == "interrupted" else why
    except sqlite3.DatabaseError as exc:
        out["quick_check"] = f"failed: {exc}"
        out["ok"] = False
    finally:
        conn.close()
    return out


def disk(state_dir: Path, budget_mb: float | None) -> dict[str, Any]:
    """The state directory's file system, the budget and what its parts take (MiB)."""
    free_used = disk_mb(state_dir)
    parts = {}
    for name in _STATE_PARTS:
        if (state_dir / name).exists():
            parts[name] = tree_mb(state_dir / name)
    return {
        "state_dir": str(state_dir),
        "free_mb": free_used[0] if free_used else None,
        "used_mb": free_used[1] if free_used else None,
        "state_dir_mb": tree_mb(state_dir),
        "budget_mb": budget_mb,
        "parts_mb": parts,
    }


def _attempt(what: Callable[[], Any]) -> Any:
    try:
        return what()
    except Exception as exc:  # noqa: BLE001 - a part that fails says why in its file
        return {"error": f"{type(exc).__name__}: {exc}"}


def build(
    src: Sources, redact: Redactor, *, log_lines: int, max_bytes: int
) -> tuple[bytes, dict[str, Any]]:
    """The archive (gzip'd tar) and its manifest; logs are left out, then cut, when the
    archive would be over ``max_bytes``."""
    parts: dict[str, bytes] = {}

    def put_json(name: str, value: Any) -> None:
        clean = redact.value(json.loads(json.dumps(value, default=str)))
        parts[name] = json.dumps(clean, indent=2, sort_keys=True).encode()

    put_json("versions.json", versions(src.profile))
    put_json("config.json", src.config)
    put_json("health.json", _attempt(src.health))
    put_json("ready.json", _attempt(src.ready))
    put_json("processes.json", _attempt(src.hello))
    put_json("disk.json", _attempt(lambda: disk(src.state_dir, src.disk_budget_mb)))
    put_json("decision-log.json", _attempt(lambda: quick_check(src.decision_log)))
    try:
        entries = src.logs.tail(LogQuery(since=0.0, lines=log_lines))
        logs = "\n".join(redact(e.text) for e in entries) + "\n"
    except Exception as exc:  # noqa: BLE001 - said in the file
        logs = f"the log could not be read ({src.logs.name}): {exc}\n"
    parts["logs.txt"] = logs.encode()
    archive = _pack(parts)
    while len(archive) > max_bytes and len(parts["logs.txt"]) > 1024:
        keep = parts["logs.txt"][len(parts["logs.txt"]) // 2 :]
        parts["logs.txt"] = b"(older lines left out: the archive's size limit)\n" + keep
        archive = _pack(parts)
    manifest = {
        name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in sorted(parts.items())
    }
    return archive, manifest


def _pack(parts: dict[str, bytes]) -> bytes:
    manifest = {
        name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in sorted(parts.items())
    }
    files = {**parts, "MANIFEST.json": json.dumps(manifest, indent=2).encode()}
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"diagnostics/{name}")
            info.size = len(data)
            info.mtime = int(now)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
