"""``[auth]`` of fleet.toml: sign-in sessions, the session cookie and failed sign-ins."""

from __future__ import annotations

import urllib.parse
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.kernel.configbase import Section
from fleet_server.auth.proxies import parse_networks


class AuthSection(Section):
    """Users' sign-in sessions (users themselves are added with ``fleetctl users``)."""

    session_idle_s: int = Field(
        1800,
        ge=60,
        le=7 * 86_400,
        description="A session unused this long ends (seconds; checked to within a minute).",
    )
    session_max_s: int = Field(
        12 * 3600,
        ge=300,
        le=30 * 86_400,
        description="A session ends this long after sign-in however busy it is (seconds).",
    )
    cookie_secure: Literal["auto", "always"] = Field(
        "auto",
        description="'auto': the session cookie is marked Secure when the request came over "
        "HTTPS (directly, or through one of trusted_proxies that sends "
        "X-Forwarded-Proto); 'always': always marked Secure (browsers then send it only "
        "over HTTPS).",
    )
    login_max_failures: int = Field(
        5,
        ge=1,
        le=100,
        description="Failed sign-ins for one user name from one address before a lockout.",
    )
    login_max_failures_per_address: int = Field(
        20,
        ge=1,
        le=10_000,
        description="Failed sign-ins from one address (an IPv6 /64), whatever the names, "
        "before that address is locked out.",
    )
    login_max_failures_per_user: int = Field(
        50,
        ge=1,
        le=10_000,
        description="Failed sign-ins for one user name, from any address, before that name "
        "is locked out everywhere (it slows guessing from many addresses; kept well above "
        "login_max_failures so that one guesser can't easily lock a user out).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description='Reverse proxies (addresses or CIDR blocks, e.g. "127.0.0.1/32") whose '
        "X-Forwarded-For and X-Forwarded-Proto are believed: the client is the rightmost "
        "X-Forwarded-For entry that is not itself a trusted proxy. Empty (the default): "
        "forwarded headers are ignored and the client is the connection's peer.",
    )
    login_lockout_s: int = Field(
        60,
        ge=1,
        le=3600,
        description="The first lockout (seconds); each further one within the hour doubles, "
        "up to 15 minutes.",
    )
    trusted_origins: list[str] = Field(
        default_factory=list,
        description="Origins (scheme://host[:port]) besides the server's own that may send "
        "state-changing requests with a session cookie, e.g. a reverse proxy's public name.",
    )

    @field_validator("trusted_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            parts = urllib.parse.urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(f"{origin!r} is not an origin like https://fleet.example:8443")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        parse_networks(value)
        return value

    @model_validator(mode="after")
    def _idle_within_max(self) -> AuthSection:
        if self.session_idle_s > self.session_max_s:
            raise ValueError(
                f"session_idle_s ({self.session_idle_s}) is above session_max_s "
                f"({self.session_max_s})"
            )
        return self
