"""Each driver's connection settings (``[[plc]]`` entries, told apart by ``driver``).

Kept apart from the drivers so that loading a configuration never imports a protocol
library: a device without pylogix still checks a Logix connection's settings, and the
registry reports the driver unavailable when the agent runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from agent.line.drivers.base import LinkConfig

_HOST = r"^[A-Za-z0-9_.:\[\]-]{1,253}$"


class OpcUaLinkConfig(LinkConfig):
    """An OPC UA server (a PLC, an edge gateway) through asyncua's client."""

    driver: Literal["opcua"] = Field(description="`opcua`.")
    endpoint: str = Field(
        pattern=r"^opc\.tcp://[^\s/]+(/\S*)?$",
        max_length=512,
        description="The server's endpoint URL, e.g. `opc.tcp://plc1:4840`.",
    )
    security: Literal["none", "sign", "sign_and_encrypt"] = Field(
        description="Message security with policy Basic256Sha256: `sign`, `sign_and_encrypt`, "
        "or `none` (said explicitly: a line should not run without it).",
    )
    certificate: Path | None = Field(
        None, description="The agent's application certificate (DER or PEM); needed for security."
    )
    private_key: Path | None = Field(
        None,
        description="The application certificate's private key (PEM), readable by the agent only.",
    )
    server_certificate: Path | None = Field(
        None, description="The server's certificate to trust (pinned); default: the one it offers."
    )
    username: str | None = Field(
        None, max_length=128, description="User name for the session (default: anonymous)."
    )
    password_env: str | None = Field(
        None,
        max_length=128,
        description="Name of the secret holding the user's password (a file in "
        "$CREDENTIALS_DIRECTORY, or the environment); never the password itself.",
    )
    keepalive_s: float = Field(
        5.0, gt=0, le=3600, description="Read the server's state this often while idle."
    )

    @model_validator(mode="after")
    def _check(self) -> OpcUaLinkConfig:
        if self.security != "none" and (self.certificate is None or self.private_key is None):
            raise ValueError(f"security {self.security!r} needs `certificate` and `private_key`")
        if self.password_env and not self.username:
            raise ValueError("`password_env` needs `username` (the user the password is for)")
        return self


class ModbusLinkConfig(LinkConfig):
    """A Modbus TCP server (a PLC, a remote I/O) through pymodbus's client."""

    driver: Literal["modbus"] = Field(description="`modbus`.")
    host: str = Field(pattern=_HOST, description="The server's host name or address.")
    port: int = Field(502, ge=1, le=65535, description="TCP port.")
    unit_id: int = Field(1, ge=0, le=255, description="Unit (slave) id.")
    word_order: Literal["big", "little"] = Field(
        "big",
        description="Which 16-bit register of a 32/64-bit value comes first: `big` (high "
        "word first, Modbus's own order) or `little` (many PLCs).",
    )


class LogixLinkConfig(LinkConfig):
    """A Rockwell ControlLogix / CompactLogix over EtherNet/IP, tags by name (pylogix)."""

    driver: Literal["logix"] = Field(description="`logix`.")
    host: str = Field(pattern=_HOST, description="The controller's (or its module's) address.")
    port: int = Field(44818, ge=1, le=65535, description="EtherNet/IP TCP port.")
    slot: int = Field(0, ge=0, le=31, description="The processor's slot in the chassis.")
    micro800: bool = Field(False, description="A Micro800 (no backplane routing).")


class S7LinkConfig(LinkConfig):
    """A Siemens S7 (300/400/1200/1500) over ISO-on-TCP, DB areas (python-snap7)."""

    driver: Literal["s7"] = Field(description="`s7`.")
    host: str = Field(pattern=_HOST, description="The PLC's address.")
    port: int = Field(102, ge=1, le=65535, description="ISO-on-TCP port.")
    rack: int = Field(0, ge=0, le=7, description="Rack.")
    slot: int = Field(1, ge=0, le=31, description="The CPU's slot (S7-1200/1500: 1).")


class MqttLinkConfig(LinkConfig):
    """The agent's local MQTT broker ([mqtt]) as a line peer: an input is a topic's last
    payload, an output a publish (for PLCs and gateways that speak MQTT)."""

    driver: Literal["mqtt"] = Field(description="`mqtt`.")
    qos: int = Field(1, ge=0, le=1, description="QoS of writes and subscriptions.")


PlcConfig = Annotated[
    OpcUaLinkConfig | ModbusLinkConfig | LogixLinkConfig | S7LinkConfig | MqttLinkConfig,
    Field(discriminator="driver"),
]
