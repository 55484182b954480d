"""edgefleet's inference runtime: backends, the pinned worker pool, scheduling, bench.

It knows nothing of cameras, MQTT, SQLite or fleets. Start here::

    from runtime import ModelConfig, PoolConfig, WorkerPool

    with WorkerPool([ModelConfig("cls", "model.onnx")], PoolConfig(workers=2)) as pool:
        scores = pool.infer("cls", tensor)[0]
"""

from runtime.config import BatchConfig, ModelConfig, PoolConfig
from runtime.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    EdgeRuntimeError,
    InferenceFailed,
    InputDtypeError,
    InputError,
    InputShapeError,
    InputTooLarge,
    ModelLoadError,
    Overloaded,
    PoolClosed,
    ProfileError,
    RequestTimeout,
    WorkerCrashed,
)
from runtime.pool import WorkerPool
from runtime.preprocess import PreprocessSpec
from runtime.probe import ModelInfo
from runtime.request import Request, Reservation
from runtime.scheduler import Priority

__all__ = [
    "BackendUnavailable",
    "BatchConfig",
    "DeadlineExceeded",
    "EdgeRuntimeError",
    "InferenceFailed",
    "InputDtypeError",
    "InputError",
    "InputShapeError",
    "InputTooLarge",
    "ModelConfig",
    "ModelInfo",
    "ModelLoadError",
    "Overloaded",
    "PoolClosed",
    "PoolConfig",
    "PreprocessSpec",
    "Priority",
    "ProfileError",
    "Request",
    "RequestTimeout",
    "Reservation",
    "WorkerCrashed",
    "WorkerPool",
]
