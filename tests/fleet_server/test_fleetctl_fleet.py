"""fleetctl devices / telemetry / rollouts against a running fleet server: each command is
a subprocess (a parser built with add_fleet_commands, the way fleetctl adds them) whose
exit code and output are checked; the server runs in this process on real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.wire.enroll import ENROLL_PATH
from fleet_server import timefmt
from fleet_server.ca import make_device_key_and_csr
from fleet_server.db import store
from fleet_server.db.store import Record
from fleet_server.db.tables import devices
from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    WRONG_TOKEN,
    LocalRolloutOps,
    RunningApi,
    api_config,
    http,
    make_repository,
)
from tests.support.broker import free_port

HARNESS = """
import sys
from fleet_server.cli.fleetctl import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("fleetctl-repo"))


@pytest.fixture
def api(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningApi]:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    server = FleetServer(api_config(tmp_path / "state", *repository), services=[LocalRolloutOps])
    server.start()
    try:
        yield RunningApi(server)
    finally:
        server.stop()


def fleetctl(
    api: RunningApi, *args: str, token: str | None = OPERATOR_TOKEN, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    environ.pop("EDGEFLEET_API_TOKEN", None)
    environ["EDGEFLEET_SERVER"] = api.url
    if token is not None:
        environ["EDGEFLEET_API_TOKEN"] = token
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", HARNESS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environ,
    )


def ok(api: RunningApi, *args: str) -> str:
    proc = fleetctl(api, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def fails(api: RunningApi, *args: str, code: int, **kw: str | None) -> str:
    """fleetctl's one-line error, checked to exit with ``code`` (fleetctl --help: 2 usage,
    3 unreachable, 4 unauthorized, 5 not found, 6 conflict, 7 refused, 8 server)."""
    proc = fleetctl(api, *args, **kw)  # type: ignore[arg-type]
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("fleetctl: error: ")
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_devices_enroll_prints_a_one_time_token_that_enrolls_the_device(api: RunningApi) -> None:
    out = ok(api, "devices", "enroll", "cam-5", "--labels", "line=3", "--profile", "x86-gateway")
    first = out.splitlines()[0].split()
    assert first[0] == "token"
    token = first[1]
    assert "shown once" in out
    _, csr = make_device_key_and_csr("cam-5")
    enrolled = http("POST", api.url + ENROLL_PATH, {"token": token, "csr": csr.decode()})
    assert enrolled.status == 200, enrolled.body
    again = http("POST", api.url + ENROLL_PATH, {"token": token, "csr": csr.decode()})
    assert again.status == 403

    table = ok(api, "devices", "list")
    row = next(line for line in table.splitlines() if line.startswith("cam-5"))
    assert "line=3" in row
    assert table.splitlines()[-1] == "1 device(s)"
    assert json.loads(ok(api, "devices", "list", "--select", "line=4", "--json")) == []
    shown = json.loads(ok(api, "devices", "show", "cam-5", "--json"))
    assert (shown["profile"], shown["labels"], shown["online"]) == (
        "x86-gateway",
        {"line": "3"},
        False,
    )
    text = ok(api, "devices", "show", "cam-5")
    assert "profile   x86-gateway" in text
    assert "seen      never" in text


def test_a_device_enrolled_but_never_connected_is_listed_pending_with_its_token_expiry(
    api: RunningApi,
) -> None:
    out = ok(api, "devices", "enroll", "cam-7", "--labels", "line=3", "--ttl", "2h", "--json")
    token, expires = json.loads(out)["token"], json.loads(out)["expires_at"]
    stale = time.time() - 3 * 86_400  # an older token of another device, expired a day ago
    store.create_token(api.ctx.engine, store.hash_token("t" * 43), "cam-8", labels={"line": "4"},
                       profile="", ttl_s=2 * 86_400, now=stale)  # fmt: skip
    table = ok(api, "devices", "list").splitlines()
    row7 = next(line for line in table if line.startswith("cam-7"))
    assert "never connected (pending)" in row7
    assert f"token expires {timefmt.iso(expires)} (in " in row7
    row8 = next(line for line in table if line.startswith("cam-8"))
    assert "token expired " in row8
    assert "make a new one" in row8
    assert table[-1] == "2 device(s), 2 pending"
    listed = json.loads(ok(api, "devices", "list", "--select", "line=3", "--json"))
    assert [(d["device_id"], d["pending"], d["token_expires_at"]) for d in listed] == [
        ("cam-7", True, expires)
    ]
    shown = ok(api, "devices", "show", "cam-7")
    assert "device    cam-7  PENDING" in shown
    assert "enrolled, never connected" in shown
    assert f"token     token expires {timefmt.iso(expires)}" in shown
    assert "enrolled but never connected" in fails(api, "telemetry", "cam-7", code=5)
    _, csr = make_device_key_and_csr("cam-7")
    enrolled = http("POST", api.url + ENROLL_PATH, {"token": token, "csr": csr.decode()})
    assert enrolled.status == 200, enrolled.body
    now = json.loads(ok(api, "devices", "show", "cam-7", "--json"))
    assert (now["pending"], now["token_expires_at"], now["cert_serial"] is not None) == (
        False, None, True,
    )  # fmt: skip
    assert ok(api, "devices", "list").splitlines()[-1] == "2 device(s), 1 pending"


def test_telemetry_and_revoke_show_what_the_server_knows(api: RunningApi) -> None:
    engine = api.ctx.engine
    store.upsert_device(
        engine, "cam-6", agent_version="1.4.2", active_bundle="tiny", active_release=1
    )
    store.insert_heartbeats(
        engine, [Record("cam-6", f"h{i}", 1000.0 + i, {"seq": i}) for i in range(3)]
    )
    store.mark_seen(engine, "cam-6", 1002.0, True)
    tele = json.loads(ok(api, "telemetry", "cam-6", "--limit", "2", "--json"))
    assert [h["record_id"] for h in tele["heartbeats"]] == ["h2", "h1"]
    text = ok(api, "telemetry", "cam-6")
    assert "agent 1.4.2" in text
    assert "heartbeats (3, newest first):" in text
    assert "active    tiny release 1" in ok(api, "devices", "show", "cam-6")  # no version told
    with engine.begin() as conn:  # as a state report with the version stores it
        conn.execute(devices.update().where(devices.c.device_id == "cam-6").values(
            active_version="1.0.0"))  # fmt: skip
    assert "active    tiny 1.0.0 (release 1)" in ok(api, "devices", "show", "cam-6")
    listed = next(ln for ln in ok(api, "devices", "list").splitlines() if ln.startswith("cam-6"))
    assert "tiny 1.0.0 (release 1)" in listed
    health = {"ts": 1002.0, "fps": {"cam0": 9.96}, "latency_ms": {"detector": {
        "p50": 12.34, "p95": 20.0, "p99": 31.5, "count": 600}}, "cpu_percent": 41.25,
        "drops": {"queue_full": 3}, "stations": {"st-1": {"triggers": 90, "deadline_missed": 2,
        "overruns": 1}}}  # fmt: skip
    with engine.begin() as conn:
        conn.execute(devices.update().where(devices.c.device_id == "cam-6").values(health=health))
    shown = ok(api, "devices", "show", "cam-6")
    assert "  fps     cam0 10.0" in shown
    assert "  latency detector: p50 12.3 / p95 20.0 / p99 31.5 ms (600 inferences)" in shown
    assert "  station st-1: 90 triggers, 2 deadlines missed, 1 overruns" in shown
    assert "  device  CPU 41.2 %" in shown
    assert "{" not in shown  # read as lines, not a JSON blob
    revoked = ok(api, "devices", "revoke", "cam-6")
    assert revoked.startswith("revoked cam-6:")
    assert json.loads(ok(api, "devices", "show", "cam-6", "--json"))["revoked"] is True


def test_rollouts_create_status_pause_and_a_refused_approve(api: RunningApi) -> None:
    engine = api.ctx.engine
    for i in range(3):
        store.upsert_device(engine, f"d{i}", labels={"line": "3"}, profile="jetson-orin")
        store.mark_seen(engine, f"d{i}", 100.0, True)
    created = json.loads(
        ok(
            api, "rollouts", "create", "--bundle", "tiny@1.0.0",
            "--select", "line=3,profile=jetson-orin", "--waves", "1,100%", "--soak", "1m",
            "--approval", "--json",
        )
    )  # fmt: skip
    rid = created["rollout_id"]
    assert (created["phase"], created["wave"], created["waves"]) == ("assigning", 1, 2)
    table = ok(api, "rollouts", "status")
    row = next(line for line in table.splitlines() if line.startswith(rid))
    assert "tiny@1.0.0" in row
    assert "assigning" in row
    detail = ok(api, "rollouts", "status", rid)
    assert f"rollout   {rid}  tiny@1.0.0 (release 1)" in detail
    assert "phase     assigning  wave 1/2" in detail
    assert sum(line.endswith(" assigned") for line in detail.splitlines()) == 1
    assert "assigned 1, pending 2" in detail
    assert ok(api, "rollouts", "pause", rid, "--reason", "line stop").strip() == (
        f"pause: rollout {rid} is paused"
    )
    refused = fails(api, "rollouts", "approve", rid, code=6)
    assert "409" in refused
    assert "cannot approve a rollout that is paused" in refused
    assert ok(api, "rollouts", "resume", rid).strip().endswith("is assigning")
    bad = fails(api, "rollouts", "create", "--bundle", "tiny", "--select", "line=3", code=7)
    assert "400" in bad
    listed = ok(api, "rollouts", "list")
    assert listed.splitlines()[0].split() == ["ROLLOUT", "BUNDLE", "PHASE", "WAVE", "DONE"]
    assert any(line.startswith(rid) for line in listed.splitlines())
    assert ok(api, "rollouts", "cancel", rid).strip().endswith("is cancelled")
    watched = ok(api, "rollouts", "status", rid, "--watch", "0.2")  # ended: printed once
    assert watched.count(f"rollout   {rid}") == 1
    assert "phase     cancelled" in watched


def test_errors_are_one_line_with_an_exit_code_of_their_kind(
    api: RunningApi, tmp_path: Path
) -> None:
    assert "401" in fails(api, "devices", "list", code=4, token=WRONG_TOKEN)
    assert "401" in fails(api, "devices", "list", code=4, token=None)
    assert "404 no device 'ghost'" in fails(api, "devices", "show", "ghost", code=5)
    assert "404" in fails(api, "rollouts", "status", "r-none", code=5)
    dead = f"http://127.0.0.1:{free_port()}"
    assert "cannot reach" in fails(api, "devices", "list", "--server", dead, code=3)
    assert "not an http" in fails(api, "devices", "list", "--server", "ftp://x", code=2)
    # the operator token may come from $CREDENTIALS_DIRECTORY, which wins over the variable
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "EDGEFLEET_API_TOKEN").write_text(OPERATOR_TOKEN + "\n")
    proc = fleetctl(
        api, "devices", "list", "--json", token=WRONG_TOKEN, CREDENTIALS_DIRECTORY=str(creds)
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
