"""A Siemens S7 stand-in for tests and benches: python-snap7's own S7 server
(``snap7.server.Server``, ISO-on-TCP) in a subprocess on a loopback port, with the data
blocks a test names.

One fix over the library's server: it takes the byte of a bit write (``write_area`` with
``WordLen.Bit``, the address ``byte * 8 + bit``) but drops the bit number and stores the
written value as the whole byte, clearing the byte's other seven bits. A real CPU sets
or clears the one bit. :class:`_BitServer` does what the CPU does, so the driver's bit
writes are tested against the behaviour they rely on.

Run it alone::

    python -m hil.plc.s7_plc --address 127.0.0.1:1102 --db 1:64 --db 2:300

or from a test with :class:`S7Plc`, which picks a free port, waits until the server
accepts connections, and can pause (SIGSTOP), resume and kill it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hil.plc.process import ProcessPlc

MAX_DB_SIZE = 65_536


def _bit_server() -> Any:
    """The server class with bit writes fixed (imports snap7 in the simulator only)."""
    from snap7.server import Server  # noqa: PLC0415 - the simulator's own process
    from snap7.type import WordLen  # noqa: PLC0415

    class _BitServer(Server):
        def _parse_address_specification(self, addr_spec: bytes) -> dict[str, Any]:
            parsed: dict[str, Any] = super()._parse_address_specification(addr_spec)
            if parsed and parsed.get("word_len") == WordLen.Bit and len(addr_spec) >= 12:
                parsed["bit"] = addr_spec[11] & 0x07
            return parsed

        def _parse_write_address(self, request: dict[str, Any]) -> Any:
            found = super()._parse_write_address(request)
            spec = request.get("parameters", {}).get("address_spec", {})
            if found is None or "bit" not in spec:
                return found
            area, db_number, start, count, data = found
            memory = self.memory_areas.get((area, db_number))
            if memory is None or start >= len(memory):
                return found  # answered as the library answers a bad address
            mask = 1 << int(spec["bit"])
            with self.area_locks[(area, db_number)]:
                byte = memory[start] | mask if data[0] & 1 else memory[start] & ~mask
            return area, db_number, start, count, bytearray([byte])

    return _BitServer


def serve(host: str, port: int, dbs: dict[int, int]) -> None:
    """Serve the data blocks ``{number: size}`` (zeroed) on ``host:port`` until killed."""
    from snap7.type import SrvArea  # noqa: PLC0415

    server = _bit_server()(log=False)
    for number, size in dbs.items():
        server.register_area(SrvArea.DB, number, bytearray(size))
    server.start_to(host, port)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


class S7Plc(ProcessPlc):
    """python-snap7's S7 server in a subprocess on ``127.0.0.1:port``.

    Args:
        dbs: ``{number: size in bytes}`` of the data blocks it holds (zeroed at start).
        logdir: where its output goes (``s7_plc.log``).
    """

    WHAT = "the S7 server"

    def __init__(self, dbs: dict[int, int], logdir: Path, host: str = "127.0.0.1") -> None:
        self.dbs = dict(dbs)
        super().__init__(logdir / "s7_plc.log", host)

    def argv(self) -> list[str]:
        dbs = [f"--db={n}:{size}" for n, size in self.dbs.items()]
        return [sys.executable, "-m", "hil.plc.s7_plc", f"--address={self.host}:{self.port}", *dbs]


def _db(text: str) -> tuple[int, int]:
    number, _, size = text.partition(":")
    n, s = int(number), int(size)
    if not 1 <= n <= 65_535 or not 1 <= s <= MAX_DB_SIZE:
        raise argparse.ArgumentTypeError(f"--db {text}: DB 1..65535, size 1..{MAX_DB_SIZE}")
    return n, s


def main() -> None:
    """``python -m hil.plc.s7_plc --address HOST:PORT --db N:SIZE ...``"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default="127.0.0.1:1102", help="HOST:PORT to listen on")
    parser.add_argument("--db", type=_db, action="append", default=[], help="N:SIZE, repeatable")
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    serve(host or "127.0.0.1", int(port), dict(args.db) or {1: 256})


if __name__ == "__main__":
    main()
