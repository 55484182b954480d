"""Where the agent finds the device's local MQTT broker (robots, PLCs, local sensors)."""

from __future__ import annotations

from pydantic import Field

from agent.kernel.configbase import Section
from agent.kernel.secrets import read_secret


class LocalMqttConfig(Section):
    """The local broker on the device (Mosquitto on loopback in a standard install)."""

    host: str = Field("127.0.0.1", description="Broker host; the device's own broker.")
    port: int = Field(1883, ge=1, le=65535, description="Broker TCP port.")
    client_id_prefix: str = Field(
        "edge-agent", description="Prefix of the MQTT client ids this agent uses."
    )
    username: str | None = Field(None, description="User name, if the broker wants one.")
    password_env: str | None = Field(
        None,
        description=(
            "Name of the environment variable (or file in $CREDENTIALS_DIRECTORY) that "
            "holds the password; never the password itself."
        ),
    )
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keepalive in seconds.")

    def password(self) -> str | None:
        """The password from $CREDENTIALS_DIRECTORY/<name> or the environment, if set."""
        return read_secret(self.password_env) if self.password_env else None
