"""The fleet services on an external broker (``[broker] managed = false``): one configured
certificate, distinct client ids, the generated ingest group; and on the managed broker
each service under its own identity. A real Mosquitto plays the external broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_server.actions.service import ActionService
from fleet_server.broker import ManagedBroker, MosquittoConfig, identity
from fleet_server.ca import FleetCA
from fleet_server.jobs import RolloutRunner
from fleet_server.repository import Passphrases
from fleet_server.serve import FleetServer
from fleet_server.services import FileService, IngestService
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    api_config,
    make_repository,
)
from tests.support.broker import free_port
from tests.support.tls_peers import save_identity


@pytest.fixture
def external(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A CA in state/ca (as fleet-server would find it) and a Mosquitto run by "someone
    else", trusting it, with only the fleet-server identity in its ACL."""
    state = tmp_path / "state"
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    ca = FleetCA.create(state / "ca", passphrases=pp)
    key_pem, issued = ca.issue_server()
    save_identity(tmp_path, "server", key_pem, issued.cert_pem)
    key_pem, issued = ca.issue_service()
    save_identity(state, "fleet-server", key_pem, issued.cert_pem)
    ca.write_crl()
    broker = ManagedBroker(
        MosquittoConfig(
            port=free_port(),
            state_dir=tmp_path / "external",
            cafile=ca.cert_path,
            crlfile=ca.crl_path,
            certfile=tmp_path / "server.crt",
            keyfile=tmp_path / "server.key",
            # the services share one certificate here: an external broker must not bind
            # the client id to it (fleet_server/services.py)
            clientid_is_identity=False,
        )
    )
    broker.start()
    yield state, broker.config.port
    broker.stop()


def test_services_run_on_an_external_broker_with_the_one_configured_certificate(
    tmp_path: Path, external: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    state, port = external
    repo, keystore = make_repository(tmp_path / "repo")
    broker = {
        "managed": False,
        "advertise_host": "fleet.test",
        "external": {
            "host": "127.0.0.1",
            "port": port,
            "ca": str(state / "ca" / "ca.crt"),
            "cert": str(state / "fleet-server.crt"),
            "key": str(state / "fleet-server.key"),
        },
    }
    cfg = api_config(state, repo, keystore, broker=broker)
    server = FleetServer(cfg, services=[IngestService, FileService, RolloutRunner, ActionService])
    server.start()
    try:
        parts = server.context.health.check()
        assert {n: p.ok for n, p in parts.items()} == {
            "actions": True,
            "cluster": True,
            "files": True,
            "ingest-0": True,
            "rollouts": True,
        }, {n: p.detail for n, p in parts.items()}
        group = (state / identity.GROUP_FILE).read_text().strip()
        assert group.startswith("ingest-")
        assert not identity.guessable_group(group)
        # no per-service identity is issued for a broker fleet-server does not run
        assert not list((state / "identity").glob("svc-*"))
    finally:
        server.stop()
