"""Broker shards without a broker: the shard a device is given at enrollment (a pure
function), the ``[[broker.shards]]`` config checks, the replica slots and the ACL that
grants every slot's service identities."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent.kernel.errors import ConfigError
from fleet_server.broker import acl_text, identity
from fleet_server.broker.fleet import shard_addresses
from fleet_server.broker.shards import assign_shard
from fleet_server.broker.slots import SlotError, claim_slot
from fleet_server.config import parse_config

SHARDS = [("eu", ["eu-1", "eu-2"]), ("us", ["us-1"])]


def test_a_listed_site_puts_the_device_on_its_shard_whatever_its_id() -> None:
    for n in range(50):
        assert assign_shard(f"cam-{n}", {"site": "eu-2"}, SHARDS) == "eu"
        assert assign_shard(f"cam-{n}", {"site": "us-1"}, SHARDS) == "us"
        assert assign_shard(f"cam-{n}", {"plant": "us-1"}, SHARDS, label="plant") == "us"


def test_the_assignment_is_stable_for_one_device() -> None:
    first = {f"cam-{n}": assign_shard(f"cam-{n}", {"site": "hq"}, SHARDS) for n in range(200)}
    again = {d: assign_shard(d, {"site": "hq", "line": "3"}, SHARDS) for d in first}
    assert first == again
    # a known answer: SHA-256, not Python's per-process salted hash()
    assert [assign_shard(f"cam-{n}", {}, SHARDS) for n in range(6)] == [
        assign_shard(f"cam-{n}", {}, list(SHARDS)) for n in range(6)
    ]


def test_devices_of_no_listed_site_spread_over_every_shard_main_included() -> None:
    counts = Counter(assign_shard(f"cam-{n:05d}", {"site": "hq"}, SHARDS) for n in range(3000))
    assert set(counts) == {"main", "eu", "us"}
    for shard, count in counts.items():
        assert 850 < count < 1150, (shard, counts)  # a third each, give or take 15 %


def test_without_shards_every_device_is_on_main() -> None:
    assert {assign_shard(f"cam-{n}", {"site": "eu-1"}, []) for n in range(100)} == {"main"}


def config(shards: list[dict[str, Any]], **broker: Any) -> Any:
    return parse_config({"broker": {"shards": shards, **broker}}, "fleet.toml")


EXTERNAL = {"host": "eu.example", "ca": "ca.crt", "cert": "f.crt", "key": "f.key"}


@pytest.mark.parametrize(
    ("shards", "broker", "field"),
    [
        ([{"name": "eu"}], {}, r"shards\[0\]\.port: a managed fleet's shard needs"),
        ([{"name": "main", "port": 9001}], {}, r"shards\[0\]\.name: 'main' is the main"),
        (
            [{"name": "eu", "port": 9001}, {"name": "eu", "port": 9002}],
            {},
            r"shards\[1\]\.name: 'eu' is shards\[0\]'s name",
        ),
        (
            [{"name": "eu", "port": 9001}, {"name": "us", "port": 9001}],
            {},
            r"shards\[1\]\.port: 9001 is shards\[0\]'s too",
        ),
        ([{"name": "eu", "port": 8883}], {}, r"shards\[0\]\.port: 8883 is the main broker's"),
        (
            [
                {"name": "eu", "port": 9001, "sites": ["a"]},
                {"name": "us", "port": 9002, "sites": ["a"]},
            ],
            {},
            r"shards\[1\]\.sites: 'a' is in shards\[0\]\.sites too",
        ),
        (
            [{"name": "eu", "port": 9001, "external": EXTERNAL}],
            {},
            r"shards\[0\]\.external: the fleet is managed",
        ),
        (
            [{"name": "eu", "port": 9001}],
            {"managed": False, "external": EXTERNAL},
            r"shards\[0\]\.external: an external fleet's shard needs its broker",
        ),
        ([{"name": "EU", "port": 9001}], {}, r"shards\[0\]\.name: String should match"),
    ],
)
def test_shard_config_errors_name_the_field(
    shards: list[dict[str, Any]], broker: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=f"fleet.toml: broker.*{field}"):
        config(shards, **broker)


def test_each_managed_shard_gets_its_own_state_dir_and_server_certificate() -> None:
    cfg = parse_config(
        {
            "server": {"state_dir": "/srv/fleet"},
            "broker": {"shards": [{"name": "eu", "port": 9001, "sites": ["eu-1"]}]},
        }
    )
    configs = cfg.shard_mosquitto_configs()
    assert list(configs) == ["main", "eu"]
    main, eu = configs["main"], configs["eu"]
    assert (eu.port, eu.state_dir, eu.certfile) == (
        9001,
        Path("/srv/fleet/broker-eu"),
        Path("/srv/fleet/broker-eu/server.crt"),
    )
    assert (eu.cafile, eu.crlfile) == (main.cafile, main.crlfile)
    assert main.state_dir == Path("/srv/fleet/broker")


def test_shard_addresses_say_where_each_broker_is_and_what_its_devices_are_told() -> None:
    managed = shard_addresses(
        parse_config(
            {
                "broker": {
                    "advertise_host": "fleet.plant",
                    "mosquitto": {"port": 8883},
                    "shards": [
                        {"name": "eu", "port": 9001, "sites": ["eu-1"]},
                        {"name": "us", "port": 9002, "advertise_host": "us.plant",
                         "advertise_port": 443},
                    ],
                }
            }
        )
    )  # fmt: skip
    assert [(a.name, a.port, a.advertise_host, a.advertise_port, a.sites, a.managed)
            for a in managed.values()] == [
        ("main", 8883, "fleet.plant", 8883, (), True),
        ("eu", 9001, "fleet.plant", 9001, ("eu-1",), True),
        ("us", 9002, "us.plant", 443, (), True),
    ]  # fmt: skip
    external = shard_addresses(
        config([{"name": "eu", "external": EXTERNAL, "sites": ["eu-1"]}], managed=False,
               external={**EXTERNAL, "host": "main.example"})
    )  # fmt: skip
    assert [(a.name, a.host, a.port, a.advertise_host, a.managed) for a in external.values()] == [
        ("main", "main.example", 8883, "main.example", False),
        ("eu", "eu.example", 8883, "eu.example", False),
    ]


def test_check_config_lists_the_shards(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[server]\nstate_dir = "state"\n[broker]\nadvertise_host = "fleet.plant"\n'
        '[[broker.shards]]\nname = "eu"\nport = 9001\nsites = ["eu-1", "eu-2"]\n'
    )
    run = [sys.executable, "-m", "fleet_server.cli.server", "check-config", "--config", str(path)]
    text = subprocess.run(run, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "  shard eu: 127.0.0.1:9001, devices told fleet.plant:9001, sites eu-1, eu-2" in text
    report = json.loads(
        subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60,
                       check=True).stdout
    )  # fmt: skip
    assert [s["name"] for s in report["shards"]] == ["main", "eu"]
    assert report["shards"][1]["sites"] == ["eu-1", "eu-2"]


def test_replicas_claim_distinct_slots_and_a_released_slot_is_taken_again(
    tmp_path: Path,
) -> None:
    first = claim_slot(tmp_path, 2, "a")
    second = claim_slot(tmp_path, 2, "b")
    assert (first.index, second.index) == (0, 1)
    with pytest.raises(SlotError, match="all 2 slots"):
        claim_slot(tmp_path, 2, "c")
    first.release()
    third = claim_slot(tmp_path, 2, "c")
    assert third.index == 0
    third.release()
    second.release()


def test_every_slot_has_its_own_service_identities_and_the_acl_grants_them() -> None:
    names = identity.slots_services(ingest_workers=2, slots=3)
    assert len(set(names)) == len(names) == 15
    assert identity.services_for(2, 0) == ["files", "rollouts", "actions", "ingest-0", "ingest-1"]
    assert identity.services_for(1, 2) == ["files-r2", "rollouts-r2", "actions-r2", "ingest-r2-0"]
    text = acl_text("fleet-server", names)
    for name in names:
        assert f"user {identity.service_cn(name)}\n" in text
    assert "user fleet:files-r2\ntopic read edgefleet/devices/+/fetch/request\n" in text
    assert (
        "user fleet:actions-r2\ntopic read edgefleet/devices/+/actions/result\n"
        "topic read edgefleet/devices/+/actions/chunk\n"
        "topic write edgefleet/devices/+/actions/request\n" in text
    )
    for bad in ("files-0", "ingest", "ingest-r0-1", "rollouts-x", "ingest-r1", "actions-1"):
        with pytest.raises(ValueError, match="not a fleet service"):
            identity.service_kind(bad)
