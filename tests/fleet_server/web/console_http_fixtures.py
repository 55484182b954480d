"""Fixtures of the console's HTTP tests (load with ``pytest_plugins``): ``repository``
(signed, per module), ``start`` (a FleetServer on a database URL, users of each role)
and ``console`` (on SQLite, seeded). The pieces are in
console_http_support.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet_server.auth import add_user
from fleet_server.db import sqlite_url
from fleet_server.serve import FleetServer, ServerContext
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, PASSPHRASE, TOKEN_ENV, api_config
from tests.fleet_server.web.console_http_support import HASHER, CapturingRollouts, Console
from tests.fleet_server.web.console_seed import seed_fleet
from tests.fleet_server.web.console_server import PASSWORD, USERS, make_repository


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("console-repo"))


@pytest.fixture
def start(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], Console]]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    servers: list[FleetServer] = []

    def run(db_url: str) -> Console:
        made: list[CapturingRollouts] = []

        def factory(ctx: ServerContext) -> CapturingRollouts:
            made.append(CapturingRollouts(ctx))
            return made[-1]

        server = FleetServer(api_config(tmp_path / "state", *repository, db_url=db_url),
                             services=[factory])  # fmt: skip
        server.start()
        servers.append(server)
        for name, role in USERS.items():
            add_user(server.context.engine, HASHER, name, role, PASSWORD)
        return Console(server, made[0])

    yield run
    for server in servers:
        server.stop()


@pytest.fixture
def console(start: Callable[[str], Console], tmp_path: Path) -> Console:
    """On SQLite, seeded."""
    c = start(sqlite_url(tmp_path / "fleet.db"))
    seed_fleet(c.engine, time.time())
    return c
