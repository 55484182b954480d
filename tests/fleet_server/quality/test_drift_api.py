"""GET /api/v1/drift, the drift job on demand, pins and ``fleetctl drift`` against a fleet
server running in this process on real HTTP (fleetctl as a subprocess, its exit code
and output checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_server.config import DriftSection
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    WRONG_TOKEN,
    RunningApi,
    api_config,
    make_repository,
)
from tests.fleet_server.quality.drift_data import PERIOD, fill

# A reference of 10 buckets, then 5 buckets up to the one now open; the current window
# (6 buckets long) holds all 5 for two minutes after the fixture stored them.
DRIFT = DriftSection(reference_hours=10 * PERIOD / 3600, window_hours=6 * PERIOD / 3600,
                     min_count=500, interval_s=3600)  # fmt: skip
T0 = 0


def _t0() -> int:
    return int(time.time()) // PERIOD * PERIOD - 14 * PERIOD


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("drift-repo"))


@pytest.fixture
def api(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningApi]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    config = api_config(tmp_path / "state", *repository).model_copy(update={"drift": DRIFT})
    server = FleetServer(config)
    server.start()
    try:
        running = RunningApi(server)
        engine = running.ctx.engine
        global T0  # noqa: PLW0603 (the fixture's time origin, read by the tests)
        T0 = _t0()
        for device, line in (("gw-1", "1"), ("gw-2", "2")):
            fill(engine, device, line, T0, range(10), 120)
        fill(engine, "gw-1", "1", T0, range(10, 15), 120, brightness=45.0)  # darker
        fill(engine, "gw-2", "2", T0, range(10, 15), 120)
        yield running
    finally:
        server.stop()


def fleetctl(api: RunningApi, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    environ["EDGEFLEET_SERVER"] = api.url
    environ["EDGEFLEET_API_TOKEN"] = OPERATOR_TOKEN
    return subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.fleetctl", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
        check=False,
    )


def test_drift_is_listed_per_model_version_and_line(api: RunningApi) -> None:
    answer = api.call("GET", "/api/v1/drift")
    assert answer.status == 200, answer.body
    items = {i["line"]: i for i in answer.body["items"]}
    assert set(items) == {"1", "2"}
    one, two = items["1"], items["2"]
    assert (one["model_name"], one["model_version"]) == ("cls", "1.0.0")
    assert one["judged"]
    assert one["drifted"]
    assert one["histograms"]["brightness"]["psi"] > 0.25
    assert one["histograms"]["brightness"]["over"]
    assert one["reference"] == {"start": T0, "end": T0 + 10 * PERIOD, "n": 1200, "pinned": False}
    assert one["current"]["n"] == 600
    assert "brightness: PSI" in one["reason"]
    assert not one["flagged"]  # the job has not run yet
    assert two["judged"]
    assert not two["drifted"]
    assert answer.body["settings"]["min_count"] == 500
    only = api.call("GET", "/api/v1/drift?line=2&model=cls&version=1.0.0").body["items"]
    assert [i["line"] for i in only] == ["2"]
    assert api.call("GET", "/api/v1/drift?model=other").body["items"] == []


def test_the_check_raises_one_event_for_the_drifted_line(api: RunningApi) -> None:
    first = api.call("POST", "/api/v1/drift/check")
    assert first.status == 200, first.body
    assert first.body["raised"] == ["cls 1.0.0 1"]
    assert api.call("POST", "/api/v1/drift/check").body["raised"] == []
    events = api.call("GET", "/api/v1/events?kind=drift").body["events"]
    assert [(e["device_id"], e["payload"]["line"]) for e in events] == [("line:1", "1")]
    flagged = {i["line"]: i["flagged"] for i in api.call("GET", "/api/v1/drift").body["items"]}
    assert flagged == {"1": True, "2": False}


def test_a_pinned_reference_window_is_used_and_can_be_dropped(api: RunningApi) -> None:
    body = {"model": "cls", "version": "1.0.0", "line": "1",
            "start": T0 + 10 * PERIOD, "end": T0 + 12 * PERIOD}  # fmt: skip
    pinned = api.call("PUT", "/api/v1/drift/pin", body)
    assert pinned.status == 200, pinned.body
    (item,) = api.call("GET", "/api/v1/drift?line=1").body["items"]
    assert item["reference"]["pinned"]
    assert item["reference"]["start"] == T0 + 10 * PERIOD
    assert not item["drifted"]  # dark against dark
    bad = api.call("PUT", "/api/v1/drift/pin", {**body, "end": body["start"]})
    assert bad.status == 400
    assert "not a finite window" in bad.body["detail"]
    assert api.call("DELETE", "/api/v1/drift/pin?model=cls&version=1.0.0&line=1").status == 200
    again = api.call("DELETE", "/api/v1/drift/pin?model=cls&version=1.0.0&line=1")
    assert again.status == 404


def test_drift_needs_the_operator_token(api: RunningApi) -> None:
    api.token = WRONG_TOKEN
    assert api.call("GET", "/api/v1/drift").status == 401
    assert api.call("POST", "/api/v1/drift/check").status == 401


def test_fleetctl_drift_prints_a_table_and_json(api: RunningApi) -> None:
    table = fleetctl(api, "drift")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["MODEL", "VERSION", "LINE", "STATE"]
    (line1,) = [ln for ln in lines[1:] if ln.split()[2] == "1"]
    assert line1.split()[:4] == ["cls", "1.0.0", "1", "DRIFTED"]
    assert "brightness" in line1
    as_json = fleetctl(api, "drift", "--line", "2", "--model", "cls", "--json")
    assert as_json.returncode == 0, as_json.stderr
    (item,) = json.loads(as_json.stdout)["items"]
    assert item["line"] == "2"
    assert item["drifted"] is False
    empty = fleetctl(api, "drift", "--model", "nothing")
    assert empty.returncode == 0
    assert "no drift buckets" in empty.stdout


def test_fleetctl_drift_without_a_server_fails_in_one_line(api: RunningApi) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    environ["EDGEFLEET_SERVER"] = "http://127.0.0.1:9"
    done = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.fleetctl", "drift"],
        capture_output=True, text=True, env=environ, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 3  # the server can't be reached (fleetctl --help)
    assert done.stderr.startswith("fleetctl: error: cannot reach http://127.0.0.1:9")
