"""fleet-server as a process: ``python -m fleet_server.cli.server serve`` with a real managed
Mosquitto (TLS, client certificates) and the API, stopped by SIGTERM; ``check-config``;
and FleetServer in this process for restarts and failed starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from agent.kernel.errors import ConfigError
from agent.wire import topics
from agent.wire.enroll import ENROLL_PATH
from fleet_server.ca import make_device_key_and_csr
from fleet_server.config import load_config, parse_config
from fleet_server.serve import FleetServer, ServeError
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    http,
    make_repository,
)
from tests.support.broker import free_port
from tests.support.tls_peers import Peer

START_TIMEOUT_S = 40.0
STOP_TIMEOUT_S = 30.0
NOT_AUTHORIZED = 0x87


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("serve-repo"))


@pytest.fixture(autouse=True)
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)


def write_config(directory: Path, repository: tuple[Path, Path], api: int, mqtt: int) -> Path:
    repo, keys = repository
    path = directory / "fleet.toml"
    path.write_text(
        f"""
[server]
state_dir = "state"
log_level = "info"

[http]
port = {api}
operator_token_env = "{TOKEN_ENV}"

[broker.mosquitto]
port = {mqtt}
persistence = false

[repository]
path = "{repo}"
keystore = "{keys}"
"""
    )
    return path


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2.0)
        return s.connect_ex(("127.0.0.1", port)) != 0


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> dict[str, object]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"fleet-server exited {proc.returncode}: {log.read_text()}"
        try:
            answer = http("GET", url + "/healthz")
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
            continue
        assert answer.status == 200, answer.body
        body: dict[str, object] = answer.body
        return body
    raise AssertionError(f"not healthy within {START_TIMEOUT_S} s: {log.read_text()}")


@pytest.fixture
def served(
    tmp_path: Path, repository: tuple[Path, Path]
) -> Iterator[tuple[subprocess.Popen[bytes], str, int, Path]]:
    api, mqtt = free_port(), free_port()
    config = write_config(tmp_path, repository, api, mqtt)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_server.cli.server", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    try:
        yield proc, f"http://127.0.0.1:{api}", mqtt, tmp_path / "state"
    finally:
        if proc.poll() is None:  # SIGTERM: the server stops its Mosquitto child too
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)


def test_serve_runs_tls_mosquitto_and_the_api_and_stops_on_sigterm(
    served: tuple[subprocess.Popen[bytes], str, int, Path], tmp_path: Path
) -> None:
    proc, url, mqtt, state = served
    health = wait_healthy(url, proc, tmp_path / "serve.log")
    services = health.pop("services")
    assert health == {"status": "ok", "database": True, "broker": True, "rollouts": True}
    assert isinstance(services, dict)
    assert {n: s["ok"] for n, s in services.items()} == {
        "files": True,
        "rollouts": True,
        "actions": True,
        "ingest-0": True,
        "drift": True,
        "cluster": True,
        "retention": True,
        "alerts": True,
    }
    files = services["files"]["detail"]
    assert files["thread_alive"] is True
    assert files["connected"] is True
    # each service connects as itself: a certificate of its own, CN fleet:<service>
    for service in ("files", "rollouts", "actions", "ingest-0"):
        cert = x509.load_pem_x509_certificate(
            (state / "identity" / f"svc-{service}.crt").read_bytes()
        )
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        assert cn == f"fleet:{service}"
    group = (state / "ingest-group").read_text().strip()
    assert group.startswith("ingest-")
    assert len(group) == len("ingest-") + 32

    # a device enrolls over the API and reaches the broker with what it got
    token = http("POST", f"{url}/api/v1/devices/cam-1/tokens", {}, token=OPERATOR_TOKEN)
    key_pem, csr_pem = make_device_key_and_csr("cam-1")
    req = {"token": token.body["token"], "csr": csr_pem.decode()}
    enrolled = http("POST", url + ENROLL_PATH, req).body
    assert enrolled["broker"] == {"host": "127.0.0.1", "port": mqtt}
    for name, data in (("ca.crt", enrolled["ca"]), ("cam-1.crt", enrolled["certificate"])):
        (tmp_path / name).write_text(data)
    (tmp_path / "cam-1.key").write_bytes(key_pem)
    device = Peer(mqtt, tmp_path / "ca.crt", tmp_path / "cam-1.crt", tmp_path / "cam-1.key")
    assert device.connect()  # TLS: the broker's certificate verifies for 127.0.0.1
    try:
        assert not device.publish(topics.heartbeat("cam-1"), b"{}").is_failure
        assert device.publish(topics.heartbeat("cam-2"), b"{}").value == NOT_AUTHORIZED
    finally:
        device.close()
    fleet = Peer(
        mqtt,
        state / "ca" / "ca.crt",
        state / "identity" / "fleet-server.crt",
        state / "identity" / "fleet-server.key",
    )
    assert fleet.connect()
    fleet.close()

    # revocation reaches the running broker: the device's next connection is refused
    revoked = http("POST", f"{url}/api/v1/devices/cam-1/revoke", token=OPERATOR_TOKEN).body
    assert revoked["broker_reloaded"] is True
    again = Peer(mqtt, tmp_path / "ca.crt", tmp_path / "cam-1.crt", tmp_path / "cam-1.key")
    assert not again.connect()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(STOP_TIMEOUT_S) == 0
    assert refused(mqtt), "mosquitto still listening after fleet-server stopped"
    assert refused(int(url.rsplit(":", 1)[1]))


def test_check_config_rejects_an_unknown_key_naming_file_and_field(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[http]\nprot = 8080\n[server]\nstate_dir = "s"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "fleet_server.cli.server", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert f"{config}: http.prot: unknown key" in proc.stderr


def test_check_config_resolves_paths_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "fleet.toml"
    config.parent.mkdir()
    config.write_text('[server]\nstate_dir = "../state"\n[broker.mosquitto]\nport = 18883\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet_server.cli.server",
            "check-config",
            "--config",
            str(config),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    state = (tmp_path / "etc" / ".." / "state").resolve()
    assert Path(report["state_dir"]).resolve() == state
    assert Path(report["ca"]).resolve() == state / "ca"
    assert report["broker"] == {"managed": True, "host": "127.0.0.1", "port": 18883}
    mq = load_config(config).mosquitto_config()
    assert (mq.certfile.resolve(), mq.cafile.resolve()) == (
        state / "broker" / "server.crt",
        state / "ca" / "ca.crt",
    )


def test_config_refuses_unsafe_or_incomplete_settings() -> None:
    with pytest.raises(ConfigError, match=r"x\.toml: http: .*operator_token_env"):
        parse_config({"http": {"host": "0.0.0.0"}}, "x.toml")  # noqa: S104
    with pytest.raises(ConfigError, match=r"broker: .*broker\.external"):
        parse_config({"broker": {"managed": False}}, "x.toml")
    with pytest.raises(ConfigError, match=r"broker\.mosquitto\.port"):
        parse_config({"broker": {"mosquitto": {"port": 0}}}, "x.toml")
    with pytest.raises(ConfigError, match=r"database\.url"):
        parse_config({"database": {"url": "mysql://db/fleet"}}, "x.toml")


def test_restart_keeps_the_ca_and_the_issued_certificates(
    tmp_path: Path, repository: tuple[Path, Path]
) -> None:
    cfg = api_config(
        tmp_path / "state",
        *repository,
        token=False,
        broker={"mosquitto": {"port": free_port(), "persistence": False}},
    )
    files = [
        cfg.ca_path / "ca.crt",
        cfg.mosquitto_config().certfile,
        cfg.identity_dir / "fleet-server.crt",
    ]
    with FleetServer(cfg) as server:
        assert http("GET", server.url + "/healthz").body["broker"] is True
        first = [f.read_bytes() for f in files]
    with FleetServer(cfg) as server:
        assert http("GET", server.url + "/healthz").status == 200
        assert [f.read_bytes() for f in files] == first


def test_a_failed_start_stops_the_broker_it_started(
    tmp_path: Path, repository: tuple[Path, Path]
) -> None:
    mqtt = free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cfg = parse_config(
            {
                "server": {"state_dir": str(tmp_path / "state")},
                "http": {"port": port},
                "broker": {"mosquitto": {"port": mqtt, "persistence": False}},
                "repository": {"path": str(repository[0]), "keystore": str(repository[1])},
            }
        )
        server = FleetServer(cfg)
        with pytest.raises(ServeError, match=f"cannot listen on 127.0.0.1:{port}"):
            server.start()
    assert refused(mqtt)
    with pytest.raises(ServeError, match="not started"):
        _ = server.context


def test_a_missing_operator_token_stops_the_start_naming_the_variable(
    tmp_path: Path, repository: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV)
    cfg = api_config(tmp_path / "state", *repository)
    with pytest.raises(ServeError, match=f"\\${TOKEN_ENV} is not set"):
        FleetServer(cfg).start()


def test_rollout_endpoints_answer_503_until_a_rollout_service_is_attached(
    tmp_path: Path, repository: tuple[Path, Path]
) -> None:
    with FleetServer(api_config(tmp_path / "state", *repository)) as server:
        answer = http("GET", server.url + "/api/v1/rollouts", token=OPERATOR_TOKEN)
        assert answer.status == 503
        assert "rollout service" in answer.body["detail"]
        assert http("GET", server.url + "/healthz").body["rollouts"] is False


def test_an_enrolled_agent_reports_state_heartbeats_and_decisions_to_the_fleet(
    served: tuple[subprocess.Popen[bytes], str, int, Path], tmp_path: Path
) -> None:
    from tests.agent.installer.installer_helpers import make_bundle

    proc, url, _mqtt, _state = served
    wait_healthy(url, proc, tmp_path / "serve.log")
    token = http(
        "POST",
        f"{url}/api/v1/devices/gw-1/tokens",
        {"labels": {"line": "3"}, "profile": "x86-gateway"},
        token=OPERATOR_TOKEN,
    ).body["token"]
    bundle = make_bundle(tmp_path, name="cls", version="1.0.0", release=1)
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    config = agent_dir / "agent.toml"
    config.write_text(
        '[agent]\ndevice_id = "gw-1"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        "[runtime]\nworkers = 1\npin = false\n[http]\nport = 0\n"
        "[uplink]\nenabled = true\nheartbeat_interval_s = 0.5\nhealth_interval_s = 1.0\n"
        "decisions_interval_s = 0.5\n"
        '[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = 20\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{bundle.path}"\n'
    )
    agent_bin = str(Path(sys.executable).parent / "edge-agent")
    enrolled = subprocess.run(
        [agent_bin, "enroll", url, "--token", "-", "--config", str(config)],
        input=token,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert enrolled.returncode == 0, enrolled.stderr
    db = agent_dir / "state" / "decisions.db"

    def reported() -> bool:
        telemetry = http("GET", f"{url}/api/v1/devices/gw-1/telemetry", token=OPERATOR_TOKEN)
        body = telemetry.body if telemetry.status == 200 else {}
        return bool(body.get("heartbeats")) and body.get("health") is not None and _uploaded(db)

    # it runs until the fleet has its heartbeats and health and acknowledged a decision,
    # then stops in order (SIGTERM, as systemd stops it)
    log = agent_dir / "agent.log"
    with log.open("wb") as out:
        run = subprocess.Popen(
            [agent_bin, "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while not reported():
            assert run.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "nothing reported in 90 s"
            time.sleep(0.25)
        run.send_signal(signal.SIGTERM)
        code = run.wait(30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    assert code == 0, log.read_text(errors="replace")
    device = http("GET", f"{url}/api/v1/devices/gw-1", token=OPERATOR_TOKEN).body
    assert device["agent_version"]
    assert device["labels"] == {"line": "3"}
    assert device["online"] is False  # it stopped: its will (or goodbye) says offline
    telemetry = http("GET", f"{url}/api/v1/devices/gw-1/telemetry", token=OPERATOR_TOKEN).body
    assert telemetry["heartbeats"], telemetry
    assert telemetry["health"] is not None
    assert _uploaded(db), "no decision was acknowledged by the fleet"


def _uploaded(db: Path) -> bool:
    """Whether the agent's decision log has a decision marked uploaded (read only)."""
    if not db.is_file():
        return False
    con = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=10)
    try:
        row = con.execute("SELECT count(*) FROM decisions WHERE uploaded = 1").fetchone()
    except sqlite3.OperationalError:  # the table is not made yet
        return False
    finally:
        con.close()
    return int(row[0]) > 0
