"""Writes docs/cli.md: the ``--help`` of every command and subcommand of edgefleet's tools.

The tools are the console commands in ``pyproject.toml``'s ``[project.scripts]``; each is
``module:function``. The parser comes from the module's ``build_parser()`` when it has
one, otherwise it is caught as ``main()`` hands it to argparse. Subcommands are found by
walking the parser's subparsers, depth first, in the order they were added. Help is
formatted 100 columns wide (``COLUMNS=100``), so the page does not depend on the terminal.

    python scripts/cli_reference.py            # rewrite docs/cli.md
    python scripts/cli_reference.py --check    # exit 1 when docs/cli.md is stale

``tests/test_docs.py`` fails when docs/cli.md differs from what this writes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "cli.md"
COLUMNS = "100"

HEADER = """\
# Command-line reference

Every command and subcommand of edgefleet's console tools, as its `--help` prints it.
The tools are the `[project.scripts]` of `pyproject.toml`; `make demo` and `make test`
install them into `.venv/bin/`.

This page is generated: run `python scripts/cli_reference.py` after changing a command
line; `tests/test_docs.py` fails while the page is stale.
"""


def console_scripts(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{command: "module:function"}`` from ``[project.scripts]``, in file order."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    scripts: dict[str, str] = data["project"]["scripts"]
    return scripts


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser caught")
        self.parser = parser


@contextlib.contextmanager
def _argv0(name: str) -> Iterator[None]:
    """A parser without ``prog`` takes its name from ``sys.argv[0]``."""
    saved = sys.argv
    sys.argv = [name]
    try:
        yield
    finally:
        sys.argv = saved


def _catch_parser(main: Callable[..., Any]) -> argparse.ArgumentParser:
    """The parser ``main()`` builds, taken from its first ``parse_args`` call."""
    original = argparse.ArgumentParser.parse_known_args

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        raise _Caught(self)

    argparse.ArgumentParser.parse_known_args = catch  # type: ignore[assignment,method-assign]
    try:
        main()
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise RuntimeError(f"{main.__module__}.{main.__name__} returned without parsing arguments")


def load_parser(name: str, target: str) -> argparse.ArgumentParser:
    """The argparse parser of console command ``name`` (entry point ``module:function``)."""
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    with _argv0(name):
        build = getattr(module, "build_parser", None)
        parser = build() if callable(build) else _catch_parser(getattr(module, function))
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"{target}: build_parser() returned {type(parser).__name__}")
    parser.prog = name
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """``(name, parser)`` of each subcommand, aliases left out, in the order added."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((sub_name, sub))
    return found


def walk(
    name: str, parser: argparse.ArgumentParser
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` for the command and all its subcommands, depth first."""
    yield name, parser
    for sub_name, sub in _subcommands(parser):
        yield from walk(f"{name} {sub_name}", sub)


def _help(parser: argparse.ArgumentParser) -> str:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        text = parser.format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _anchor(command: str) -> str:
    return command.replace(" ", "-")


def render(scripts: dict[str, str] | None = None) -> str:
    """The whole of docs/cli.md."""
    scripts = console_scripts() if scripts is None else scripts
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for name, target in scripts.items():
        parser = load_parser(name, target)
        sections.append((name, [(command, _help(p)) for command, p in walk(name, parser)]))

    out = [HEADER.rstrip("\n")]
    out.append("| command | entry point | subcommands |\n| --- | --- | --- |")
    for (name, commands), target in zip(sections, scripts.values(), strict=True):
        out[-1] += f"\n| [`{name}`](#{_anchor(name)}) | `{target}` | {len(commands) - 1} |"
    for name, commands in sections:
        out.append(f"## {name}")
        for command, text in commands:
            if command != name:
                out.append(f"### {command}")
            out.append(f"```text\n{text}\n```")
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write docs/cli.md from the --help of every edgefleet command.",
        epilog="example: python scripts/cli_reference.py --check",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is stale")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="where to write (docs/cli.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
