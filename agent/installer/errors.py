"""The installer's error: which step of an install failed, and why."""

from __future__ import annotations

from agent.errors import AgentError


class InstallError(AgentError):
    """An install (or a rollback) failed or was refused.

    By the time it is raised the device is back on its previous slot and the failure
    is reported and recorded in the install-state file.

    Attributes:
        step: the step that failed ("plan", "stage", "load", "benchmark", "switch",
            "health", "commit", "rollback").
        reason: what went wrong.
        name: the bundle's name ("" when it could not be read).
    """

    def __init__(self, step: str, reason: str, name: str = "") -> None:
        self.step = step
        self.reason = reason
        self.name = name
        what = f"bundle '{name}'" if name else "bundle"
        super().__init__(f"{what}: {step}: {reason}")
