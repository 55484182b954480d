"""The line's errors: every failure to talk to a PLC carries one reason word.

The reason words are counted per station and driver in stats, ``/healthz`` and metrics
(``edgefleet_line_failures_total{link,driver,reason}``), so an integrator can tell a
refused connection from a missing node at a glance.
"""

from __future__ import annotations

from agent.errors import AgentError

REASONS: tuple[str, ...] = (
    "refused",  # the connection was refused or reset (nothing listens, the PLC closed it)
    "timeout",  # no answer within the link's timeout (a stalled server, a cut cable)
    "bad_node",  # the address does not exist on the PLC (node id, tag, register, DB)
    "type_mismatch",  # the PLC holds another type than the config says, or the value does not fit
    "denied",  # the PLC refused the user, the certificate or the write (access rights)
    "queue_full",  # the link's bounded write queue was full: the write was not queued
    "disconnected",  # the link is down (reconnecting): the write was not tried
    "protocol",  # the peer answered something the protocol does not allow
    "unavailable",  # the driver's library can't be imported on this device
)
"""Every reason word a line failure may carry."""


class LineError(AgentError):
    """Talking to a PLC failed.

    Attributes:
        link: the PLC connection's name (``[[plc]] name``).
        reason: one of :data:`REASONS`.
        detail: what the library said.
    """

    def __init__(self, link: str, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown line failure reason {reason!r}")
        self.link = link
        self.reason = reason
        self.detail = detail
        super().__init__(f"plc '{link}': {reason}: {detail}")
