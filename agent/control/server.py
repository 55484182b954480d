"""The hot path's end of the control channel: a Unix socket served by one thread per
connection (at most :data:`MAX_CONNECTIONS`), each request answered in order.

What a request may do is :data:`agent.control.protocol.OPS`; anything else is refused
with its reason and changes nothing. A frame over the limit or a peer that stops mid-frame
closes that connection (the stream can't be trusted after it); the hot path goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.control.protocol import (
    MAX_ANSWER_BYTES,
    MAX_REQUEST_BYTES,
    ControlError,
    FrameTooLarge,
    check_request,
    encode,
    read_frame,
)

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4
IDLE_TIMEOUT_S = 600.0
"""A connection that sends nothing for this long is closed (the companion reconnects)."""
_ACCEPT_POLL_S = 0.5

Handler = Callable[[str, dict[str, Any]], Any]
"""Called with an operation and its checked arguments; returns the JSON-able result or
raises :class:`ControlError` (refused) or anything else (an internal error)."""


class ControlServer:
    """Serves ``handler`` on the Unix socket ``path`` (its directory is made private).

    Raises (from :meth:`start`):
        ControlError: the socket can't be bound.
    """

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = Path(path)
        self.handler = handler
        self.refused = 0
        """Requests refused (malformed, too large, unknown, bad arguments)."""
        self.served = 0
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()

    def start(self) -> ControlServer:
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(directory, 0o700)
            if self.path.exists() or self.path.is_symlink():
                if not stat.S_ISSOCK(self.path.lstat().st_mode):
                    raise ControlError(f"{self.path} exists and is not a socket")
                self.path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(MAX_CONNECTIONS)
            sock.settimeout(_ACCEPT_POLL_S)
        except OSError as exc:
            raise ControlError(f"can't listen on {self.path}: {exc}") from exc
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * _ACCEPT_POLL_S)
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # their threads see the end of the stream and finish
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.path.unlink()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _accept_loop(self) -> None:
        assert self._sock is not None  # noqa: S101 - set by start()
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if not self._stop.is_set():
                    log.error("control: accept failed: %s", exc)  # noqa: TRY400 - no traceback
                    self._stop.wait(_ACCEPT_POLL_S)
                continue
            if not self._slots.acquire(blocking=False):
                log.warning("control: %d connections open, closing a new one", MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="control-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            while not self._stop.is_set():
                try:
                    message = read_frame(conn, MAX_REQUEST_BYTES, "control request")
                except FrameTooLarge as exc:
                    self._refuse(conn, exc.reason)
                    return  # the body was not read: the stream can't be trusted
                except ControlError as exc:
                    self._refuse(conn, exc.reason)
                    if "cut off" in exc.reason:
                        return
                    continue
                if message is None:
                    return
                self._answer(conn, message)
        except OSError:
            return  # the peer went away or sent nothing for IDLE_TIMEOUT_S
        except Exception:  # a connection's thread must not die unseen
            log.exception("control: serving a connection failed")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    def _answer(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            op, args = check_request(message)
        except ControlError as exc:
            self._refuse(conn, exc.reason)
            return
        try:
            result = self.handler(op, args)
            frame = encode({"ok": True, "result": result}, MAX_ANSWER_BYTES)
        except ControlError as exc:
            self._refuse(conn, exc.reason)
            return
        except Exception as exc:
            log.exception("control: %s failed", op)
            frame = encode({"ok": False, "error": f"{op} failed: {exc}"}, MAX_ANSWER_BYTES)
        with self._lock:
            self.served += 1
        conn.sendall(frame)

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        with self._lock:
            self.refused += 1
        log.warning("control: refused: %s", reason)
        conn.sendall(encode({"ok": False, "error": reason}, MAX_ANSWER_BYTES))
