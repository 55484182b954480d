"""The settings of the servers the agent offers the line (``[opcua_server]``,
``[modbus_server]``), both off by default."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from agent.kernel.configbase import MAX_QUEUE, MAX_TIMEOUT_S, Section


class OpcUaServerConfig(Section):
    """The agent as an OPC UA server: one OPC 40100 VisionSystem per station.

    Who may do what: users (``users_env``) may read, browse, subscribe and call the
    VisionSystems' methods (start a single job, select a recipe, halt, reset); nobody
    writes a value. Anonymous clients may read and browse only, and only with
    ``allow_anonymous_read``. Users need a secure channel (``sign`` or
    ``sign_and_encrypt``); ``security = "none"`` serves anonymous readers alone.
    """

    enabled: bool = Field(False, description="Serve OPC UA (off by default).")
    host: str = Field(
        "127.0.0.1",
        pattern=r"^[A-Za-z0-9_.:\[\]-]{1,253}$",
        description="The address to listen on. Loopback by default: give the line "
        "network's interface address explicitly (e.g. `192.168.10.5`) for PLCs and SCADA "
        "to reach it; `0.0.0.0` listens on every interface.",
    )
    port: int = Field(4840, ge=1, le=65535, description="TCP port (4840: OPC UA's own).")
    security: Literal["none", "sign", "sign_and_encrypt"] = Field(
        "sign_and_encrypt",
        description="The least message security an endpoint offers, with policy "
        "Basic256Sha256: `sign_and_encrypt` (only that endpoint), `sign` (Sign and "
        "SignAndEncrypt endpoints), or `none` (no security: anonymous read-only clients).",
    )
    certificate: Path | None = Field(
        None,
        description="The server's application certificate (DER or PEM), its URI "
        '`application_uri`; needed unless `security = "none"`.',
    )
    private_key: Path | None = Field(
        None,
        description="The application certificate's private key (PEM), readable by the agent only.",
    )
    application_uri: str = Field(
        "urn:edgefleet:agent",
        min_length=1,
        max_length=512,
        description="The server's ApplicationUri (the certificate's subjectAltName URI).",
    )
    users_env: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Name of the secret (a file in $CREDENTIALS_DIRECTORY, or the "
        "environment) holding the users: one `name:argon2-hash` (preferred) or "
        "`name:password` per line; never the users themselves.",
    )
    allow_anonymous_read: bool = Field(
        False,
        description="Let clients without a user read, browse and subscribe (never write "
        "or call a method).",
    )
    namespace_uri: str = Field(
        "urn:edgefleet:line",
        min_length=1,
        max_length=512,
        description="The namespace of the agent's own nodes (each station's "
        "VisionSystem and what it holds beyond OPC 40100).",
    )
    queue_bound: int = Field(
        1024,
        ge=1,
        le=MAX_QUEUE,
        description="Results and state changes queued for the server at most; more are "
        "dropped and counted (stations never wait on the server).",
    )
    results_kept: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Results per station kept for GetResultById and GetResultListFiltered.",
    )
    callback_timeout_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="The longest a method call waits on the agent (a trigger accepted, a "
        "recipe selected) before it answers BadTimeout.",
    )
    recipe_refresh_s: float = Field(
        10.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Read the installed bundles (the recipes) again this often.",
    )

    @model_validator(mode="after")
    def _someone_can_connect(self) -> OpcUaServerConfig:
        if not self.enabled:
            return self
        if self.security != "none" and (self.certificate is None or self.private_key is None):
            raise ValueError(
                f"security {self.security!r} needs `certificate` and `private_key` "
                '(or security = "none" for anonymous readers only)'
            )
        if self.security == "none" and self.users_env:
            raise ValueError(
                'users need a secure channel: security "sign" or "sign_and_encrypt" '
                '(with security = "none" their passwords would cross the line in clear)'
            )
        if not self.users_env and not self.allow_anonymous_read:
            raise ValueError("nobody could connect: set `users_env` or `allow_anonymous_read`")
        return self


MODBUS_BLOCK_MIN = 40
"""Registers one station's result takes (:mod:`agent.line.servers.modbus`)."""


class ModbusServerConfig(Section):
    """The agent as a Modbus TCP server: result registers, trigger coils, a heartbeat.

    The register map is fixed (see :mod:`agent.line.servers.modbus`): a header at holding
    register 0, each station's block at ``station_base + i * block_size`` in the order
    the stations are configured, and two coils per station (trigger, busy).
    """

    enabled: bool = Field(False, description="Serve Modbus TCP (off by default).")
    host: str = Field(
        "127.0.0.1",
        pattern=r"^[A-Za-z0-9_.:\[\]-]{1,253}$",
        description="The address to listen on. Loopback by default: give the line "
        "network's interface address explicitly (e.g. `192.168.10.5`) for PLCs to reach "
        "it; `0.0.0.0` listens on every interface, which Modbus (no authentication) "
        "should not.",
    )
    port: int = Field(
        5020,
        ge=1,
        le=65535,
        description="TCP port. 5020 by default: Modbus's own 502 needs privileges "
        "(CAP_NET_BIND_SERVICE) the agent does not run with.",
    )
    unit_id: int = Field(
        1,
        ge=0,
        le=255,
        description="The unit (slave) id the server answers; a request for another is "
        "answered with exception 0B (gateway target failed to respond). 0 answers every "
        "unit id.",
    )
    station_base: int = Field(
        100,
        ge=16,
        le=60_000,
        description="Holding register of the first station's block (the header is at 0).",
    )
    block_size: int = Field(
        50,
        ge=MODBUS_BLOCK_MIN,
        le=1000,
        description=f"Registers between two stations' blocks (at least {MODBUS_BLOCK_MIN}, "
        "the registers a result takes).",
    )
