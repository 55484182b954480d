"""The cluster bench's files: one config per replica (``[cluster] replica_id``, its own
HTTP port, ``[broker] run = false``, one shared state directory and database), the
brokers' config, and the bundle repository with one published bundle.

Before the tree has ``fleet-server brokers`` (one shard only), the first replica runs
the broker itself (``run = true``) and there is no brokers process.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.kernel.bundle import init_bundle
from fleet_server.broker.identity import guessable_group
from fleet_server.config import FleetServerConfig, parse_config
from fleet_server.errors import FleetError
from fleet_server.repository import KeyStore, Passphrases, Repository
from fleet_server.repository.bundledir import manifest_target
from hil.bench.cluster_procs import has_brokers_command, to_toml
from hil.bench.cluster_seed import PASSPHRASE_NAME
from hil.loopback import free_port

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "tests" / "data" / "tiny_classifier.tflite"
GROUP_TRIES = 20
PORT_TRIES = 20
CONNECTIONS_HEADROOM = 1000


class SetupError(FleetError):
    """The cluster bench's layout can't be made.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cluster bench setup: {reason}")


@dataclass(frozen=True)
class Layout:
    """Where everything of one bench run is."""

    root: Path
    config: FleetServerConfig
    replica_configs: dict[str, Path]
    replica_urls: dict[str, str]
    brokers_config: Path | None
    shard_ports: dict[str, int]


def _group() -> str:
    for _ in range(GROUP_TRIES):
        group = "bench-" + secrets.token_hex(12)
        if not guessable_group(group):
            return group
    raise SetupError("no random-looking ingest group name")


def _distinct_ports(n: int) -> list[int]:
    """``n`` free loopback ports, no two the same (free_port may repeat one).

    Raises:
        SetupError: not found within a bounded number of tries.
    """
    found: list[int] = []
    for _ in range(PORT_TRIES * n):
        port = free_port()
        if port not in found:
            found.append(port)
        if len(found) == n:
            return found
    raise SetupError(f"no {n} distinct free ports")


def make_layout(
    root: Path, db_url: str, replicas: int, shards: int, devices: int, token_env: str
) -> Layout:
    """Write the config files under ``root``.

    Raises:
        SetupError: more than one shard or replica, but no ``fleet-server brokers``.
        ConfigError: the configuration written does not validate.
    """
    brokers = has_brokers_command()
    if not brokers and (shards > 1 or replicas > 1):
        raise SetupError("this tree has no `fleet-server brokers`: one replica, one shard")
    ports = _distinct_ports(shards + replicas)
    shard_ports = {"main": ports[0]}
    for i in range(1, shards):
        shard_ports[f"shard{i}"] = ports[i]
    per_broker = devices // max(1, shards) * 2 + CONNECTIONS_HEADROOM
    base: dict[str, Any] = {
        "server": {"state_dir": str(root / "state"), "log_level": "warning"},
        "http": {"port": 0, "max_concurrency": 1000, "operator_token_env": token_env},
        "database": {"url": db_url},
        "broker": {
            "run": not brokers,
            "mosquitto": {
                "port": shard_ports["main"],
                "persistence": False,
                "max_connections": per_broker,
            },
            "shards": [{"name": n, "port": p} for n, p in shard_ports.items() if n != "main"],
        },
        "repository": {"path": str(root / "repository"), "keystore": str(root / "keystore")},
        "rollouts": {"tick_s": 0.5},
        "ingest": {"workers": 1, "group": _group()},
    }
    if not base["broker"]["shards"]:
        del base["broker"]["shards"]
    configs: dict[str, Path] = {}
    urls: dict[str, str] = {}
    for i in range(1, replicas + 1):
        name = f"r{i}"
        port = ports[shards + i - 1]
        data = base | {
            "http": base["http"] | {"port": port},
            "cluster": {"replica_id": name},
        }
        path = root / f"{name}.toml"
        path.write_text(to_toml(data))
        configs[name] = path
        urls[name] = f"http://127.0.0.1:{port}"
    brokers_config = None
    if brokers:
        brokers_config = root / "brokers.toml"
        brokers_config.write_text(to_toml(base))
    root.joinpath("state").mkdir(mode=0o700, exist_ok=True)
    config = parse_config(base)
    return Layout(root, config, configs, urls, brokers_config, shard_ports)


def make_repository(layout: Layout, passphrase: str, model: Path = DEFAULT_MODEL) -> None:
    """A repository with bundle ``tiny`` 1.0.0 published, its keys under ``passphrase``.

    Raises:
        RepoError: the repository can't be made or the bundle published.
    """
    pp = Passphrases(PASSPHRASE_NAME, environ={PASSPHRASE_NAME: passphrase})
    cfg = layout.config
    keys = KeyStore.create(cfg.keystore_path, root_keys=1, root_threshold=1, passphrases=pp)
    repo = Repository(cfg.repository_path)
    repo.init(keys)
    bundle = layout.root / "bundle"
    init_bundle(model, bundle, name="tiny", version="1.0.0")
    repo.publish(bundle, keys)


def targets_of(layout: Layout) -> dict[str, tuple[str, str, int]]:
    """Directive target path -> (bundle, version, release) of the published bundles."""
    repo = Repository(layout.config.repository_path)
    return {manifest_target(b.name, b.release): (b.name, b.version, b.release)
            for b in repo.bundles("tiny")}  # fmt: skip
