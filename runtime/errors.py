"""Errors raised by the runtime.

Every error the runtime raises derives from :class:`EdgeRuntimeError` and carries the
data that explains it as attributes, so callers (the agent, the CLI) can turn it into a
message, a metric or an exit code without parsing text.
"""

from __future__ import annotations

from collections.abc import Sequence


class EdgeRuntimeError(Exception):
    """Root of every error the runtime raises."""


class ProfileError(EdgeRuntimeError):
    """A firmware profile is missing, unreadable or invalid.

    Attributes:
        path: the profile file (or profile name when no file was found).
        field: the dotted field at fault, or ``None`` when the whole file is at fault.
        reason: what was wrong.
    """

    def __init__(self, path: str, field: str | None, reason: str) -> None:
        self.path = path
        self.field = field
        self.reason = reason
        where = f"{path}: field '{field}'" if field else path
        super().__init__(f"{where}: {reason}")


class BackendUnavailable(EdgeRuntimeError):
    """A backend's package can't be imported on this device (missing, wrong NumPy ...)."""

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend '{backend}' is unavailable: {reason}")


class ModelLoadError(EdgeRuntimeError):
    """A model file is corrupt, of the wrong format, or needs operators the backend lacks."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot load model {path}: {reason}")


class InputError(EdgeRuntimeError):
    """A request's input does not fit the model."""


class InputShapeError(InputError):
    """The input's shape differs from the model's."""

    def __init__(self, model: str, expected: Sequence[int], got: Sequence[int]) -> None:
        self.model = model
        self.expected = tuple(expected)
        self.got = tuple(got)
        super().__init__(f"model '{model}': input shape expected {self.expected}, got {self.got}")


class InputDtypeError(InputError):
    """The input's dtype differs from the model's."""

    def __init__(self, model: str, expected: str, got: str) -> None:
        self.model = model
        self.expected = expected
        self.got = got
        super().__init__(f"model '{model}': input dtype expected {expected}, got {got}")


class InputTooLarge(InputError):
    """The input is larger than the slot that would hold it; refused before any copy."""

    def __init__(self, model: str, limit_bytes: int, got_bytes: int) -> None:
        self.model = model
        self.limit_bytes = limit_bytes
        self.got_bytes = got_bytes
        super().__init__(
            f"model '{model}': input of {got_bytes} bytes exceeds the slot's {limit_bytes} bytes"
        )


class Overloaded(EdgeRuntimeError):
    """The model's queue is full; the request was refused at once, not queued."""

    def __init__(self, model: str, queue_bound: int) -> None:
        self.model = model
        self.queue_bound = queue_bound
        super().__init__(f"model '{model}': queue full ({queue_bound} waiting), refused")


class DeadlineExceeded(EdgeRuntimeError):
    """The request's deadline passed before a worker could run it; it was dropped."""

    def __init__(self, model: str, late_by_ms: float) -> None:
        self.model = model
        self.late_by_ms = late_by_ms
        super().__init__(f"model '{model}': deadline passed {late_by_ms:.3f} ms ago, dropped")


class WorkerCrashed(EdgeRuntimeError):
    """The worker running the request died or stopped heart-beating."""

    def __init__(self, worker: int, detail: str) -> None:
        self.worker = worker
        self.detail = detail
        super().__init__(f"worker {worker} failed while running the request: {detail}")


class InferenceFailed(EdgeRuntimeError):
    """The backend raised while running the request."""

    def __init__(self, model: str, detail: str) -> None:
        self.model = model
        self.detail = detail
        super().__init__(f"model '{model}': inference failed: {detail}")


class PoolClosed(EdgeRuntimeError):
    """The pool is closed or has no worker left to run the request."""

    def __init__(self, detail: str = "the worker pool is closed") -> None:
        self.detail = detail
        super().__init__(detail)


class RequestTimeout(EdgeRuntimeError):
    """The caller's own wait for a result ran out (the request may still complete)."""

    def __init__(self, model: str, timeout_s: float) -> None:
        self.model = model
        self.timeout_s = timeout_s
        super().__init__(f"model '{model}': no result within {timeout_s:.3f} s")
