"""A ControlLogix stand-in for tests and benches: cpppo's EtherNet/IP Logix simulator in a
subprocess on a loopback port, with the tags a test names.

cpppo is an independent EtherNet/IP stack (its own CIP parser and Logix tag services), so
a driver tested against it proves more than one tested against the client library's own
code. cpppo's command line knows the atomic types (``BOOL SINT INT DINT LINT USINT UINT
UDINT ULINT REAL LREAL``) and CIP's own strings, but not a Logix ``STRING``: on a
controller that is a structure (handle ``0x0FCE``: ``LEN`` DINT, ``DATA`` SINT[82], two
bytes of padding, 88 bytes in all), and clients such as pylogix read and write it as one.
This module adds it as the type ``LOGIX_STRING``, served as that structure, so string tags
are tested the way a controller holds them.

Run it alone::

    python -m hil.plc.logix_plc --address 127.0.0.1:44818 Trigger=BOOL PartId=LOGIX_STRING

or from a test with :class:`LogixPlc`, which picks a free port, waits until the
simulator accepts connections, and can pause (SIGSTOP), resume and kill it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hil.plc.process import ProcessPlc

LOGIX_STRING = "LOGIX_STRING"
"""The type name this wrapper adds for a Logix STRING structure."""
STRING_HANDLE = 0x0FCE
"""A Logix STRING's structure handle, as the controller reports it."""
STRING_DATA = 82
"""The characters a Logix STRING holds."""
STRING_SIZE = 88
"""A Logix STRING's bytes: LEN (4), DATA (82), padding (2)."""


def encode_string(text: str) -> bytes:
    """``text`` as the 88 bytes of a Logix STRING (latin-1, at most 82 characters).

    Raises:
        ValueError: it is longer than 82 characters or not latin-1.
    """
    raw = text.encode("latin-1")
    if len(raw) > STRING_DATA:
        raise ValueError(f"a Logix STRING holds {STRING_DATA} characters, not {len(raw)}")
    return len(raw).to_bytes(4, "little") + raw.ljust(STRING_SIZE - 4, b"\0")


def _serve(argv: list[str]) -> None:
    """cpppo's server main with ``LOGIX_STRING`` tags added (runs until killed)."""
    # cpppo has no type hints; it is imported here only, in the simulator's own process.
    from cpppo.dotdict import dotdict  # type: ignore[import-untyped]  # noqa: PLC0415
    from cpppo.server.enip import device, parser  # type: ignore[import-untyped]  # noqa: PLC0415
    from cpppo.server.enip.main import main  # type: ignore[import-untyped]  # noqa: PLC0415

    class LogixStringType(parser.STRUCT):  # type: ignore[misc]
        """The STRUCT parser a Logix STRING attribute reports (its handle is read from here)."""

        structure_tag = STRING_HANDLE
        struct_calcsize = STRING_SIZE

    string_tags: set[str] = set()
    rewritten = []
    for arg in argv:
        name, sep, kind = arg.partition("=")
        if sep and kind.upper() == LOGIX_STRING:
            string_tags.add(name)
            # cpppo's command line parses it as SSTRING; the Attribute below replaces it.
            rewritten.append(f"{name}=SSTRING")
        else:
            rewritten.append(arg)

    class Attribute(device.Attribute):  # type: ignore[misc]
        """cpppo's attribute, but a ``LOGIX_STRING`` tag holds one 88-byte structure."""

        def __init__(self, name: str, type_cls: Any, default: Any = 0, **kwds: Any) -> None:
            if name in string_tags:
                type_cls = LogixStringType
                # A one-element vector: cpppo takes anything with a length for an array.
                default = [dotdict(data=dotdict(input=encode_string("")))]
            super().__init__(name=name, type_cls=type_cls, default=default, **kwds)

        def __setitem__(self, key: Any, value: Any) -> None:
            if not isinstance(self.parser, LogixStringType):
                super().__setitem__(key, value)
                return
            # A Write Tag of a STRUCT arrives as {"input": the structure's bytes}.
            raw = bytes(value["input"] if isinstance(value, dict) else next(iter(value)))
            if len(raw) != STRING_SIZE:
                raise ValueError(f"a Logix STRING is {STRING_SIZE} bytes, not {len(raw)}")
            self.default[0] = dotdict(data=dotdict(input=raw))

    main(argv=rewritten, attribute_class=Attribute)


class LogixPlc(ProcessPlc):
    """cpppo's Logix simulator in a subprocess on ``127.0.0.1:port``.

    Args:
        tags: ``Name=TYPE`` definitions (cpppo's types, ``LOGIX_STRING``, arrays as
            ``Name=DINT[5]``).
        logdir: where its output goes (``logix_plc.log``).
        simple: a controller without a backplane to route through (cpppo's
            ``--simple``), as a Micro800 is; its strings are CIP SHORT_STRINGs
            (``Name=SSTRING``).
    """

    WHAT = "the Logix simulator"

    def __init__(
        self, tags: list[str], logdir: Path, host: str = "127.0.0.1", simple: bool = False
    ) -> None:
        self.tags = list(tags)
        self.simple = simple
        super().__init__(logdir / "logix_plc.log", host)

    def argv(self) -> list[str]:
        simple = ["--simple"] if self.simple else []
        address = f"{self.host}:{self.port}"
        return [
            sys.executable,
            "-m",
            "hil.plc.logix_plc",
            "--address",
            address,
            *simple,
            *self.tags,
        ]


def main() -> None:
    """``python -m hil.plc.logix_plc --address HOST:PORT Name=TYPE ...``"""
    args = sys.argv[1:]
    # Never read a cpppo.cfg from the working directory, nor open UDP.
    _serve(["--no-config", "--no-udp", *args])


if __name__ == "__main__":
    main()
