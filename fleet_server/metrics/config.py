"""The ``[metrics]`` section of the fleet server's configuration: ``GET /metrics``.

```toml
[metrics]
enabled = true
token_env = "EDGEFLEET_METRICS_TOKEN"   # unset: /metrics is open, as /healthz is
cache_s = 5
```

Without ``token_env`` the endpoint is served as ``/healthz`` is: to whoever reaches the
API's listener (loopback by default). With it, a scrape must send
``Authorization: Bearer <token>``: that token (a scrape-only secret a Prometheus
configuration can hold) or the operator token; anything else is a 401
(docs/metrics.md).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from agent.kernel.configbase import Section

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class MetricsSection(Section):
    """Prometheus metrics of the fleet server on ``GET /metrics``."""

    enabled: bool = Field(True, description="Serve GET /metrics (Prometheus text format).")
    token_env: str | None = Field(
        None,
        description="Name of the environment variable (or $CREDENTIALS_DIRECTORY file) "
        "holding a scrape token: with it, GET /metrics needs 'Authorization: Bearer "
        "<token>' (this token or the operator token); without it, /metrics is open like "
        "/healthz. The server refuses to start when the variable is named but unset.",
    )
    cache_s: float = Field(
        5.0,
        ge=0,
        le=300,
        description="Seconds the figures read from the database (devices by shard, "
        "rollouts by phase, quarantine by reason) are reused between scrapes; 0 reads "
        "them at every scrape.",
    )

    @field_validator("token_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value


__all__ = ["MetricsSection"]
