"""``--version`` for the command-line tools: the installed edgefleet package's version,
looked up only when asked (the tools start without reading package metadata)."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Any

PACKAGE = "edgefleet"


def package_version() -> str:
    """The installed edgefleet's version ("unknown" when it is not installed)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


class VersionAction(argparse.Action):
    """Prints ``<prog> <version>`` and exits 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kw: Any) -> None:
        print(f"{parser.prog} {package_version()}", file=sys.stdout)
        parser.exit()


def add_version(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` a ``--version`` option."""
    parser.add_argument("--version", action=VersionAction)
