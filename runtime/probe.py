"""Reading a model file before any worker exists.

The pool probes every model in its own process first: a bad file fails at once, naming
the file, and the probe tells the tensor shapes the shared-memory slots are sized for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime._internal import protocol
from runtime.backends import BackendOptions, TensorSpec, detect_backend, open_model
from runtime.config import ModelConfig
from runtime.errors import ModelLoadError
from runtime.preprocess import model_hw


@dataclass(frozen=True)
class ModelInfo:
    """A served model as read from its file."""

    name: str
    path: str
    backend: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    providers: tuple[str, ...]


def probe_model(
    cfg: ModelConfig, providers: tuple[str, ...], delegates: tuple[str, ...] = ()
) -> ModelInfo:
    """Open ``cfg``'s file with one thread, fix its input shapes, and try its batch size.

    Raises:
        ModelLoadError: the file is corrupt, of the wrong format, needs unsupported
            operators, has dynamic input dimensions with no shape given, or its input
            does not fit the preprocessing.
        BackendUnavailable: the model's backend can't be imported on this device.
        ValueError: ``max_batch`` is more than the protocol carries.
    """
    key = cfg.backend or detect_backend(cfg.path)
    backend = open_model(
        cfg.path, BackendOptions(threads=1, providers=providers, delegates=delegates), key
    )
    try:
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in backend.inputs:
            given = cfg.input_shapes.get(spec.name)
            if given is not None:
                shapes[spec.name] = tuple(given)
                continue
            dims = list(spec.shape)
            if dims and dims[0] is None:
                dims[0] = 1
            if any(d is None for d in dims):
                raise ModelLoadError(
                    cfg.path,
                    f"input '{spec.name}' has dynamic dimensions {spec.shape}; "
                    "give its shape (input_shapes / --input-shape)",
                )
            shapes[spec.name] = tuple(int(d) for d in dims if d is not None)
        backend.prepare(shapes)
        if cfg.batching.max_batch > 1:
            if cfg.batching.max_batch > protocol.MAX_BATCH:
                raise ValueError(f"max_batch is at most {protocol.MAX_BATCH}")
            variant = backend.batch_variant(cfg.batching.max_batch)
            variant.run(
                [
                    np.zeros((cfg.batching.max_batch, *s.concrete_shape()[1:]), s.dtype)
                    for s in backend.inputs
                ]
            )
        if cfg.preprocess is not None:
            first = backend.inputs[0]
            try:
                model_hw(cfg.preprocess, first.concrete_shape())
            except ValueError as exc:
                raise ModelLoadError(cfg.path, f"preprocess: {exc}") from exc
        return ModelInfo(
            cfg.name,
            cfg.path,
            key,
            tuple(backend.inputs),
            tuple(backend.outputs),
            tuple(backend.active_providers),
        )
    finally:
        backend.close()
