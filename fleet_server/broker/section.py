"""The ``[broker]`` section of ``fleet.toml``: the fleet's MQTT broker (a managed Mosquitto or
an external broker) and its shards (``[[broker.shards]]``), checked so that each shard
fits the fleet's kind and no name, port or site is shared."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, model_validator

from agent.kernel.configbase import Section
from fleet_server.broker.config import MosquittoConfig


class ExternalBroker(Section):
    """An MQTT 5 broker run by someone else; it must trust the fleet CA's client certs."""

    host: str = Field(description="Host name or address of its TLS listener.")
    port: int = Field(8883, ge=1, le=65535, description="TLS port.")
    ca: Path = Field(description="CA certificate (PEM) that verifies the broker.")
    cert: Path = Field(description="The fleet server's client certificate (PEM).")
    key: Path = Field(description="Its private key (PEM, unencrypted, mode 0600).")


_SHARD_NAME = r"^[a-z0-9][a-z0-9-]{0,31}$"


class BrokerShard(Section):
    """One more MQTT broker of the fleet (``[[broker.shards]]``). The main broker
    (``[broker]``) is shard ``main``; each device is given one shard at enrollment."""

    name: str = Field(pattern=_SHARD_NAME, description="The shard's name ('main' is taken).")
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Managed fleet: the TLS port of this shard's Mosquitto, on the main "
        "broker's host.",
    )
    external: ExternalBroker | None = Field(
        None, description="External fleet: this shard's broker (as [broker.external])."
    )
    advertise_host: str | None = Field(
        None,
        description="Host devices on this shard are told (default: a managed shard the "
        "main broker's advertised host, an external one its external host).",
    )
    advertise_port: int | None = Field(
        None, ge=1, le=65535, description="Port devices on this shard are told."
    )
    sites: list[str] = Field(
        default_factory=list,
        description="Values of the device label [broker] shard_label that put a device "
        "on this shard at enrollment; devices of no listed site are spread by a hash of "
        "their id.",
    )


MAIN_SHARD = "main"
"""The main broker's shard name (``[broker]`` itself)."""


def _check_shards(shards: list[BrokerShard], managed: bool) -> None:
    """Each shard fits the fleet's kind; names, ports and sites are not shared.

    Raises:
        ValueError: naming the shard's field (``shards[1].port: ...``).
    """
    names: dict[str, int] = {}
    ports: dict[int, int] = {}
    sites: dict[str, int] = {}
    for i, shard in enumerate(shards):
        at = f"shards[{i}]"
        if shard.name == MAIN_SHARD or shard.name in names:
            taken = (
                "the main broker's"
                if shard.name == MAIN_SHARD
                else f"shards[{names[shard.name]}]'s"
            )
            raise ValueError(f"{at}.name: {shard.name!r} is {taken} name")
        names[shard.name] = i
        if managed and shard.port is None:
            raise ValueError(f"{at}.port: a managed fleet's shard needs the port of its Mosquitto")
        if managed and shard.external is not None:
            raise ValueError(
                f"{at}.external: the fleet is managed (a shard is a Mosquitto it runs)"
            )
        if not managed and shard.external is None:
            raise ValueError(f"{at}.external: an external fleet's shard needs its broker")
        if not managed and shard.port is not None:
            raise ValueError(f"{at}.port: only for a managed fleet (give external.port)")
        if shard.port is not None:
            if shard.port in ports:
                raise ValueError(f"{at}.port: {shard.port} is shards[{ports[shard.port]}]'s too")
            ports[shard.port] = i
        for site in shard.sites:
            if site in sites and sites[site] != i:
                raise ValueError(f"{at}.sites: {site!r} is in shards[{sites[site]}].sites too")
            sites[site] = i


class BrokerSection(Section):
    """The fleet's MQTT broker: a managed Mosquitto, or an external broker."""

    managed: bool = Field(
        True, description="Run Mosquitto as a child process (else use [broker.external])."
    )
    run: bool = Field(
        True,
        description="Managed fleet: this process starts the Mosquitto children. Several "
        "replicas set run = false and connect to the brokers `fleet-server brokers` runs.",
    )
    shards: list[BrokerShard] = Field(
        default_factory=list,
        description="More brokers beside the main one (shard 'main'); see docs/scaling-brokers.md.",
    )
    replica_slots: int = Field(
        4,
        ge=1,
        le=32,
        description="Managed fleet: most fleet-server replicas connected to the brokers at "
        "once. Each replica claims a slot (a lock file in state_dir) and connects with "
        "that slot's service identities, which the ACL grants; the brokers force a "
        "client's id to its certificate's name, so two replicas must not share them.",
    )
    shard_label: str = Field(
        "site", description="The device label whose value picks a shard by its sites."
    )
    mosquitto: MosquittoConfig = Field(
        default_factory=MosquittoConfig,
        description="The managed Mosquitto; state_dir, cafile, crlfile, certfile and "
        "keyfile default to the fleet's state directory layout.",
    )
    external: ExternalBroker | None = Field(None, description="The external broker.")
    advertise_host: str | None = Field(
        None,
        description="Host name or address devices are told to connect to at enrollment "
        "(default: the listener's host).",
    )
    advertise_port: int | None = Field(
        None, ge=1, le=65535, description="Port devices are told (default: the listener's)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> BrokerSection:
        if self.managed and self.external is not None:
            raise ValueError("[broker.external] is given but managed = true")
        if not self.managed and self.external is None:
            raise ValueError("managed = false needs [broker.external] (host, ca, cert, key)")
        host = self.listen_host()
        if self.advertise_host is None and _unspecified(host):
            raise ValueError(f"the listener binds {host}: set advertise_host for devices")
        _check_shards(self.shards, self.managed)
        for i, shard in enumerate(self.shards):
            if self.managed and shard.port == self.mosquitto.port:
                raise ValueError(f"shards[{i}].port: {shard.port} is the main broker's port")
        return self

    def shard_names(self) -> list[str]:
        """Every shard's name, ``main`` first."""
        return [MAIN_SHARD, *(s.name for s in self.shards)]

    def shard(self, name: str) -> BrokerShard:
        """The ``[[broker.shards]]`` entry named ``name``.

        Raises:
            KeyError: no such shard (``main`` has none: it is ``[broker]`` itself).
        """
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise KeyError(name)

    def listen_host(self) -> str:
        """Where the broker listens (what the fleet server's own clients connect to)."""
        return self.external.host if self.external is not None else self.mosquitto.host

    def listen_port(self) -> int:
        """The broker's TLS port."""
        return self.external.port if self.external is not None else self.mosquitto.port


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
