"""Model bundles on disk: load one for the runtime, digest it, create one from a model.

A bundle is a directory holding ``manifest.json`` (schema: :mod:`agent.wire.manifest`)
and the model file(s) it lists. Loading checks every listed file against its size and
SHA-256 before anything runs it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.kernel.durable import copy_durable, fsync_dir, hash_file
from agent.kernel.errors import BundleError
from agent.wire.manifest import (
    KNOWN_FORMATS,
    MANIFEST_NAME,
    POSTPROCESS_KINDS,
    BundleManifest,
    ModelVariant,
    dump_manifest,
    parse_manifest,
    read_manifest_bytes,
    validate_manifest,
)
from runtime.backends import BackendOptions, TensorSpec, available_backends, open_model
from runtime.backends.base import Backend
from runtime.config import ModelConfig
from runtime.errors import EdgeRuntimeError

_DIGEST_DOMAIN = b"edgefleet-bundle-digest-v1\x00"

# Manifest format -> runtime backend key, and back.
FORMAT_BACKEND = {"onnx": "onnx", "tflite": "litert"}
_BACKEND_FORMAT = {v: k for k, v in FORMAT_BACKEND.items()}


def _verified(root: Path, key: str, variant: ModelVariant) -> tuple[Path, str]:
    """The variant's file, checked to lie inside ``root`` and to match size and sha256.

    Raises:
        BundleError: missing, outside the bundle, or its size or sha256 differ.
    """
    path = root / variant.file
    try:
        real = path.resolve(strict=True)
    except OSError:
        raise BundleError(str(path), f"models.{key}.file: no such file in the bundle") from None
    if not real.is_relative_to(root.resolve()):
        raise BundleError(str(path), f"models.{key}.file: resolves outside the bundle ({real})")
    if not real.is_file():
        raise BundleError(str(path), f"models.{key}.file: not a regular file")
    try:
        digest, size = hash_file(real)
    except OSError as exc:
        raise BundleError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    if size != variant.size:
        raise BundleError(str(path), f"size is {size} bytes; models.{key}.size says {variant.size}")
    if digest != variant.sha256:
        raise BundleError(
            str(path), f"sha256 is {digest}; models.{key}.sha256 says {variant.sha256}"
        )
    return path, digest


@dataclass(frozen=True)
class Bundle:
    """A loaded, verified bundle.

    Attributes:
        path: the bundle directory.
        manifest: its manifest.
        digest: sha256 over the manifest bytes and every model file; independent of
            where the bundle lies and of file times.
    """

    path: Path
    manifest: BundleManifest
    digest: str

    def _format(self, backend: str | None) -> str:
        models = self.manifest.models
        if backend is not None:
            fmt = _BACKEND_FORMAT.get(backend, backend)
            if fmt not in FORMAT_BACKEND:
                raise BundleError(str(self.path), f"unknown backend or format {backend!r}")
            if fmt not in models:
                raise BundleError(
                    str(self.path), f"models: no {fmt!r} variant (have: {', '.join(models)})"
                )
            return fmt
        usable = {info.key for info in available_backends() if info.available}
        for fmt in KNOWN_FORMATS:
            if fmt in models and FORMAT_BACKEND[fmt] in usable:
                return fmt
        raise BundleError(
            str(self.path),
            f"models: no variant this device can run (bundle has: {', '.join(models)}; "
            f"backends available here: {', '.join(sorted(usable)) or 'none'})",
        )

    def model_file(self, backend: str | None = None) -> Path:
        """The model file for ``backend`` ("onnx", "tflite" or "litert"), or for the first
        format this device can run ("onnx" first, then "tflite"), checked again against the
        manifest's size and sha256.

        Raises:
            BundleError: no such variant, none runnable here, or the file does not match.
        """
        fmt = self._format(backend)
        path, _ = _verified(self.path, fmt, self.manifest.models[fmt])
        return path

    def model_config(
        self, name: str | None = None, *, backend: str | None = None, **overrides: Any
    ) -> ModelConfig:
        """A runtime model config: the verified file, its input shape, preprocessing.

        ``overrides`` replace any other :class:`runtime.ModelConfig` field.

        Raises:
            BundleError: as :meth:`model_file`.
        """
        fmt = self._format(backend)
        path = self.model_file(fmt)
        m = self.manifest
        shape = m.input.concrete_shape()
        input_name = m.models[fmt].input_name or m.input.name
        values: dict[str, Any] = {
            "name": name or m.name,
            "path": str(path),
            "backend": FORMAT_BACKEND[fmt],
            "input_shapes": {input_name: shape} if shape is not None else {},
            "preprocess": m.preprocess.to_runtime() if m.preprocess is not None else None,
        }
        values.update(overrides)
        return ModelConfig(**values)

    def check_profile(self, profile_name: str) -> None:
        """Raises BundleError when the manifest lists profiles and not this one."""
        profiles = self.manifest.profiles
        if profiles and profile_name not in profiles:
            raise BundleError(
                str(self.path),
                f"profiles: not for firmware profile {profile_name!r} "
                f"(compatible: {', '.join(profiles)})",
            )


def load_bundle(path: Path) -> Bundle:
    """Load the bundle in directory ``path`` and verify every model file it lists.

    Raises:
        BundleError: no manifest, an invalid one, or a model file missing or altered.
    """
    root = Path(path)
    if not root.is_dir():
        raise BundleError(str(root), "not a directory")
    raw = read_manifest_bytes(root)
    manifest = parse_manifest(raw, str(root / MANIFEST_NAME))
    h = hashlib.sha256(_DIGEST_DOMAIN)
    h.update(len(raw).to_bytes(8, "big") + raw)
    for key, variant in sorted(manifest.models.items(), key=lambda kv: kv[1].file):
        _, digest = _verified(root, key, variant)
        h.update(variant.file.encode() + b"\x00" + bytes.fromhex(digest))
    return Bundle(root, manifest, h.hexdigest())


# -- bundle init ----------------------------------------------------------------


def _slugify(text: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return slug[:64].rstrip("-._") or "model"


def _fmt_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _image_layout(source: str, spec: TensorSpec) -> str:
    """Guess "nchw" or "nhwc" for a single image input from where its channels are.

    Raises:
        BundleError: not rank 4 with batch 1 and 1 or 3 channels, naming the shape.
    """
    shape = spec.shape
    if len(shape) == 4 and shape[0] in (None, 1):
        if shape[1] in (1, 3):
            return "nchw"
        if shape[3] in (1, 3):
            return "nhwc"
    raise BundleError(
        source,
        f"input '{spec.name}' has shape {_fmt_shape(shape)}; an image model needs one "
        "[1, C, H, W] or [1, H, W, C] input with C = 1 or 3",
    )


def _fixed_shape(
    source: str, spec: TensorSpec, layout: str, given: tuple[int, ...] | None
) -> tuple[int, ...]:
    if given is not None:
        if len(given) != 4 or given[0] != 1:
            raise BundleError(source, f"--input-shape {list(given)} is not [1, ...] of rank 4")
        return given
    dims = list(spec.shape)
    if dims[0] is None:
        dims[0] = 1
    if any(d is None for d in dims):
        example = "1x3x640x640" if layout == "nchw" else "1x640x640x3"
        raise BundleError(
            source,
            f"input '{spec.name}' has dynamic shape {_fmt_shape(spec.shape)}; "
            f"give a concrete one (--input-shape, e.g. {example})",
        )
    return tuple(int(d) for d in dims if d is not None)


def _postprocess(source: str, kind: str | None, outputs: list[TensorSpec]) -> dict[str, Any]:
    """A postprocess section to start from, guessed from the first output's shape."""
    first = outputs[0]
    shape = first.concrete_shape()
    size = _prod(shape)
    if kind is None:
        if len(shape) == 2 and shape[0] == 1 and shape[1] >= 2:
            kind = "classification"
        elif len(shape) == 4 and shape[:2] == (1, 1) and min(shape[2:]) >= 8:
            kind = "detection"
        else:
            kind = "score"
    if kind == "classification":
        return {"kind": kind, "output": first.name, "top_k": min(5, size), "softmax": False}
    if kind == "score":
        return {"kind": kind, "output": first.name, "index": 0}
    if kind != "detection":
        raise BundleError(
            source, f"postprocess {kind!r} is not one of {', '.join(POSTPROCESS_KINDS)}"
        )
    if len(shape) in (2, 3) and shape[-1] in (5, 6) and shape[0] >= 1:
        return {"kind": kind, "format": "boxes", "output": first.name, "threshold": 0.5}
    if (len(shape) == 4 and shape[:2] == (1, 1)) or (len(shape) == 3 and shape[0] == 1):
        return {"kind": kind, "format": "heatmap", "output": first.name, "threshold": 0.5}
    raise BundleError(
        source,
        f"output '{first.name}' has shape {list(shape)}: neither box rows [N, 5|6] nor a "
        "probability map [1, 1, H, W]; pick another postprocess",
    )


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _tensor_info(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.concrete_shape()), "dtype": spec.dtype.name}


def _read_model(
    model: Path, input_shape: tuple[int, ...] | None
) -> tuple[str, TensorSpec, str, list[TensorSpec]]:
    """Open the model and fix its input: (format, input, layout, outputs)."""
    source = str(model)
    if not model.is_file():
        raise BundleError(source, "no such model file")
    backend: Backend | None = None
    try:
        backend = open_model(source, BackendOptions())
        if len(backend.inputs) != 1:
            described = ", ".join(f"'{s.name}' {_fmt_shape(s.shape)}" for s in backend.inputs)
            raise BundleError(
                source,
                f"the model has {len(backend.inputs)} inputs ({described}); "
                "a bundle needs a single-input image model",
            )
        declared = backend.inputs[0]
        layout = _image_layout(source, declared)
        shape = _fixed_shape(source, declared, layout, input_shape)
        backend.prepare({declared.name: shape})
        spec = backend.inputs[0]
        _image_layout(source, spec)
        return _BACKEND_FORMAT[backend.key], spec, layout, list(backend.outputs)
    except EdgeRuntimeError as exc:
        raise BundleError(source, str(exc)) from exc
    finally:
        if backend is not None:
            backend.close()


def init_bundle(
    model: Path,
    out: Path,
    *,
    name: str | None = None,
    version: str = "0.1.0",
    input_shape: tuple[int, ...] | None = None,
    postprocess: str | None = None,
) -> Bundle:
    """Write a new bundle for a single-input image model (ONNX or TFLite) into ``out``.

    The input's name, shape and dtype come from the model; preprocessing, post-processing
    ("classification" for a [1, N] output, "detection" for a [1, 1, H, W] map, else
    "score", unless ``postprocess`` names one), policy and budget are defaults to edit.

    Raises:
        BundleError: missing or unloadable model, not one image input, a dynamic shape
            with no ``input_shape``, an invalid name or version, ``out`` not empty, or a
            write failure.
    """
    model, out = Path(model), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(str(out), "exists and is not an empty directory")
    fmt, spec, layout, outputs = _read_model(model, input_shape)
    shape = spec.concrete_shape()
    _, c, h, w = shape if layout == "nchw" else (shape[0], shape[3], shape[1], shape[2])
    dtype = spec.dtype.name
    if spec.dtype.kind not in "fiu":
        raise BundleError(str(model), f"input '{spec.name}' is {dtype}, not an image type")
    is_float = spec.dtype.kind == "f"
    sha, size = hash_file(model)
    raw: dict[str, Any] = {
        "schema_version": 1,
        "name": name if name is not None else _slugify(model.stem),
        "version": version,
        "release": 1,
        "models": {fmt: {"file": model.name, "sha256": sha, "size": size}},
        "input": {"name": spec.name, "shape": list(shape), "dtype": dtype},
        "outputs": [_tensor_info(o) for o in outputs],
        "preprocess": {
            "width": w,
            "height": h,
            "color": "rgb" if c == 3 else "gray",
            "layout": layout,
            "scale": 1.0 / 255.0 if is_float else 1.0,
            "mean": [128.0 if dtype == "int8" else 0.0] * c,
            "std": [1.0] * c,
            "dtype": dtype,
            "interpolation": "linear",
        },
        "postprocess": _postprocess(str(model), postprocess, outputs),
        "policy": {"rules": [], "default": "pass"},
        "profiles": [],
        "latency_budget_ms": 100.0,
    }
    manifest = validate_manifest(raw, str(out / MANIFEST_NAME))
    try:
        out.mkdir(parents=True, exist_ok=True)
        fsync_dir(out.parent)
        copied_sha, _ = copy_durable(model, out / model.name, mode=0o644)  # published, not secret
    except OSError as exc:
        raise BundleError(str(out), f"cannot write the bundle: {exc.strerror or exc}") from exc
    if copied_sha != sha:
        raise BundleError(str(model), "the model changed while it was being copied")
    dump_manifest(manifest, out)
    return load_bundle(out)
