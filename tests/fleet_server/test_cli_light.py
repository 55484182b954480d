"""``fleetctl`` and ``fleet-server`` start light: a command imports its libraries when it
runs, so the parsers, every ``--help`` and the commands that only talk HTTP import none
of the server's libraries. Each check runs in a fresh interpreter and reads
``sys.modules`` (what was imported, not how long it took).

Why: the tests start these tools as processes well over a hundred times, and importing
FastAPI, SQLAlchemy, alembic, pydantic, TUF and OpenCV cost about a second of CPU a start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fleet_server.cli import defaults

HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "tuf",
    "securesystemslib",
    "cryptography",
    "argon2",
    "numpy",
    "cv2",
    "onnxruntime",
    "paho",
)

_REPORT = (
    f"\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
)

_EVERY_HELP = """
import argparse

def helps(parser):
    yield parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from helps(sub)

pages = list(helps(build_parser()))
assert len(pages) > 5, len(pages)  # the tool and its subcommands
"""


def _heavy_after(code: str) -> list[str]:
    """The heavy libraries loaded after ``code`` ran in a fresh interpreter."""
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


def test_fleetctl_builds_every_help_page_without_the_servers_libraries() -> None:
    code = "from fleet_server.cli.fleetctl import build_parser\n" + _EVERY_HELP
    assert _heavy_after(code) == []


def test_fleet_server_builds_every_help_page_without_the_servers_libraries() -> None:
    code = "from fleet_server.cli.server import build_parser\n" + _EVERY_HELP
    assert _heavy_after(code) == []


def test_fleetctl_http_commands_run_without_the_servers_libraries() -> None:
    # nothing listens on the discard port of loopback: each command fails at once, exit 2
    code = """
from fleet_server.cli.fleetctl import main
for argv in (["devices", "list"], ["devices", "show", "cam-1"], ["telemetry", "cam-1"],
             ["rollouts", "status"], ["rollouts", "pause", "r-1"], ["drift", "--json"]):
    assert main([*argv, "--server", "http://127.0.0.1:9"]) == 3, argv  # unreachable
"""
    assert _heavy_after(code) == []


def test_fleet_server_check_config_prints_no_library_log_lines(tmp_path: Path) -> None:
    """The config's libraries are imported after logging is set up (alembic among them,
    which logs its plugins at INFO as it is imported): stderr stays empty."""
    config = tmp_path / "fleet.toml"
    config.write_text('[server]\nstate_dir = "state"\n[broker.mosquitto]\nport = 18883\n')
    proc = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.server", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith(f"{config}: ok (API ")


def test_the_parsers_copies_of_library_names_equal_the_librarys() -> None:
    from agent.wire.postprocess import POSTPROCESS_KINDS
    from fleet_server.auth.roles import ROLES as USER_ROLES
    from fleet_server.config import DEFAULT_CONFIG
    from fleet_server.repository.keys import DEFAULT_PASSPHRASE_NAME, ROLES

    assert defaults.DEFAULT_CONFIG == DEFAULT_CONFIG
    assert defaults.PASSPHRASE_NAME == DEFAULT_PASSPHRASE_NAME
    assert defaults.KEY_ROLES == ROLES
    assert defaults.USER_ROLES == USER_ROLES
    assert defaults.POSTPROCESS_KINDS == POSTPROCESS_KINDS
