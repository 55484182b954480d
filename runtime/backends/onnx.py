"""ONNX Runtime backend.

Sessions run sequentially with ``intra_op_num_threads`` from the profile and spin-wait
off; the hot path uses IOBinding onto caller-owned arrays, so ONNX Runtime reads the
input from and writes the outputs into shared memory directly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from runtime.backends.base import Array, Backend, BackendOptions, Binding, TensorSpec
from runtime.errors import ModelLoadError

log = logging.getLogger(__name__)

KEY = "onnx"

_ORT_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(bool)": np.dtype(np.bool_),
}

# Short names accepted in profiles, mapped to ONNX Runtime's provider names.
_PROVIDER_ALIASES = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}


def resolve_providers(wanted: Sequence[str], available: Sequence[str]) -> list[str]:
    """Keep the wanted providers this build has, in order; CPU is always the last resort.

    A wanted provider that is not available is skipped with a logged warning.
    """
    chosen: list[str] = []
    for name in wanted:
        full = _PROVIDER_ALIASES.get(name.lower(), name)
        if full in available:
            if full not in chosen:
                chosen.append(full)
        else:
            log.warning(
                "execution provider %s is not available on this device (have: %s); "
                "falling back down the list",
                full,
                ", ".join(available),
            )
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def _dtype(ort_type: str, path: str, name: str) -> np.dtype[Any]:
    try:
        return _ORT_TYPES[ort_type]
    except KeyError:
        raise ModelLoadError(path, f"tensor '{name}' has unsupported type {ort_type}") from None


def _shape(raw: Sequence[Any]) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in raw)


class OnnxBinding(Binding):
    def __init__(self, io: Any, keep: list[Array]) -> None:
        self.io = io
        self.keep = keep  # the arrays must stay alive while bound


class OnnxBackend(Backend):
    """A model file loaded into one ONNX Runtime session."""

    key = KEY

    def __init__(self, path: str, options: BackendOptions) -> None:
        super().__init__(path, options)
        so = ort.SessionOptions()
        so.intra_op_num_threads = options.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        spin = "1" if options.spin_wait else "0"
        so.add_session_config_entry("session.intra_op.allow_spinning", spin)
        so.add_session_config_entry("session.inter_op.allow_spinning", spin)
        wanted = options.providers or ("cpu",)
        providers = resolve_providers(wanted, ort.get_available_providers())
        try:
            self._session = ort.InferenceSession(path, sess_options=so, providers=providers)
        except Exception as exc:  # ORT raises its own exception zoo; name the file.
            raise ModelLoadError(path, _clean(str(exc))) from exc
        self._inputs = [
            TensorSpec(i.name, _shape(i.shape), _dtype(i.type, path, i.name))
            for i in self._session.get_inputs()
        ]
        self._outputs = [
            TensorSpec(o.name, _shape(o.shape), _dtype(o.type, path, o.name))
            for o in self._session.get_outputs()
        ]
        self._output_names = [o.name for o in self._outputs]

    @property
    def active_providers(self) -> list[str]:
        return list(self._session.get_providers())

    def prepare(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        fixed = []
        for spec in self._inputs:
            shape = input_shapes.get(spec.name)
            if shape is None:
                fixed.append(spec)
                continue
            fixed.append(TensorSpec(spec.name, self._checked_shape(spec, shape), spec.dtype))
        self._inputs = fixed
        # Output shapes: run once on zeros to learn them (covers dynamic outputs).
        if all(s.is_static for s in self._inputs):
            zeros = [np.zeros(s.concrete_shape(), dtype=s.dtype) for s in self._inputs]
            outs = self.run(zeros)
            self._outputs = [
                TensorSpec(spec.name, tuple(o.shape), np.dtype(o.dtype))
                for spec, o in zip(self._outputs, outs, strict=True)
            ]

    def batch_variant(self, batch: int) -> Backend:
        # An ONNX Runtime session runs any size of a dynamic batch dimension; IOBinding
        # only needs the names, so the same session serves every batch size.
        first = self._session.get_inputs()[0].shape
        if first and isinstance(first[0], int) and first[0] != batch:
            raise ModelLoadError(self.path, f"batch dimension is fixed at {first[0]}")
        return self

    def run(self, inputs: Sequence[Array]) -> list[Array]:
        feed = {spec.name: arr for spec, arr in zip(self._inputs, inputs, strict=True)}
        result: list[Array] = self._session.run(self._output_names, feed)
        return result

    def bind(self, inputs: Sequence[Array], outputs: Sequence[Array]) -> Binding:
        io = self._session.io_binding()
        for spec, arr in zip(self._inputs, inputs, strict=True):
            io.bind_ortvalue_input(spec.name, ort.OrtValue.ortvalue_from_numpy(arr))
        for spec, arr in zip(self._outputs, outputs, strict=True):
            io.bind_ortvalue_output(spec.name, ort.OrtValue.ortvalue_from_numpy(arr))
        return OnnxBinding(io, [*inputs, *outputs])

    def run_bound(self, binding: Binding) -> None:
        assert isinstance(binding, OnnxBinding)  # noqa: S101 - internal invariant
        self._session.run_with_iobinding(binding.io)

    def close(self) -> None:
        del self._session


def _clean(message: str) -> str:
    """ORT messages start with a bracketed error code; keep the part a person reads."""
    text = message.strip().replace("\n", " ")
    if text.startswith("[ONNXRuntimeError]"):
        parts = text.split(" : ", 2)
        text = parts[-1] if len(parts) == 3 else text
    return text
