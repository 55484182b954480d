"""The cluster bench's identities, made once and cached: a fleet CA and one key and
certificate per simulated device, under ``.cache/bench-fleet-cluster/``.

Enrolling 10,000 devices through the API takes minutes of the bench's two cores, and
the bench measures the cluster, not enrollment (``hil bench fleet`` measures that).
So the certificates are issued directly with :class:`fleet_server.ca.FleetCA` (the same
``sign_device_csr`` the enroll endpoint calls, CN = device id) and the device rows are
inserted the way enrollment stores them, their ``shard`` set by the enroll endpoint's
rule (:func:`fleet_server.broker.shards.assign_shard`). The device files are kept in a
directory named by the CA certificate's fingerprint, so a new CA never meets stale
certificates. The CA's passphrase is kept beside it (mode 0600): this is a bench CA,
never a fleet's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from fleet_server.broker.shards import assign_shard
from fleet_server.ca import FleetCA, make_device_key_and_csr
from fleet_server.config import FleetServerConfig
from fleet_server.db.tables import devices
from fleet_server.repository import Passphrases

log = logging.getLogger(__name__)

DEFAULT_CACHE = Path(".cache/bench-fleet-cluster")
PASSPHRASE_NAME = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 (a variable name)
CA_PASSPHRASE_ENV = f"{PASSPHRASE_NAME}_CA"
CERT_DAYS = 365
INSERT_BATCH = 1000


@dataclass(frozen=True)
class Seed:
    """The cached identities of one bench CA."""

    ca_dir: Path
    devices_dir: Path
    ca_passphrase: str
    serials: Mapping[str, str]
    issued_now: int

    def cert(self, device_id: str) -> Path:
        return self.devices_dir / f"{device_id}.crt"

    def key(self, device_id: str) -> Path:
        return self.devices_dir / f"{device_id}.key"


def _passphrase(cache: Path) -> str:
    path = cache / "ca-passphrase"
    if path.is_file():
        return path.read_text().strip()
    value = secrets.token_urlsafe(24)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


def prepare_seed(
    cache: Path, device_ids: Sequence[str], progress: Callable[[str], None] = lambda _m: None
) -> Seed:
    """The cached CA and a certificate for every id in ``device_ids`` (issuing those not
    cached yet).

    Raises:
        CAError: the CA can't be created or sign.
        OSError: the cache directory can't be written.
    """
    cache.mkdir(parents=True, exist_ok=True)
    secret = _passphrase(cache)
    pp = Passphrases(PASSPHRASE_NAME, environ={CA_PASSPHRASE_ENV: secret})
    ca_dir = cache / "ca"
    ca = FleetCA(ca_dir, pp)
    if not ca.exists():
        shutil.rmtree(ca_dir, ignore_errors=True)
        ca = FleetCA.create(ca_dir, passphrases=pp)
    fingerprint = hashlib.sha256(ca.cert_path.read_bytes()).hexdigest()[:16]
    out = cache / f"devices-{fingerprint}"
    out.mkdir(exist_ok=True)
    index = out / "serials.json"
    serials: dict[str, str] = json.loads(index.read_text()) if index.is_file() else {}
    missing = [d for d in device_ids if d not in serials or not (out / f"{d}.crt").is_file()]
    t0 = time.monotonic()
    for n, device_id in enumerate(missing, 1):
        key_pem, csr_pem = make_device_key_and_csr(device_id)
        issued = ca.sign_device_csr(csr_pem, device_id, valid_days=CERT_DAYS)
        key = out / f"{device_id}.key"
        key.write_bytes(key_pem)
        key.chmod(0o600)
        (out / f"{device_id}.crt").write_bytes(issued.cert_pem)
        serials[device_id] = issued.serial_hex
        if n % 1000 == 0:
            index.write_text(json.dumps(serials))
            progress(f"issued {n} of {len(missing)} device certificates")
    if missing:
        index.write_text(json.dumps(serials))
        log.info("issued %d device certificates in %.1f s", len(missing), time.monotonic() - t0)
    return Seed(ca_dir, out, secret, serials, len(missing))


def shard_of(config: FleetServerConfig, device_id: str, labels: Mapping[str, str]) -> str:
    """The shard enrollment gives this device (the enroll endpoint's rule)."""
    b = config.broker
    return assign_shard(device_id, labels, [(s.name, s.sites) for s in b.shards], b.shard_label)


def insert_devices(
    engine: sa.Engine,
    seed: Seed,
    config: FleetServerConfig,
    device_ids: Sequence[str],
    labels: Mapping[str, str],
    profile: str,
) -> dict[str, str]:
    """Store the devices the way enrollment does (labels, profile, certificate serial,
    shard); the shard of each device.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused the rows.
    """
    now = time.time()
    assigned = {d: shard_of(config, d, labels) for d in device_ids}
    rows = [
        {
            "device_id": d,
            "labels": dict(labels),
            "profile": profile,
            "enrolled_at": now,
            "online": False,
            "revoked": False,
            "cert_serial": seed.serials[d],
            "shard": assigned[d],
        }
        for d in device_ids
    ]
    with engine.begin() as conn:
        for i in range(0, len(rows), INSERT_BATCH):
            conn.execute(sa.insert(devices), rows[i : i + INSERT_BATCH])
    return assigned
