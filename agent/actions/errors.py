"""Why an action did not deliver an event: refused or failed, or not answered in time."""

from __future__ import annotations

from agent.errors import AgentError


class ActionError(AgentError):
    """An action could not deliver one event.

    Attributes:
        action: the action's name.
        reason: what went wrong.
    """

    def __init__(self, action: str, reason: str) -> None:
        self.action = action
        self.reason = reason
        super().__init__(f"action '{action}': {reason}")


class ActionFailed(ActionError):
    """The target refused the event or could not be reached (counted ``failed``)."""


class ActionTimeout(ActionError):
    """The target did not answer within the action's timeout (counted ``timeout``)."""
