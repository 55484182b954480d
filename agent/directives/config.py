"""The ``[bundles]`` section (signed bundles from the fleet): where the trust root lives, and
the broker of a device that is not enrolled. Called ``[fleet]`` before; that name is a
deprecated alias."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from agent.installer import InstallerConfig
from agent.kernel.configbase import MAX_TIMEOUT_S, Section
from agent.mqtt_config import LocalMqttConfig


class BundlesConfig(Section):
    """Signed bundle delivery from the fleet."""

    enabled: bool = Field(False, description="Take directives from the fleet's broker.")
    mqtt: LocalMqttConfig = Field(
        default_factory=LocalMqttConfig,
        description="A plain broker for directives, bundle fetches and install reports, "
        "used only while the device is not enrolled (development, tests); an enrolled "
        "device uses its one fleet session (agent/uplink/session.py says where the fleet "
        "broker is).",
    )
    trust_dir: Path = Field(
        Path("trust"),
        description="Trusted TUF root and metadata cache; relative to the state directory.",
    )
    initial_root: Path | None = Field(
        None,
        description="The root.json provisioned at enrollment; copied into trust_dir when "
        "trust_dir has none (a relative path is taken from the config file's directory).",
    )
    hardware_class: str | None = Field(
        None, description="Hardware class directives must name (default: the profile name)."
    )
    fetch_timeout_s: float = Field(
        10.0, gt=0, le=MAX_TIMEOUT_S, description="Timeout of one chunk request."
    )
    installer: InstallerConfig = Field(
        default_factory=InstallerConfig, description="Install checks and health window."
    )
