"""The facts the alert rules judge, read from a real fleet database (SQLite and
PostgreSQL), stored the way ingest stores them: devices that went offline (their last
will), health reports with station counts and disk figures (a window apart), decisions
sent for review, drift flags, device certificates from a real fleet CA, and the roles
of a real TUF repository."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.engine import Engine

from agent.wire.reports import Health, ReportedState
from fleet_server.alerts.config import RulesSection
from fleet_server.alerts.facts import CertCache, Sources, gather
from fleet_server.alerts.rules import evaluate
from fleet_server.alerts.runner import repository_roles
from fleet_server.ca import FleetCA
from fleet_server.db import store
from fleet_server.db.store import DecisionRecord
from fleet_server.db.tables import drift_status
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.repository import KeyStore, Passphrases, Repository

pytest_plugins = ["tests.fleet_server.db_fixtures"]

NOW = 1_800_000_000.0
MIN = 60.0
PASSPHRASE = "alerts facts test passphrase"  # noqa: S105 (test only)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> FleetCA:
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    return FleetCA.create(tmp_path_factory.mktemp("ca") / "ca", passphrases=pp)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repository]:
    root = tmp_path_factory.mktemp("repo")
    pp = Passphrases(environ={"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE})
    keys = KeyStore.create(root / "keys", root_keys=1, root_threshold=1, passphrases=pp)
    repository = Repository(root / "repo")
    repository.init(keys)
    return repository


def _csr(device_id: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, device_id)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def _health(device_id: str, ts: float, seq: int, **fields: object) -> Health:
    return Health.model_validate({"device_id": device_id, "seq": seq, "ts": ts, **fields})


def test_the_rules_find_what_the_fleet_stores(db: Engine, ca: FleetCA) -> None:
    clock = Clock(NOW - 3600)
    sink = SqlSink(db, clock=clock)
    for device, site, line in (("cam-1", "plant-a", "3"), ("cam-2", "plant-b", "4"),
                               ("cam-3", "plant-a", "3")):  # fmt: skip
        issued = ca.sign_device_csr(
            _csr(device), device, valid_days=10 if device == "cam-1" else 300
        )
        store.upsert_device(db, device, labels={"site": site, "line": line}, profile="x86",
                            cert_serial=issued.serial_hex)  # fmt: skip
        sink.store_state(device, ReportedState(device_id=device, ts=clock.now))
    store.upsert_device(db, "gone", labels={"site": "plant-a"}, revoked=True)
    # cam-1 was last seen 40 minutes ago, then its session ended (its will); cam-2 5 minutes ago
    for device, ago in (("cam-1", 40 * MIN), ("cam-2", 5 * MIN)):
        clock.now = NOW - ago
        sink.store_state(device, ReportedState(device_id=device, ts=clock.now))
        sink.store_state(device, ReportedState.offline(device))
    # cam-3: a station whose misses rose by 6 in the last 15 minutes, overruns by 1; its
    # state directory over its budget
    gate = {"triggers": 100, "deadline_missed": 4, "overruns": 2}
    clock.now = NOW - 20 * MIN
    sink.store_health([_health("cam-3", clock.now, 1, stations={"gate": gate})])
    later = {"triggers": 400, "deadline_missed": 10, "overruns": 3}
    clock.now = NOW - MIN
    sink.store_health([_health("cam-3", clock.now, 2, stations={"gate": later}, disk_free_mb=9000,
                               state_dir_mb=1100, disk_budget_mb=1024)])  # fmt: skip
    sink.store_health([_health("cam-2", clock.now, 1, disk_free_mb=100, stations={})])
    # line 3: 3 decisions sent for review, one reviewed; an older one out of the window
    rows = [DecisionRecord(f"d{i}", "cam-3", NOW - 600 + i, "cam1", "review", "det", "1.0",
                           {"line": "3"}) for i in range(3)]  # fmt: skip
    rows.append(DecisionRecord("old", "cam-3", NOW - 30 * 3600, "cam1", "review", "det", "1.0", {}))
    rows.append(DecisionRecord("ok", "cam-1", NOW - 60, "cam1", "pass", "det", "1.0", {}))
    store.insert_decisions(db, rows)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO decision_reviews (device_id, decision_id, seq, decision_ts, line, "
                "model_name, model_version, decided, verdict, outcome, note, reviewer, "
                "reviewed_at) VALUES ('cam-3', 'd0', 1, :ts, '3', 'det', '1.0', 'review', "
                "'confirm', 'review', '', 'lena', :ts)"
            ),
            {"ts": NOW - 100},
        )
        conn.execute(
            drift_status.insert(),
            [{"model_name": "det", "model_version": "1.0", "line": "3", "drifted": True,
              "changed_at": NOW - 900, "result": {"reason": "psi 0.4 > 0.25"}},
             {"model_name": "det", "model_version": "1.0", "line": "4", "drifted": False,
              "changed_at": None, "result": None}],
        )  # fmt: skip
    rules = RulesSection.model_validate(
        {"review_backlog": {"max_pending": 1}, "station_overruns": {"min_count": 1}}
    )
    sources = Sources(issued=lambda serial: ca.issued(serial).not_after,
                      server_certs=lambda: {"fleet CA": ca.cert_path})  # fmt: skip
    cache = CertCache()
    facts = gather(db, rules, NOW, slow=True, sources=sources, cache=cache)
    found = {rule: sorted((c.key, c.sites) for c in cs or []) for rule, cs in
             evaluate(rules, facts).items()}  # fmt: skip
    assert found["device_offline"] == [("cam-1", ("plant-a",))]  # cam-2: 5 minutes, "gone": revoked
    assert found["station_deadline_missed"] == [("cam-3/gate", ("plant-a",))]  # 10 - 4 >= 5
    assert found["station_overruns"] == [("cam-3/gate", ("plant-a",))]  # 3 - 2 >= 1
    assert found["disk_over_budget"] == [("cam-2", ("plant-b",)), ("cam-3", ("plant-a",))]
    assert found["review_backlog"] == [("3", ("plant-a",))]  # d1, d2: over 1
    assert found["drift"] == [("det/1.0/3", ("plant-a",))]
    assert found["certificate_expiry"] == [("device:cam-1", ("plant-a",))]  # 10 days left
    (backlog,) = evaluate(rules, facts)["review_backlog"] or []
    assert backlog.detail["pending"] == 2
    assert cache.reads == 3  # each device's certificate read once...
    gather(db, rules, NOW, slow=True, sources=sources, cache=cache)
    assert cache.reads == 3  # ...and then known by its serial
    light = gather(db, rules, NOW, slow=False, sources=sources, cache=cache)
    assert light.certs is None
    assert light.roles is None
    off = RulesSection.model_validate(
        {name: {"enabled": False} for name in RulesSection().by_name()}
    )
    assert gather(db, off, NOW, slow=True, sources=sources, cache=cache) == type(facts)(now=NOW)


def test_the_repositorys_roles_are_read_with_their_versions_and_periods(repo: Repository) -> None:
    roles = {r.role: r for r in repository_roles(repo)}
    assert sorted(roles) == ["root", "snapshot", "targets", "timestamp"]
    ts = roles["timestamp"]
    assert ts.period_s == timedelta(days=1).total_seconds()
    assert ts.version == repo.timestamp().signed.version
    rules = RulesSection()
    from fleet_server.alerts.rules import Facts

    fresh = evaluate(rules, Facts(ts.expires - 23 * 3600, roles=list(roles.values())))
    assert fresh["tuf_expiry"] == []
    late = evaluate(rules, Facts(ts.expires - 3600, roles=list(roles.values())))
    assert [c.key for c in late["tuf_expiry"] or []] == ["timestamp"]
    assert repository_roles(Repository(Path(repo.path).parent / "none")) == []
