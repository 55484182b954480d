"""The one small interface every inference backend implements.

A backend wraps one loaded model: it reports the model's input and output tensors as
read from the model file, fixes any dynamic dimension once, and runs either into
caller-owned, preallocated arrays (:meth:`Backend.bind` then :meth:`Backend.run_bound`,
the hot path) or into fresh arrays (:meth:`Backend.run`, used for probing and for the
bare-runtime baseline in benchmarks).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from runtime.errors import ModelLoadError

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, shape (``None`` for a dynamic dimension), dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    def concrete_shape(self) -> tuple[int, ...]:
        """The shape, which must be static (after :meth:`Backend.prepare`)."""
        if not self.is_static:
            raise ValueError(f"tensor '{self.name}' has dynamic shape {self.shape}")
        return tuple(int(d) for d in self.shape if d is not None)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.concrete_shape(), dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class BackendOptions:
    """How a backend session is set up on one worker.

    Attributes:
        threads: intra-op threads for the session (the profile's threads per worker).
        providers: ONNX Runtime execution providers in order of preference; ones not
            available on this device are skipped with a logged warning. LiteRT
            ignores them.
        delegates: LiteRT delegates in order of preference ("gpu", "xnnpack",
            "edgetpu"); ONNX Runtime ignores them. Each backend gets its own list, so a
            profile's ONNX providers never reach LiteRT as unknown delegates.
        spin_wait: let idle intra-op threads spin (off unless measured to help).
    """

    threads: int = 1
    providers: tuple[str, ...] = ()
    delegates: tuple[str, ...] = ()
    spin_wait: bool = False


class Binding(abc.ABC):  # noqa: B024 - a marker type each backend subclasses
    """Backend-specific state that ties one set of preallocated arrays to a session."""


class Backend(abc.ABC):
    """One loaded model on one backend.

    Raises:
        ModelLoadError: from the constructor, when the file is corrupt, of the wrong
            format, or needs operators this backend does not support.
    """

    key: ClassVar[str]
    """Short name used in profiles, CLI options and reports ("onnx", "litert")."""

    def __init__(self, path: str, options: BackendOptions) -> None:
        self.path = path
        self.options = options

    # Subclasses fill these from the model when they load it.
    _inputs: list[TensorSpec]
    _outputs: list[TensorSpec]

    @property
    def inputs(self) -> list[TensorSpec]:
        """The model's inputs as read from the model (static after :meth:`prepare`)."""
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs; shapes are known after :meth:`prepare` and one run."""
        return self._outputs

    def _checked_shape(self, spec: TensorSpec, wanted: Sequence[int]) -> tuple[int, ...]:
        """``wanted`` as a shape for ``spec``, which it must match in rank and in every
        static dimension.

        Raises:
            ModelLoadError: naming the input, its declared shape and the wanted one.
        """
        shape = tuple(int(s) for s in wanted)
        if len(shape) != len(spec.shape) or any(
            d is not None and d != s for d, s in zip(spec.shape, shape, strict=True)
        ):
            raise ModelLoadError(
                self.path, f"input '{spec.name}' has shape {spec.shape}; cannot use {shape}"
            )
        return shape

    @property
    def active_providers(self) -> list[str]:
        """The execution providers / delegates actually in use, best first."""
        return ["cpu"]

    @abc.abstractmethod
    def prepare(self, input_shapes: Mapping[str, Sequence[int]]) -> None:
        """Fix every input's shape (resolving dynamic dimensions) before binding."""

    @abc.abstractmethod
    def run(self, inputs: Sequence[Array]) -> list[Array]:
        """Run once on ``inputs`` (in model input order); return fresh output arrays."""

    @abc.abstractmethod
    def bind(self, inputs: Sequence[Array], outputs: Sequence[Array]) -> Binding:
        """Tie preallocated input and output arrays to the session for :meth:`run_bound`.

        The arrays must be C-contiguous with the prepared shapes and dtypes; their
        memory must outlive the binding.
        """

    @abc.abstractmethod
    def run_bound(self, binding: Binding) -> None:
        """Run on the bound input arrays, writing results into the bound outputs."""

    def batch_variant(self, batch: int) -> Backend:
        """A backend that runs this model with a leading batch dimension of ``batch``.

        The default opens the model again and fixes the batch size; backends whose
        sessions accept any size of a dynamic dimension return ``self``.
        """
        other = type(self)(self.path, self.options)
        other.prepare({s.name: (batch, *s.concrete_shape()[1:]) for s in self.inputs})
        return other

    def warm_up(self, runs: int = 3) -> None:
        """Run a few times on zeros so the first real request pays no set-up cost."""
        zeros = [np.zeros(s.concrete_shape(), dtype=s.dtype) for s in self.inputs]
        for _ in range(runs):
            self.run(zeros)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the session."""
