"""Request and response bodies of the HTTP API (documented in /openapi.json)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Responses = dict[int | str, dict[str, Any]]
"""Extra responses of an endpoint, for the OpenAPI document."""


def error_responses(**described: str) -> Responses:
    """``{status: {"model": ErrorOut, "description": ...}}`` from ``e404="No such device"``."""
    return {
        int(k.removeprefix("e")): {"model": ErrorOut, "description": v}
        for k, v in described.items()
    }


class ApiModel(BaseModel):
    """A response body: fixed fields, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorOut(ApiModel):
    """Every error: 400 malformed, 401 no or wrong token, 403 refused, 404 unknown,
    409 conflict, 503 not available."""

    detail: str = Field(description="What is wrong, in one line.")


class ServiceHealthOut(ApiModel):
    """What one running service says of itself."""

    ok: bool = Field(description="The service does its job.")
    detail: dict[str, Any] = Field(default_factory=dict, description="Figures that say why.")


class HealthOut(ApiModel):
    """The server's own health."""

    status: str = Field(description="'ok', or 'degraded' when a part is not working.")
    database: bool = Field(description="The database answers.")
    broker: bool = Field(description="The managed broker runs (true for an external one).")
    rollouts: bool = Field(description="The rollout service is attached.")
    services: dict[str, ServiceHealthOut] = Field(
        default_factory=dict,
        description="Each running service's own probe (ingest workers, file server ...).",
    )


class DeviceOut(ApiModel):
    """A device as the registry knows it (times in Unix seconds)."""

    device_id: str = Field(description="Device id (the CN of its certificate).")
    labels: dict[str, str] = Field(description="Selector labels.")
    profile: str = Field(description="Hardware profile it was enrolled as.")
    enrolled_at: float = Field(description="When it enrolled (pending: when its token was made).")
    agent_version: str | None = Field(description="edge-agent version it last reported.")
    last_seen: float | None = Field(description="Its last sign of life.")
    online: bool = Field(description="Online by its last state or will.")
    active_bundle: str | None = Field(description="Bundle it runs.")
    active_release: int | None = Field(description="Release of that bundle.")
    previous_bundle: str | None = Field(description="Bundle it ran before.")
    previous_release: int | None = Field(description="Release of that bundle.")
    active_version: str | None = Field(None, description="Version of the bundle it runs.")
    active_digest: str | None = Field(
        None, description="Digest of the bundle it runs (also one it was set up with)."
    )
    previous_version: str | None = Field(None, description="Version of the bundle before.")
    previous_digest: str | None = Field(None, description="Digest of the bundle before.")
    health: dict[str, Any] | None = Field(description="Its latest health report.")
    cert_serial: str | None = Field(description="Serial (hex) of its latest certificate.")
    revoked: bool = Field(description="Its certificates are revoked.")
    reported_profile: str | None = Field(
        None,
        description="The profile the device last reported of itself (shown only; "
        "rollouts and directives use profile).",
    )
    reported_labels: dict[str, str] | None = Field(
        None,
        description="The labels the device last reported of itself (shown only; "
        "selectors use labels).",
    )
    shard: str | None = Field(
        "main",
        description="The broker shard the device was given at enrollment (null: pending).",
    )
    pending: bool = Field(
        False,
        description="Enrolled by an operator (a token made) but never connected: it has not "
        "used its token, so it has no certificate yet; enrolled_at is when the token was made.",
    )
    token_expires_at: float | None = Field(
        None,
        description="A pending device's newest unused enrollment token expires then "
        "(Unix seconds; in the past: expired, make a new one). Null for a registered device.",
    )


class RecordOut(ApiModel):
    """One heartbeat or telemetry sample."""

    record_id: str = Field(description="Id made on the device.")
    ts: float = Field(description="When the device sent it.")
    payload: dict[str, Any] = Field(description="The message as received.")


class TelemetryOut(ApiModel):
    """A device's latest health and its recent heartbeats and samples, newest first."""

    device_id: str = Field(description="Device id.")
    last_seen: float | None = Field(description="Its last sign of life.")
    online: bool = Field(description="Online by its last state or will.")
    agent_version: str | None = Field(description="edge-agent version.")
    health: dict[str, Any] | None = Field(description="Latest health report.")
    heartbeats: list[RecordOut] = Field(description="Recent heartbeats.")
    samples: list[RecordOut] = Field(description="Recent health and telemetry samples.")


class TokenIn(BaseModel):
    """What a new enrollment token enrolls."""

    model_config = ConfigDict(extra="forbid")

    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels.")
    profile: str = Field("", max_length=64, description="Hardware profile name.")
    ttl_s: int | None = Field(
        None, gt=0, le=30 * 86_400, description="Lifetime in seconds (default: the server's)."
    )


class TokenOut(ApiModel):
    """A one-time enrollment token: shown once, only its hash is stored."""

    device_id: str = Field(description="The device it enrolls.")
    token: str = Field(description="The token (give it to edge-agent enroll).")
    expires_at: float = Field(description="When it expires (Unix seconds).")
    labels: dict[str, str] = Field(description="Labels the device gets.")
    profile: str = Field(description="Profile the device gets.")


class RevokeOut(ApiModel):
    """The result of revoking a device."""

    device_id: str = Field(description="The device.")
    revoked_serials: list[str] = Field(description="Certificate serials (hex) newly revoked.")
    broker_reloaded: bool = Field(description="The managed broker reloaded the new CRL.")


class BundleFileOut(ApiModel):
    """One signed file of a published bundle."""

    file: str = Field(description="Path inside the bundle.")
    target: str = Field(description="Target path in the repository.")
    length: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 in hex.")


class BundleOut(ApiModel):
    """A published bundle release."""

    name: str = Field(description="Bundle name.")
    version: str = Field(description="Semantic version.")
    release: int = Field(description="Release number.")
    profiles: list[str] = Field(description="Hardware profiles it is for (empty: all).")
    published: str | None = Field(description="When it was published (ISO 8601).")
    files: list[BundleFileOut] = Field(description="Its files.")


class RolloutCreateIn(BaseModel):
    """A rollout to create (validated in full by the rollout spec parser)."""

    model_config = ConfigDict(extra="forbid")

    bundle: str = Field(description="Bundle NAME@VERSION, or NAME with version.")
    version: str | None = Field(None, description="Bundle version (if not in bundle).")
    selector: str | dict[str, str] = Field(
        description="'line=3,profile=jetson-orin', or '*' for every device."
    )
    waves: str | list[str | int] = Field(description="Cumulative waves, e.g. '1,10%,50%,100%'.")
    soak_s: str | int = Field(description="Soak per wave: seconds or a duration like '10m'.")
    shadow_s: str | int | None = Field(
        None, description="Shadow phase per wave: seconds or a duration like '2h' (0: none)."
    )
    shadow_min: int | None = Field(None, description="Sampled frames before judging (500).")
    min_agreement: float | None = Field(
        None, description="Wilson lower bound of the shadow agreement needed (0.97)."
    )
    policy: dict[str, Any] | None = Field(
        None, description="Gates, approval, rollback, shifts, timeouts (docs/rollouts.md)."
    )


class ActionIn(BaseModel):
    """An operator action's note."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=500, description="Why (kept in the rollout history).")


class RolloutDeviceOut(BaseModel):
    """One device's place in a rollout."""

    model_config = ConfigDict(extra="allow")

    device_id: str = Field(description="Device id.")
    status: str = Field(description="pending, offline, assigned, installing, done, ...")
    wave: int | None = Field(None, description="Wave that assigned it (from 1).")


class RolloutOut(BaseModel):
    """A rollout; keys the service adds beyond these are passed through."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str = Field(description="Rollout id.")
    bundle: str = Field(description="Bundle name.")
    version: str = Field(description="Bundle version.")
    release: int | None = Field(None, description="Bundle release number.")
    phase: str = Field(description="planned, assigning, soaking, paused, completed, ...")
    wave: int = Field(0, description="Current wave, from 1 (0: none).")
    waves: int = Field(0, description="Number of waves.")
    reason: str = Field("", description="Why it is in this phase.")
    selector: dict[str, str] = Field(default_factory=dict, description="Selected labels.")
    counts: dict[str, int] = Field(default_factory=dict, description="Devices per status.")
    devices: list[RolloutDeviceOut] | None = Field(None, description="Per device.")
    created_at: float | None = Field(None, description="When it was created.")
    updated_at: float | None = Field(None, description="When it last changed.")
