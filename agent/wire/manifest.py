"""The model bundle manifest: ``<bundle>/manifest.json``, read by agents and the fleet server.

A wire format, so every model keeps fields it does not know (``extra="allow"``): an older
agent accepts a newer manifest that only adds fields, and writes them back unchanged.
An incompatible change raises :data:`SCHEMA_VERSION`; a manifest with a higher
``schema_version`` than this code knows is refused. Field by field: docs/bundle-manifest.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from agent.kernel.durable import write_durable
from agent.kernel.errors import BundleError
from agent.wire import untrusted
from agent.wire.base import ProfileName, WireModel, slug
from agent.wire.postprocess import (
    POSTPROCESS_KINDS,
    ClassificationPost,
    DetectionPost,
    Postprocess,
    ScorePost,
)

if TYPE_CHECKING:
    from runtime.preprocess import PreprocessSpec

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 1 << 20
"""A manifest larger than this is refused before it is parsed."""

KNOWN_FORMATS = ("onnx", "tflite")
"""Model formats this code runs, in order of preference."""

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Dtype = Literal[
    "float32", "float16", "float64", "uint8", "int8", "uint16", "int16", "int32", "int64", "bool"
]


class ModelVariant(WireModel):
    """One model file of the bundle, in one format."""

    file: str = Field(description="Path of the model file, relative to the bundle directory.")
    sha256: str = Field(description="SHA-256 of the file, 64 lowercase hex digits.")
    size: int = Field(ge=0, description="Size of the file in bytes.")
    input_name: str | None = Field(
        None, description="The input's name in this file when it differs from input.name."
    )

    @field_validator("file")
    @classmethod
    def _inside_bundle(cls, value: str) -> str:
        if not value or "\\" in value or "\x00" in value:
            raise ValueError(f"{value!r} is not a relative POSIX path")
        path = PurePosixPath(value)
        if path.is_absolute() or value.startswith("/"):
            raise ValueError(f"{value!r} is absolute; model files live inside the bundle")
        if any(part in ("..", ".") for part in value.split("/")) or "" in value.split("/"):
            raise ValueError(f"{value!r} leaves the bundle or is not normalised")
        if value == MANIFEST_NAME:
            raise ValueError(f"{value!r} is the manifest itself")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError(f"{value!r} is not 64 lowercase hex digits")
        return value

    @model_serializer(mode="wrap")
    def _drop_unset_input_name(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("input_name") is None:
            data.pop("input_name", None)
        return data


class TensorInfo(WireModel):
    """A model tensor as read from the model file."""

    name: str = Field(min_length=1, description="Tensor name in the model.")
    shape: list[int | str] = Field(
        description="Dimensions; -1 or a symbolic name (string) for a dynamic dimension."
    )
    dtype: Dtype = Field(description="Element type, as a NumPy dtype name.")

    @field_validator("shape")
    @classmethod
    def _dims(cls, value: list[int | str]) -> list[int | str]:
        for dim in value:
            if isinstance(dim, int) and dim < -1:
                raise ValueError(f"dimension {dim} is negative (only -1 means dynamic)")
        return value

    def concrete_shape(self) -> tuple[int, ...] | None:
        """The shape as integers, or ``None`` when a dimension is dynamic."""
        if any(isinstance(d, str) or d < 0 for d in self.shape):
            return None
        return tuple(int(d) for d in self.shape)


class Preprocess(WireModel):
    """How a camera frame becomes the model input (see runtime.PreprocessSpec)."""

    width: int = Field(gt=0, description="Input width in pixels.")
    height: int = Field(gt=0, description="Input height in pixels.")
    color: Literal["rgb", "bgr", "gray"] = Field("rgb", description="Channel order.")
    layout: Literal["nchw", "nhwc"] = Field("nchw", description="Tensor layout.")
    scale: float = Field(1.0 / 255.0, description="Multiplied into pixel values first.")
    mean: list[float] = Field(
        default_factory=lambda: [0.0, 0.0, 0.0],
        min_length=1,
        description="Per channel, subtracted after scaling.",
    )
    std: list[float] = Field(
        default_factory=lambda: [1.0, 1.0, 1.0],
        min_length=1,
        description="Per channel, divided by last: (x * scale - mean) / std.",
    )
    dtype: Dtype = Field("float32", description="Element type of the input tensor.")
    interpolation: Literal["linear", "nearest", "area"] = Field(
        "linear", description="Resize interpolation."
    )

    @field_validator("std")
    @classmethod
    def _nonzero(cls, value: list[float]) -> list[float]:
        if any(s == 0 for s in value):
            raise ValueError("std values must not be 0")
        return value

    @property
    def channels(self) -> int:
        return 1 if self.color == "gray" else 3

    def to_runtime(self) -> PreprocessSpec:
        """The runtime's preprocessing spec (size and dtype come from the model input)."""
        # Imported here: the fleet server reads manifests without loading OpenCV.
        from runtime.preprocess import PreprocessSpec  # noqa: PLC0415

        return PreprocessSpec(
            color=self.color,
            layout=self.layout,
            scale=self.scale,
            mean=tuple(self.mean),
            std=tuple(self.std),
            interpolation=self.interpolation,
        )


def _default_policy() -> dict[str, Any]:
    return {"rules": [], "default": "pass"}


class BundleManifest(WireModel):
    """``manifest.json``: what a model bundle holds and how the agent runs it."""

    schema_version: int = Field(SCHEMA_VERSION, ge=1, description="Manifest schema version.")
    name: str = Field(description="Bundle name (slug); a rollout targets a name.")
    version: str = Field(description="Semantic version (semver.org 2.0), for people.")
    release: int = Field(
        ge=0, description="Release number; a device refuses one lower than it has run."
    )
    models: dict[str, ModelVariant] = Field(
        min_length=1, description="Model files by format ('onnx', 'tflite'; others kept)."
    )
    input: TensorInfo = Field(description="The model's single image input.")
    outputs: list[TensorInfo] = Field(
        default_factory=list, description="The model's outputs as read at bundle init."
    )
    preprocess: Preprocess | None = Field(
        None,
        description="How a frame becomes the input; absent for a tabular or time-series "
        "model whose input is a sensor window of exactly input.shape.",
    )
    postprocess: Postprocess = Field(description="How the outputs become a result.")
    policy: dict[str, Any] = Field(
        default_factory=_default_policy, description="Policy defaults (the agent validates)."
    )
    profiles: list[ProfileName] = Field(
        default_factory=list, description="Compatible firmware profiles; empty: any."
    )
    latency_budget_ms: float = Field(
        100.0, gt=0, description="End-to-end latency budget per frame, in milliseconds."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return slug(value, "bundle name")

    @field_validator("version")
    @classmethod
    def _semver(cls, value: str) -> str:
        if not _SEMVER.match(value):
            raise ValueError(f"{value!r} is not a semantic version (e.g. 1.2.3)")
        return value

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(f"{value} is newer than this code reads ({SCHEMA_VERSION})")
        return value

    @field_validator("models")
    @classmethod
    def _formats(cls, value: dict[str, ModelVariant]) -> dict[str, ModelVariant]:
        for key in value:
            slug(key, "model format")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BundleManifest:
        problems = _inconsistencies(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _inconsistencies(m: BundleManifest) -> list[str]:
    """Cross-field problems, each starting with the dotted field it names."""
    problems: list[str] = []
    pre = m.preprocess
    if pre is None:
        return problems + _output_problems(m)
    if len(pre.mean) not in (1, pre.channels):
        problems.append(f"preprocess.mean: {len(pre.mean)} values for {pre.channels} channels")
    if len(pre.std) not in (1, pre.channels):
        problems.append(f"preprocess.std: {len(pre.std)} values for {pre.channels} channels")
    if pre.dtype != m.input.dtype:
        problems.append(f"preprocess.dtype: {pre.dtype} but input.dtype is {m.input.dtype}")
    shape = m.input.concrete_shape()
    if shape is not None:
        if len(shape) != 4 or shape[0] != 1:
            problems.append(f"input.shape: {list(shape)} is not a single image [1, ...]")
        else:
            _, c, h, w = shape if pre.layout == "nchw" else (shape[0], shape[3], *shape[1:3])
            for field, have, want in (
                ("height", pre.height, h),
                ("width", pre.width, w),
            ):
                if have != want:
                    problems.append(f"preprocess.{field}: {have} but input.shape says {want}")
            if c != pre.channels:
                problems.append(
                    f"preprocess.color: '{pre.color}' gives {pre.channels} channels; "
                    f"input.shape ({pre.layout}) has {c}"
                )
    return problems + _output_problems(m)


def _output_problems(m: BundleManifest) -> list[str]:
    names = [o.name for o in m.outputs]
    wanted = m.postprocess.output
    if names and wanted is not None and wanted not in names:
        return [f"postprocess.output: no output {wanted!r} (outputs: {', '.join(names)})"]
    return []


MAX_ERRORS_SHOWN = 10
"""A refusal lists this many field errors and counts the rest: a manifest of 3,000 bad
outputs gets a short message, not one per output."""


def _short(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (a value repeated in an error stays short)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _error_text(exc: ValidationError) -> str:
    """The first MAX_ERRORS_SHOWN errors as ``dotted.field: message`` (and how many more);
    union tags are left out of the path."""
    parts = []
    errors = exc.errors()
    for err in errors[:MAX_ERRORS_SHOWN]:
        loc = list(err["loc"])
        if (
            len(loc) > 1
            and loc[0] == "postprocess"
            and loc[1]
            in (
                "classification",
                "score",
                "detection",
            )
        ):
            del loc[1]
        field = ""
        for item in loc:
            field += f"[{item}]" if isinstance(item, int) else (f".{item}" if field else str(item))
        message = _short(str(err["msg"]).removeprefix("Value error, "))
        parts.append(f"{field}: {message}" if field else message)
    more = len(errors) - MAX_ERRORS_SHOWN
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def manifest_object(data: bytes, source: str) -> dict[str, Any]:
    """The JSON object of manifest bytes, through :func:`agent.wire.untrusted.loads`
    (size first, then depth, numbers and Unicode); ``source`` names them in errors.

    Raises:
        BundleError: over ``MAX_MANIFEST_BYTES``, not JSON, JSON this code refuses (too
            deep, a number out of range, text that is not Unicode), or not an object.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise BundleError(source, f"manifest is {len(data)} bytes (limit {MAX_MANIFEST_BYTES})")
    try:
        raw = untrusted.loads(data, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
    except untrusted.UntrustedInputError as exc:
        raise BundleError(source, f"not valid JSON: {exc.reason}") from None
    if not isinstance(raw, dict):
        raise BundleError(source, f"the manifest is a JSON {type(raw).__name__}, not an object")
    return raw


def parse_manifest(data: bytes, source: str) -> BundleManifest:
    """Parse manifest bytes; ``source`` names them in errors.

    Raises:
        BundleError: too large, not JSON (see :func:`manifest_object`), or not a valid
            manifest (naming the field).
    """
    return validate_manifest(manifest_object(data, source), source)


def validate_manifest(raw: dict[str, Any], source: str) -> BundleManifest:
    """Build a manifest from plain data; ``source`` names it in errors.

    Raises:
        BundleError: a field is missing or invalid (the message names it, dotted).
    """
    try:
        return BundleManifest.model_validate(raw)
    except ValidationError as exc:
        raise BundleError(source, _error_text(exc)) from exc


def read_manifest_bytes(bundle_dir: Path) -> bytes:
    """The raw bytes of ``<bundle_dir>/manifest.json``, at most MAX_MANIFEST_BYTES + 1
    (never more is read; :func:`manifest_object` refuses the one byte over).

    Raises:
        BundleError: the file is missing or unreadable.
    """
    path = Path(bundle_dir) / MANIFEST_NAME
    try:
        with path.open("rb") as f:
            return f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise BundleError(str(path), f"cannot read the manifest: {exc.strerror or exc}") from exc


def load_manifest(bundle_dir: Path) -> BundleManifest:
    """Read and validate ``<bundle_dir>/manifest.json``.

    Raises:
        BundleError: missing or unreadable file, bad JSON, or an invalid field (named).
    """
    data = read_manifest_bytes(bundle_dir)
    return parse_manifest(data, str(Path(bundle_dir) / MANIFEST_NAME))


def _to_json(value: Any, indent: str = "") -> str:
    """Indented JSON with lists of plain values (shapes, mean, std) kept on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [f"{inner}{_to_json(v, inner)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False)


def manifest_bytes(manifest: BundleManifest) -> bytes:
    """The manifest as written to disk: indented JSON, unknown fields kept, newline-ended."""
    return (_to_json(manifest.model_dump(mode="json")) + "\n").encode("utf-8")


def dump_manifest(manifest: BundleManifest, bundle_dir: Path) -> Path:
    """Write ``manifest`` durably as ``<bundle_dir>/manifest.json`` (mode 0644: a bundle
    is published, not secret, and the services that read it run as their own users);
    return its path.

    Raises:
        BundleError: the manifest is not valid, or the file can't be written.
    """
    path = Path(bundle_dir) / MANIFEST_NAME
    # model_copy(update=...) skips validation: write only what load_manifest accepts.
    validate_manifest(manifest.model_dump(mode="json"), str(path))
    try:
        write_durable(path, manifest_bytes(manifest), mode=0o644)
    except OSError as exc:
        raise BundleError(str(path), f"cannot write the manifest: {exc.strerror or exc}") from exc
    return path


__all__ = [
    "KNOWN_FORMATS",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "POSTPROCESS_KINDS",
    "SCHEMA_VERSION",
    "BundleManifest",
    "ClassificationPost",
    "DetectionPost",
    "ModelVariant",
    "Postprocess",
    "Preprocess",
    "ScorePost",
    "TensorInfo",
    "dump_manifest",
    "load_manifest",
    "manifest_bytes",
    "manifest_object",
    "parse_manifest",
    "read_manifest_bytes",
    "validate_manifest",
]
