"""One ``fleet-server serve`` (``[broker] run = true``) with a shard: it runs both
Mosquittos itself, each with its own state directory and server certificate, and a
revocation reloads both."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_server.serve import FleetServer
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    http,
    make_repository,
)
from tests.fleet_server.shards.shard_support import enroll
from tests.support.broker import free_port
from tests.support.tls_peers import Peer


def test_serve_runs_every_shard_and_a_revocation_reloads_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    repo, keys = make_repository(tmp_path / "repo")
    main, eu = free_port(), free_port()
    broker = {
        "mosquitto": {"port": main, "persistence": False},
        "shards": [{"name": "eu", "port": eu, "sites": ["eu-1"], "advertise_port": 18883}],
    }
    cfg = api_config(tmp_path / "state", repo, keys, broker=broker)
    with FleetServer(cfg) as server:
        ctx = server.context
        assert sorted(ctx.managed_brokers) == ["eu", "main"]
        assert all(b.running for b in ctx.managed_brokers.values())
        assert (tmp_path / "state" / "broker-eu" / "server.crt").is_file()
        assert (tmp_path / "state" / "broker-eu" / "acl").is_file()
        body = enroll(server.url, "cam-eu-1", {"site": "eu-1"}, tmp_path)
        assert body["broker"] == {"host": "127.0.0.1", "port": 18883}  # advertised
        creds = (tmp_path / "ca.crt", tmp_path / "cam-eu-1.crt", tmp_path / "cam-eu-1.key")
        for port in (main, eu):  # one CA: the certificate is good on either broker
            peer = Peer(port, *creds)
            assert peer.connect()
            peer.close()
        revoked = http("POST", f"{server.url}/api/v1/devices/cam-eu-1/revoke", token=OPERATOR_TOKEN)
        assert revoked.body["broker_reloaded"] is True
        for port in (main, eu):  # both re-read the CRL before the answer came
            assert not Peer(port, *creds).connect()
