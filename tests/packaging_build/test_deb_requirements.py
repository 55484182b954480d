"""The pinned requirements of each package against what its code imports (read from the
sources, as ``build.py --lock`` reads them) and the versions the tests run here."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from tests.packaging_build.conftest import DEB_DIR, ROOT, load_module

SERVER_ONLY = ("fastapi", "uvicorn", "sqlalchemy", "psycopg", "alembic", "jinja2")
"""The fleet server's own stack. argon2-cffi is both parts': the agent's OPC UA server
checks its users' argon2 hashes too (agent/line/servers/opcua_users.py)."""


def _pins(part: str) -> dict[str, tuple[str, list[str]]]:
    pins = {}
    for line in (DEB_DIR / f"requirements-{part}.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        found = re.fullmatch(r"([a-z0-9-]+)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)", line)
        assert found, f"not a hash-pinned line: {line}"
        pins[found[1]] = (found[2], re.findall(r"[0-9a-f]{64}", found[3]))
    return pins


@pytest.mark.parametrize("part", ["agent", "server"])
def test_everything_the_part_imports_is_pinned_at_the_version_tested_here(part: str) -> None:
    lock = load_module("lock")
    parts = load_module("parts")
    imported = lock.distributions_for(lock.imported_top_levels(ROOT, parts.PARTS[part]))
    pins = _pins(part)
    for name, version in imported.items():
        assert name in pins, f"{part} imports {name} but requirements-{part}.txt lacks it"
        assert pins[name][0] == version, f"{name}: pinned {pins[name][0]}, tested {version}"
    for name, (version, _) in pins.items():
        assert importlib.metadata.version(name) == version, f"{name} is {version} in the lock"


def test_the_agent_carries_none_of_the_servers_stack() -> None:
    pins = _pins("agent")
    assert not [name for name in SERVER_ONLY if name in pins]
    server = _pins("server")
    assert all(name in server for name in SERVER_ONLY)
    assert "psycopg-binary" in server
    assert "argon2-cffi" in pins
    assert "argon2-cffi" in server


def test_a_file_per_arch_is_pinned_where_the_wheel_is_binary() -> None:
    pins = _pins("agent")
    for name in ("numpy", "onnxruntime", "opencv-python-headless", "ai-edge-litert"):
        assert len(pins[name][1]) == 2, f"{name}: one hash for amd64, one for arm64"
    assert len(pins["paho-mqtt"][1]) == 1, "a pure-Python wheel is the same file everywhere"


def test_the_import_scan_follows_first_party_imports_and_relative_ones() -> None:
    lock = load_module("lock")
    parts = load_module("parts")
    server = lock.imported_top_levels(ROOT, parts.PARTS["server"])
    assert {"fastapi", "sqlalchemy", "paho"} <= server
    agent = lock.imported_top_levels(ROOT, parts.PARTS["agent"])
    assert {"onnxruntime", "ai_edge_litert", "cv2", "numpy"} <= agent
    assert not {"fastapi", "sqlalchemy", "uvicorn"} & agent
