"""Errors of camera discovery."""

from __future__ import annotations

from agent.errors import AgentError


class DiscoveryError(AgentError):
    """Discovery can't start: the interface does not exist, the socket can't be opened.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"camera discovery: {reason}")


class ProbeNotSent(DiscoveryError):
    """No probe left this device: no socket could be opened or no route leads to either
    group (a network without a default route, a device with no network at all)."""


class UntrustedXMLError(AgentError):
    """Bytes from the network are not XML this module accepts (too large, a DTD, not
    well-formed, not UTF-8).

    Attributes:
        reason: why the bytes were refused.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"untrusted XML refused: {reason}")
