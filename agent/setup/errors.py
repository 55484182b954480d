"""The error ``edge-agent setup`` raises (its own module, so that the parts of setup can
all raise it without importing each other)."""

from __future__ import annotations

from agent.errors import AgentError


class SetupError(AgentError):
    """Setup refused its input or could not finish; ``what`` names the input at fault.

    Attributes:
        what: the option or thing at fault ("--camera /dev/video3", "config").
        reason: what is wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")
