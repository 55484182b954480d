"""Enrollment over HTTP: a device trades a one-time token and a CSR (its key never
leaves it) for a certificate from the fleet CA and what it needs to reach the fleet.

``POST /api/v1/enroll`` with :class:`EnrollRequest` as JSON gives :class:`EnrollResponse`
(200), or 400 (malformed), 403 (token unknown, used or expired; CSR refused) with
``{"detail": "<reason>"}``.
"""

from __future__ import annotations

from pydantic import Field

from agent.wire.base import WireModel

ENROLL_PATH = "/api/v1/enroll"


class EnrollRequest(WireModel):
    """What the device sends."""

    schema_version: int = Field(1, ge=1, description="Message schema version.")
    token: str = Field(min_length=16, max_length=256, description="The one-time token.")
    csr: str = Field(min_length=64, max_length=16384, description="PEM CSR, CN = the device id.")
    agent_version: str = Field("", max_length=64, description="The agent's version.")


class BrokerInfo(WireModel):
    """Where the fleet's MQTT broker listens (TLS, client certificates)."""

    host: str = Field(description="Host name or address.")
    port: int = Field(ge=1, le=65535, description="TLS port.")


class EnrollResponse(WireModel):
    """What the fleet answers."""

    schema_version: int = Field(1, ge=1, description="Message schema version.")
    device_id: str = Field(description="The device id the token was issued for.")
    certificate: str = Field(description="PEM client certificate (CN = device id).")
    ca: str = Field(description="PEM certificate of the fleet CA (to verify the broker).")
    broker: BrokerInfo = Field(description="The fleet's broker.")
    trust_root: str = Field(
        description="The bundle repository's root.json (JSON text): the device's TUF trust root."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Device labels.")
    profile: str = Field("", description="The hardware class the device was enrolled as.")
