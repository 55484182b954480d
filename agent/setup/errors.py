"""The error ``edge-agent setup`` raises (its own module, so that the parts of setup can
all raise it without importing each other)."""

from __future__ import annotations

from agent.discovery.safetext import one_line
from agent.errors import AgentError

MAX_MESSAGE = 2000


class SetupError(AgentError):
    """Setup refused its input or could not finish; ``what`` names the input at fault.

    Attributes:
        what: the option or thing at fault ("--camera /dev/video3", "config").
        reason: what is wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        # one line, whatever a camera or a file put into it (the CLI prints it as is)
        self.what = one_line(what, MAX_MESSAGE)
        self.reason = one_line(reason, MAX_MESSAGE)
        super().__init__(f"{self.what}: {self.reason}")
