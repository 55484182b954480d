"""The agent's error root and its data-carrying subclasses.

Library code raises these; the CLI turns them into a one-line message and an exit code.
"""

from __future__ import annotations

from agent.kernel.errors import EdgefleetError


class AgentError(EdgefleetError):
    """Root of every error the agent raises on purpose (the configuration and bundle
    errors it shares with the fleet are in :mod:`agent.kernel.errors`)."""


class CaptureError(AgentError):
    """A capture source can't be opened or read.

    Attributes:
        source: the camera's name.
        reason: what failed.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"camera '{source}': {reason}")


class SensorError(AgentError):
    """A sensor source or one of its readings is not usable.

    Attributes:
        source: the sensor's name.
        reason: what failed.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"sensor '{source}': {reason}")


class DecisionLogError(AgentError):
    """The decision log can't be opened or written."""


class PipelineError(AgentError):
    """A pipeline can't be built from its bundle(s), or a model's output does not fit the
    post-processing the manifest names.

    Attributes:
        pipeline: the pipeline's name.
        reason: what failed.
    """

    def __init__(self, pipeline: str, reason: str) -> None:
        self.pipeline = pipeline
        self.reason = reason
        super().__init__(f"pipeline '{pipeline}': {reason}")
