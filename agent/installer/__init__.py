"""The device's bundle installer: A/B slots, the install steps, health window, commit,
automatic rollback, and recovery after a stop at any point (docs/install-states.md)."""

from agent.installer.config import InstallerConfig
from agent.installer.errors import InstallError
from agent.installer.installer import Installer
from agent.installer.result import CHECKPOINTS, InstallResult, Report
from agent.installer.view import SlotStatus

__all__ = [
    "CHECKPOINTS",
    "InstallError",
    "InstallResult",
    "Installer",
    "InstallerConfig",
    "Report",
    "SlotStatus",
]
