"""The webhooks' HMAC keys, read by name from the credentials directory or the
environment (never from fleet.toml); ``fleet-server check-config`` and the start of
``serve`` both refuse a missing or short one, naming it."""

from __future__ import annotations

from agent.kernel.secrets import read_secret
from fleet_server.alerts.config import AlertsSection
from fleet_server.errors import FleetError

MIN_SECRET_CHARS = 16


def check_secret(name: str, value: str | None) -> bytes:
    """A webhook's secret as the HMAC key.

    Raises:
        FleetError: missing or shorter than :data:`MIN_SECRET_CHARS`.
    """
    if value is None:
        raise FleetError(
            f"alerts: the webhook secret ${name} is not set (environment or $CREDENTIALS_DIRECTORY)"
        )
    if len(value) < MIN_SECRET_CHARS:
        raise FleetError(
            f"alerts: the webhook secret ${name} has {len(value)} characters; at least "
            f"{MIN_SECRET_CHARS} are needed"
        )
    return value.encode()


def secrets_of(section: AlertsSection) -> dict[str, bytes]:
    """Each webhook's HMAC key by webhook name, read now.

    Raises:
        FleetError: a secret is missing or too short (naming it).
    """
    return {w.name: check_secret(w.secret_env, read_secret(w.secret_env)) for w in section.webhooks}


__all__ = ["MIN_SECRET_CHARS", "check_secret", "secrets_of"]
