"""A TCP forwarder on loopback between a device and its broker: the network link a test
or a bench can cut (tests/agent/uplink/test_store_forward.py, :mod:`hil.bench.drain`).
:meth:`LinkProxy.cut` closes every connection through it and refuses new ones (a link
down, as the device sees it: the connection dies, reconnects fail);
:meth:`LinkProxy.restore` listens again on the same port. Bytes pass unchanged (TLS end
to end).
"""

from __future__ import annotations

import contextlib
import socket
import threading

_JOIN_S = 5.0


class LinkProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; see the module docstring."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> LinkProxy:
        """Listen (on a free port the first time, the same one after a cut)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    restore = start

    def cut(self) -> None:
        """Close the listener and every connection through it."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        """Cut and wait for the threads."""
        self.cut()
        for thread in self._threads:
            thread.join(_JOIN_S)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=_JOIN_S)
            except OSError:  # the broker is gone: the device sees a dead link
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=_pump, args=(src, dst), daemon=True)
                thread.start()
                self._threads.append(thread)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
