"""LiteRT (TFLite) backend.

The interpreter comes from ``ai-edge-litert``; devices held to NumPy 1 may install
``tflite-runtime`` instead (its 2.14 wheels fail to load under NumPy 2). When neither
imports, importing this module raises :class:`BackendUnavailable` naming both failures,
which the registry reports instead of crashing. Any exception counts as "does not
import": a NumPy ABI mismatch surfaces as ``AttributeError`` or ``SystemError``, not
``ImportError``.

The CPU path already runs through XNNPACK, which LiteRT applies by default, so
"xnnpack" and "cpu" in a profile both mean that path. Other delegates are loaded from
their shared library when this backend knows it; one that is unknown, missing, or that
refuses the model is skipped with a logged warning and the model runs on the CPU.

The hot path (:meth:`LiteRTBackend.run_bound`) allocates no tensor data: inputs are
copied into the interpreter's buffers with ``set_tensor`` (measured as fast as copying
into a ``tensor()`` view, and faster for small tensors) and outputs are copied straight
from a ``tensor()`` view into the caller's arrays. Those views are never kept across
``invoke()``: LiteRT refuses to run while one is alive, since it may reallocate under it.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from runtime.backends.base import Array, Backend, BackendOptions, Binding, TensorSpec
from runtime.errors import BackendUnavailable, ModelLoadError

log = logging.getLogger(__name__)

KEY = "litert"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# PACKAGE: which package provides the interpreter here, for reports.
try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    PACKAGE = "ai-edge-litert"
except Exception as litert_exc:  # noqa: BLE001 - see the module docstring
    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate

        PACKAGE = "tflite-runtime"
    except Exception as tflite_exc:
        raise BackendUnavailable(
            KEY,
            f"neither ai-edge-litert ({_describe(litert_exc)}) nor tflite-runtime "
            f"({_describe(tflite_exc)}) can be imported",
        ) from tflite_exc

# Provider names that mean LiteRT's default CPU path (builtin kernels + XNNPACK).
_CPU_PATH = ("xnnpack", "cpu")

# Delegates this backend can load, by profile name -> shared library.
_DELEGATE_LIBRARIES = {
    "gpu": "libtensorflowlite_gpu_delegate.so",
    "edgetpu": "libedgetpu.so.1",
}


def _load_delegates(wanted: Sequence[str]) -> tuple[list[Any], list[str]]:
    """Load the wanted delegates that can be loaded here; warn about the others.

    Returns the delegate objects and their profile names, in the order wanted.
    """
    delegates: list[Any] = []
    names: list[str] = []
    for name in wanted:
        key = name.lower()
        if key in _CPU_PATH or key in names:
            continue
        library = _DELEGATE_LIBRARIES.get(key)
        if library is None:
            log.warning(
                "LiteRT delegate %s is not supported (known: %s); running on the CPU",
                name,
                ", ".join([*_CPU_PATH, *_DELEGATE_LIBRARIES]),
            )
            continue
        try:
            # dlopen first: load_delegate's own failure also spews an ignored
            # AttributeError from Delegate.__del__ onto stderr.
            ctypes.CDLL(library)
            delegates.append(load_delegate(library))
        except Exception as exc:  # noqa: BLE001 - any failure means "not on this device"
            log.warning(
                "LiteRT delegate %s (%s) cannot be loaded: %s; running on the CPU",
                name,
                library,
                _clean(str(exc)),
            )
            continue
        names.append(key)
    return delegates, names


def _open(path: str, threads: int, delegates: list[Any]) -> Any:
    """Load and allocate an interpreter, or raise :class:`ModelLoadError` saying why."""
    try:
        interp = Interpreter(
            model_path=path,
            num_threads=threads,
            experimental_delegates=delegates or None,
        )
        interp.allocate_tensors()
    except Exception as exc:  # LiteRT raises ValueError or RuntimeError; name the file.
        raise ModelLoadError(path, _clean(str(exc)) or type(exc).__name__) from exc
    return interp


def _spec(detail: Mapping[str, Any], *, concrete: bool) -> TensorSpec:
    """A TensorSpec from a tensor's details.

    The shape is the declared one (``shape_signature``, -1 -> ``None``), or with
    ``concrete`` the one the interpreter has allocated now.
    """
    shape = [int(d) for d in detail["shape"]]
    signature = detail.get("shape_signature")
    dims = shape if concrete or signature is None or len(signature) != len(shape) else signature
    return TensorSpec(
        str(detail["name"]),
        tuple(int(d) if d >= 0 else None for d in dims),
        np.dtype(detail["dtype"]),
    )


class LiteRTBinding(Binding):
    def __init__(
        self,
        inputs: list[tuple[int, Array]],
        outputs: list[tuple[Callable[[], Array], Array]],
    ) -> None:
        self.inputs = inputs  # (tensor index, caller's input array)
        self.outputs = outputs  # (function giving a fresh view of the output, caller's array)


class LiteRTBackend(Backend):
    """A ``.tflite`` model loaded into one LiteRT interpreter.

    ``options.spin_wait`` does not apply: LiteRT's thread pool has no such setting.
    """

    key = KEY

    def __init__(self, path: str, options: BackendOptions) -> None:
        super().__init__(path, options)
        delegates, self._delegate_names = _load_delegates(options.delegates)
        try:
            self._interp = _open(path, options.threads, delegates)
        except ModelLoadError as exc:
            if not delegates:
                raise
            log.warning(
                "model %s does not load with delegates %s (%s); running it on the CPU",
                path,
                ", ".join(self._delegate_names),
                exc.reason,
            )
            self._delegate_names = []
            self._interp = _open(path, options.threads, [])
        in_details = self._interp.get_input_details()
        out_details = self._interp.get_output_details()
        self._input_index = [int(d["index"]) for d in in_details]
        self._output_index = [int(d["index"]) for d in out_details]
        self._declared = [_spec(d, concrete=False) for d in in_details]
        self._inputs = list(self._declared)
        self._outputs = [_spec(d, concrete=False) for d in out_details]
        self._fixed: set[str] = set()

    @property
    def active_providers(self) -> list[str]:
        """Loaded delegates first, then XNNPACK and the builtin kernels for the rest."""
        return [*self._delegate_names, *_CPU_PATH]

    def prepare(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        """Resize dynamic inputs to ``input_shapes`` and allocate.

        Raises:
            ModelLoadError: an input name the model lacks, a shape that contradicts the
                model's static dimensions, or an allocation the model refuses.
        """
        names = [spec.name for spec in self._declared]
        unknown = sorted(set(input_shapes) - set(names))
        if unknown:
            raise ModelLoadError(
                self.path, f"no input named {', '.join(unknown)} (inputs: {', '.join(names)})"
            )
        current = self._interp.get_input_details()
        resize: list[tuple[int, tuple[int, ...]]] = []
        for spec, detail in zip(self._declared, current, strict=True):
            wanted = input_shapes.get(spec.name)
            if wanted is None:
                continue
            shape = self._checked_shape(spec, wanted)
            if shape != tuple(int(d) for d in detail["shape"]):
                resize.append((int(detail["index"]), shape))
            self._fixed.add(spec.name)
        if resize:
            try:
                for index, shape in resize:
                    self._interp.resize_tensor_input(index, shape, strict=True)
                self._interp.allocate_tensors()
            except Exception as exc:
                raise ModelLoadError(self.path, _clean(str(exc))) from exc
        self._inputs = [
            _spec(d, concrete=s.name in self._fixed or s.is_static)
            for s, d in zip(self._declared, self._interp.get_input_details(), strict=True)
        ]
        # Output shapes: run once on zeros, which also settles data-dependent shapes.
        if all(s.is_static for s in self._inputs):
            self.run([np.zeros(s.concrete_shape(), dtype=s.dtype) for s in self._inputs])
            self._outputs = [_spec(d, concrete=True) for d in self._interp.get_output_details()]

    def run(self, inputs: Sequence[Array]) -> list[Array]:
        for index, arr in zip(self._input_index, inputs, strict=True):
            self._interp.set_tensor(index, arr)
        self._interp.invoke()
        return [self._interp.get_tensor(index) for index in self._output_index]

    def bind(self, inputs: Sequence[Array], outputs: Sequence[Array]) -> Binding:
        """Raises ValueError for an array whose shape, dtype or layout does not fit."""
        for kind, specs, arrays in (
            ("input", self._inputs, inputs),
            ("output", self._outputs, outputs),
        ):
            if len(arrays) != len(specs):
                raise ValueError(f"{self.path}: {len(specs)} {kind}s, {len(arrays)} arrays bound")
            for spec, arr in zip(specs, arrays, strict=True):
                _check_bindable(kind, spec, arr)
        return LiteRTBinding(
            list(zip(self._input_index, inputs, strict=True)),
            [
                (self._interp.tensor(i), arr)
                for i, arr in zip(self._output_index, outputs, strict=True)
            ],
        )

    def run_bound(self, binding: Binding) -> None:
        assert isinstance(binding, LiteRTBinding)  # noqa: S101 - internal invariant
        interp = self._interp
        for index, arr in binding.inputs:
            interp.set_tensor(index, arr)
        interp.invoke()
        for view_of, arr in binding.outputs:
            np.copyto(arr, view_of())  # the view dies here, before the next invoke()

    def close(self) -> None:
        del self._interp


def _check_bindable(kind: str, spec: TensorSpec, arr: Array) -> None:
    if arr.shape != spec.concrete_shape() or arr.dtype != spec.dtype:
        raise ValueError(
            f"{kind} '{spec.name}' is {spec.dtype}{list(spec.shape)}; "
            f"cannot bind {arr.dtype}{list(arr.shape)}"
        )
    if not arr.flags.c_contiguous or (kind == "output" and not arr.flags.writeable):
        raise ValueError(f"{kind} '{spec.name}': bound arrays must be C-contiguous and writable")


def _clean(message: str) -> str:
    """LiteRT glues its messages' sentences together over newlines; make one line."""
    text = " ".join(message.split())
    return re.sub(r"\.(?=[A-Z])", ". ", text)
