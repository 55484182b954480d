"""``edge-agent`` starts light: the agent's config and what it brings (the pipelines'
services, MQTT, TUF, the decision log) are imported when a command that reads the config
runs, not to build the parser. Each check runs in a fresh interpreter and reads
``sys.modules`` (what was imported, not how long it took).

Why: the tests start ``edge-agent`` as a process dozens of times (``cameras`` alone about
twenty), and the config's imports cost most of a second of CPU a start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = (
    "agent.config",
    "agent.app",
    "paho",
    "tuf",
    "cryptography",
    "sqlite_utils",
    "onnxruntime",
    "sqlalchemy",
    "fastapi",
)
"""Not the installer's pydantic, NumPy and OpenCV: ``bundles`` and ``rollback`` are added
from agent.installer.cli, whose package imports them (left as it is)."""

_REPORT = (
    f"\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
)


def _heavy_after(code: str) -> list[str]:
    """The heavy modules loaded after ``code`` ran in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", code + _REPORT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout.splitlines()[-1])
    return loaded


def test_edge_agent_builds_every_help_page_without_its_config() -> None:
    code = """
import argparse
from agent.cli import build_parser

def helps(parser):
    yield parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from helps(sub)

assert len(list(helps(build_parser()))) > 10
"""
    assert _heavy_after(code) == []


def test_edge_agent_cameras_runs_without_its_config() -> None:
    code = """
import contextlib, io
from agent.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["cameras", "--no-network", "--json"]) == 0
assert out.getvalue().startswith("{"), out.getvalue()
"""
    assert _heavy_after(code) == []


def test_a_runtime_error_from_a_command_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """``main`` reports the runtime's errors (imported by the command, not by edge-agent):
    an unknown firmware profile is the runtime's ProfileError."""
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\ndevice_id = "d1"\nstate_dir = "st"\nprofile = "no-such"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "rollback", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("edge-agent: no-such: no profile named 'no-such'")
    assert proc.stderr.count("\n") == 1
    assert proc.stdout == ""
