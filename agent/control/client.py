"""The companion's end of the control channel: one connection, one request at a time,
every call bounded by a timeout, reconnecting after any failure (the hot path may have
been restarted)."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

from agent.control.protocol import (
    MAX_ANSWER_BYTES,
    MAX_REQUEST_BYTES,
    ControlError,
    encode,
    read_frame,
)

DEFAULT_TIMEOUT_S = 2.0


class ControlClient:
    """Calls the hot path's operations over the Unix socket ``path``."""

    def __init__(self, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def call(self, op: str, *, timeout_s: float | None = None, **args: Any) -> Any:
        """The result of ``op``.

        Raises:
            ControlError: the hot path refused it (its reason), or can't be reached or
                did not answer within the timeout.
        """
        frame = encode({"op": op, "args": args}, MAX_REQUEST_BYTES)
        with self._lock:
            try:
                sock = self._connect()
                sock.settimeout(timeout_s or self.timeout_s)
                sock.sendall(frame)
                answer = read_frame(sock, MAX_ANSWER_BYTES, f"answer to {op}")
            except ControlError:
                self._drop()
                raise
            except OSError as exc:
                self._drop()
                raise ControlError(f"{op}: the hot path can't be reached ({exc})") from exc
            if answer is None:
                self._drop()
                raise ControlError(f"{op}: the hot path closed the connection")
        if answer.get("ok") is True:
            return answer.get("result")
        raise ControlError(str(answer.get("error", "refused without a reason")))

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(str(self.path))
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
