"""The agent's error root and its data-carrying subclasses.

Library code raises these; the CLI turns them into a one-line message and an exit code.
"""

from __future__ import annotations


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""


class ConfigError(AgentError):
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


class BundleError(AgentError):
    """A model bundle is missing, malformed or does not fit this device.

    Attributes:
        path: the bundle directory or file.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"bundle {path}: {reason}")


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
