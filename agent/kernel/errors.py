"""The root of every edgefleet error, and the errors the agent and the fleet both raise.

Each domain has its own root below :class:`EdgefleetError` (``agent.errors.AgentError``,
``fleet_server.errors.FleetError``); a command line or HTTP layer that turns any library
error into a message catches :class:`EdgefleetError` alone. The runtime, which imports
nothing from here, has its own root (``runtime.errors.EdgeRuntimeError``).
"""

from __future__ import annotations


class EdgefleetError(Exception):
    """Root of every error the agent or the fleet server raises on purpose."""


class ConfigError(EdgefleetError):
    """A configuration file (or value) is not valid.

    Attributes:
        path: the file, or "" when the value did not come from a file.
        field: dotted name of the offending field ("" for the whole file).
        reason: what is wrong with it.
    """

    def __init__(self, path: str, field: str, reason: str) -> None:
        self.path = path
        self.field = field
        self.reason = reason
        where = f"{path}: " if path else ""
        at = f"{field}: " if field else ""
        super().__init__(f"{where}{at}{reason}")


class BundleError(EdgefleetError):
    """A model bundle is missing, malformed or does not fit this device.

    Attributes:
        path: the bundle directory or file.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"bundle {path}: {reason}")
