"""Firmware profiles: one TOML file per device class, validated by a typed schema.

A profile says how the runtime uses one class of device: which cores its workers are
pinned to, how many workers, which execution providers and TFLite delegates to try, and
its budgets. The bundled profiles live in the ``firmware_profiles`` package; a field
engineer may point at any other file.

Example::

    profile = load_profile("auto")          # or "jetson-orin", or "/etc/edgefleet/p.toml"
    cores = profile.resolve_cores()          # e.g. [2, 3, 4, 5] on an Orin Nano
    workers = profile.resolve_workers()

``"auto"`` reads ``/proc/device-tree/model`` and ``platform.machine()``: a profile whose
``match.device_tree_model`` substring occurs in the model wins (the longest substring if
several do); otherwise the profile whose ``match.machine`` lists this machine is taken.
``EDGEFLEET_PROFILE`` (a name or a path) overrides auto detection.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import platform
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from runtime.errors import ProfileError

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable

    import tomllib
else:
    from importlib.abc import Traversable

    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "ENV_VAR",
    "MatchRule",
    "Profile",
    "list_profiles",
    "load_profile",
]

log = logging.getLogger(__name__)

ENV_VAR = "EDGEFLEET_PROFILE"
"""Environment variable naming the profile (a name or a path); it overrides ``"auto"``."""

_PACKAGE = "firmware_profiles"
_SUFFIX = ".toml"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# platform.machine() spells some architectures differently per OS.
_MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
# Used only when no profile's [match] table matches this device at all.
_FALLBACK_BY_MACHINE = {"x86_64": "x86-gateway", "aarch64": "arm64-gateway"}

TfliteDelegate = Literal["gpu", "xnnpack", "edgetpu"]


def _normalize_machine(machine: str) -> str:
    lowered = machine.strip().lower()
    return _MACHINE_ALIASES.get(lowered, lowered)


def _unique(values: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        key = value.casefold()
        if key in seen:
            raise ValueError(f"{what} {value!r} is listed twice")
        seen.add(key)


class MatchRule(BaseModel):
    """How ``load_profile("auto")`` recognises the device class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_tree_model: tuple[StrictStr, ...] = Field(
        default=(),
        description=(
            "Substrings of /proc/device-tree/model (case-insensitive), e.g. "
            '"Jetson AGX Orin". A match here beats any machine match; if several '
            "profiles match, the longest substring wins."
        ),
    )
    machine: tuple[StrictStr, ...] = Field(
        default=(),
        description=(
            'platform.machine() values ("aarch64", "x86_64"; "arm64" and "amd64" are '
            "read as those) for which this profile is the fallback when no profile's "
            "device_tree_model matches."
        ),
    )

    @field_validator("device_tree_model", "machine")
    @classmethod
    def _check_entries(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        for entry in value:
            if not entry.strip():
                raise ValueError("entries must not be empty")
        _unique(value, "entry")
        if info.field_name == "machine":
            return tuple(_normalize_machine(entry) for entry in value)
        return value


class Profile(BaseModel):
    """One device class: core pinning, workers, execution providers and budgets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(
        description=(
            "Profile name: lowercase letters, digits, '.', '_' and '-'. A bundled "
            "profile's name equals its file name without .toml."
        ),
    )
    description: StrictStr = Field(
        description="What device class this is for and why its values are what they are.",
    )
    match: MatchRule = Field(
        default_factory=MatchRule,
        description="How auto detection recognises this device class (empty: never auto).",
    )
    cores: Literal["all"] | tuple[int, ...] = Field(
        description=(
            'CPU ids to pin workers to, or "all" for every core this process may use '
            "(os.sched_getaffinity). Ids this device lacks are dropped at start with a "
            "warning."
        ),
    )
    workers: Literal["auto"] | int = Field(
        description=(
            'Number of worker processes (>= 1), or "auto" for one per resolved core. '
            "Never more workers than resolved cores."
        ),
    )
    threads_per_worker: StrictInt = Field(
        default=1,
        ge=1,
        description="Intra-op threads of each worker's inference session.",
    )
    execution_providers: tuple[StrictStr, ...] = Field(
        min_length=1,
        description=(
            "ONNX Runtime execution providers, best first: full names "
            '("CUDAExecutionProvider") or short aliases ("cuda"). Ones this build '
            "lacks are skipped at load time; CPU is always the last resort."
        ),
    )
    tflite_delegates: tuple[TfliteDelegate, ...] = Field(
        default=("xnnpack",),
        description=(
            "LiteRT/TFLite delegates, best first (gpu, xnnpack, edgetpu); empty runs "
            "the built-in reference kernels."
        ),
    )
    memory_budget_mb: StrictInt = Field(
        gt=0,
        description="Memory the runtime may use for models, sessions and slots, in MiB.",
    )
    spin_wait: StrictBool = Field(
        default=False,
        description=(
            "Let idle intra-op threads spin instead of sleeping: lower latency, a busy "
            "core. Off unless measured to help on this device."
        ),
    )
    queue_bound: StrictInt = Field(
        default=8,
        ge=1,
        description=(
            "Default bound on requests waiting per model; a request beyond it is "
            "refused at once (Overloaded), never queued."
        ),
    )
    heartbeat_timeout_s: StrictFloat = Field(
        default=1.0,
        gt=0,
        description=(
            "A worker silent this long is stuck: the watchdog kills and replaces it. "
            "The worker beats every min(0.2 s, timeout/4) while idle and before each "
            "request, so this must exceed the slowest single inference."
        ),
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a profile name (lowercase letters, digits, '.', '_', '-')"
            )
        return value

    @field_validator("description")
    @classmethod
    def _check_description(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    # The "before" validators below see the raw TOML value and raise ValueError (the
    # only error pydantic reports as a validation error, hence the TRY004 waivers), so a
    # bad value gives one message naming the field instead of one per union member.

    @field_validator("cores", mode="before")
    @classmethod
    def _check_cores(cls, value: object) -> object:
        if value == "all":
            return value
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ValueError(f'must be a list of CPU ids or "all", got {value!r}')  # noqa: TRY004
        if not value:
            raise ValueError('must list at least one CPU id (or be "all")')
        seen: set[int] = set()
        for index, core in enumerate(value):
            if isinstance(core, bool) or not isinstance(core, int):
                raise ValueError(f"cores[{index}] must be an integer CPU id, got {core!r}")  # noqa: TRY004
            if core < 0:
                raise ValueError(f"cores[{index}] must be >= 0, got {core}")
            if core in seen:
                raise ValueError(f"CPU id {core} is listed twice")
            seen.add(core)
        return tuple(value)

    @field_validator("workers", mode="before")
    @classmethod
    def _check_workers_value(cls, value: object) -> object:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f'must be an integer >= 1 or "auto", got {value!r}')  # noqa: TRY004
        if value < 1:
            raise ValueError(f'must be >= 1 (or "auto"), got {value}')
        return value

    @field_validator("workers")
    @classmethod
    def _check_workers_fit_cores(
        cls, value: Literal["auto"] | int, info: ValidationInfo
    ) -> Literal["auto"] | int:
        cores = info.data.get("cores")
        if isinstance(value, int) and isinstance(cores, tuple) and value > len(cores):
            raise ValueError(
                f"{value} workers but only {len(cores)} cores listed; each worker is "
                "pinned to a core of its own"
            )
        return value

    @field_validator("execution_providers")
    @classmethod
    def _check_providers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, provider in enumerate(value):
            if not provider.strip() or provider != provider.strip():
                raise ValueError(f"execution_providers[{index}] {provider!r} is not a name")
        _unique(value, "execution provider")
        return value

    @field_validator("tflite_delegates")
    @classmethod
    def _check_delegates(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _unique(value, "delegate")
        return value

    def resolve_cores(self, available: set[int] | None = None) -> list[int]:
        """The cores workers are pinned to on this device.

        Args:
            available: the cores this process may use; by default
                ``os.sched_getaffinity(0)``.

        ``"all"`` gives every available core, sorted. An explicit list keeps its order
        and drops the cores that are not available, with a warning; if none is left
        (a 12-core profile on a 2-core test machine) every available core is used,
        with a warning.

        Raises:
            ValueError: ``available`` is empty.
        """
        return self._resolve_cores(available, warn=True)

    def resolve_workers(self, available: set[int] | None = None) -> int:
        """The number of workers on this device: one per resolved core for ``"auto"``,
        otherwise ``workers`` capped (with a warning) at the number of resolved cores.

        Raises:
            ValueError: ``available`` is empty.
        """
        cores = self._resolve_cores(available, warn=False)
        if self.workers == "auto":
            return len(cores)
        if self.workers > len(cores):
            log.warning(
                "profile %s: %d workers wanted but only %d cores resolved (%s); running %d workers",
                self.name,
                self.workers,
                len(cores),
                _format_cores(cores),
                len(cores),
            )
            return len(cores)
        return self.workers

    def _resolve_cores(self, available: set[int] | None, *, warn: bool) -> list[int]:
        have = _available_cores() if available is None else set(available)
        if not have:
            raise ValueError("no CPU cores are available to this process")
        if self.cores == "all":
            return sorted(have)
        kept = [core for core in self.cores if core in have]
        missing = [core for core in self.cores if core not in have]
        if not kept:
            if warn:
                log.warning(
                    "profile %s: none of its cores (%s) is available here (have %s); "
                    "using all available cores",
                    self.name,
                    _format_cores(self.cores),
                    _format_cores(sorted(have)),
                )
            return sorted(have)
        if missing and warn:
            log.warning(
                "profile %s: cores %s are not available here (have %s); using %s",
                self.name,
                _format_cores(missing),
                _format_cores(sorted(have)),
                _format_cores(kept),
            )
        return kept


def _available_cores() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))  # pragma: no cover - not Linux


def _format_cores(cores: Iterable[int]) -> str:
    return ",".join(str(core) for core in cores) or "none"


# --- loading -------------------------------------------------------------------------


def list_profiles(profiles_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the profiles in ``profiles_dir`` (default: the bundled ones), sorted.

    Raises:
        ProfileError: ``profiles_dir`` is not a directory.
    """
    directory = _profiles_dir(profiles_dir)
    if not directory.is_dir():
        raise ProfileError(str(directory), None, "profiles directory does not exist")
    return _names_in(directory)


def load_profile(
    name_or_path: str = "auto",
    *,
    profiles_dir: str | os.PathLike[str] | None = None,
    device_tree_model_path: str = "/proc/device-tree/model",
    machine: str | None = None,
) -> Profile:
    """Load and validate a profile.

    Args:
        name_or_path: ``"auto"`` (detect this device; ``$EDGEFLEET_PROFILE`` overrides),
            a profile name looked up as ``<name>.toml`` in ``profiles_dir``, or a path
            (containing "/" or ending in ".toml").
        profiles_dir: where names are looked up; by default the bundled
            ``firmware_profiles`` package.
        device_tree_model_path: the device-tree model file read by auto detection; a
            missing file (x86) is ignored.
        machine: the machine auto detection assumes; by default ``platform.machine()``.

    Raises:
        ProfileError: the file is missing, unreadable, not valid TOML, has an unknown
            key or a bad value, the name is unknown, or auto detection finds no profile.
    """
    directory = _profiles_dir(profiles_dir)
    if name_or_path == "auto":
        override = os.environ.get(ENV_VAR, "").strip()
        if override and override != "auto":
            log.info("firmware profile %s chosen by $%s", override, ENV_VAR)
            return _load_name_or_path(override, directory)
        return _detect(directory, device_tree_model_path, machine)
    return _load_name_or_path(name_or_path, directory)


def _profiles_dir(profiles_dir: str | os.PathLike[str] | None) -> Traversable:
    if profiles_dir is None:
        return importlib.resources.files(_PACKAGE)
    return Path(profiles_dir)


def _is_path(name_or_path: str) -> bool:
    return "/" in name_or_path or os.sep in name_or_path or name_or_path.endswith(_SUFFIX)


def _names_in(directory: Traversable) -> list[str]:
    return sorted(
        entry.name[: -len(_SUFFIX)]
        for entry in directory.iterdir()
        if entry.name.endswith(_SUFFIX) and entry.is_file()
    )


def _known(directory: Traversable) -> str:
    try:
        names = _names_in(directory) if directory.is_dir() else []
    except OSError:
        names = []
    return ", ".join(names) if names else f"none (no *.toml in {directory})"


def _load_name_or_path(name_or_path: str, directory: Traversable) -> Profile:
    if _is_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(
                name_or_path, None, f"no such profile file; known profiles: {_known(directory)}"
            )
        return _load_file(path)
    return _load_named(name_or_path, directory)


def _load_named(name: str, directory: Traversable) -> Profile:
    entry = directory.joinpath(name + _SUFFIX)
    if not entry.is_file():
        raise ProfileError(
            name, None, f"no profile named {name!r} in {directory}; known: {_known(directory)}"
        )
    profile = _load_file(entry)
    if profile.name != name:
        raise ProfileError(
            str(entry), "name", f"is {profile.name!r} but the file is named {name}{_SUFFIX}"
        )
    return profile


def _load_file(entry: Traversable) -> Profile:
    where = str(entry)
    try:
        raw = entry.read_bytes()
    except OSError as exc:
        raise ProfileError(where, None, f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProfileError(where, None, f"not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(where, None, f"invalid TOML: {exc}") from exc
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise _profile_error(where, exc) from exc


def _profile_error(where: str, exc: ValidationError) -> ProfileError:
    """The first validation error as a ProfileError naming the dotted field."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = _dotted(first["loc"])
    if first["type"] == "extra_forbidden":
        parent = _model_at(first["loc"][:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        reason = f"unknown key (allowed here: {allowed})"
    else:
        reason = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] not in ("value_error", "missing") and "input" in first:
            reason += f" (got {_short(first['input'])})"
    if len(errors) > 1:
        more = len(errors) - 1
        reason += f"; and {more} more error{'s' if more > 1 else ''}"
    return ProfileError(where, field or None, reason)


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = Profile
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- auto detection ------------------------------------------------------------------


def _read_device_tree_model(path: str) -> str:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        log.debug("no device-tree model at %s (not a device-tree platform)", path)
        return ""
    except OSError as exc:
        log.warning("cannot read device-tree model %s: %s; ignoring it", path, exc)
        return ""
    # The kernel exposes the property with its trailing NUL.
    return raw.decode("utf-8", errors="replace").strip("\x00").strip()


def _detect(directory: Traversable, device_tree_model_path: str, machine: str | None) -> Profile:
    model = _read_device_tree_model(device_tree_model_path)
    arch = _normalize_machine(machine if machine is not None else platform.machine())
    if not directory.is_dir():
        raise ProfileError(str(directory), None, "profiles directory does not exist")
    profiles = [_load_named(name, directory) for name in _names_in(directory)]

    folded = model.casefold()
    by_tree: list[tuple[int, str, Profile]] = []
    for profile in profiles:
        hits = [s for s in profile.match.device_tree_model if folded and s.casefold() in folded]
        if hits:
            best = max(hits, key=len)
            by_tree.append((len(best), best, profile))
    if by_tree:
        by_tree.sort(key=lambda hit: (-hit[0], hit[2].name))
        _, substring, chosen = by_tree[0]
        if len(by_tree) > 1 and by_tree[1][0] == by_tree[0][0]:
            log.warning(
                "device-tree model %r matches profiles %s equally; taking %s",
                model,
                ", ".join(hit[2].name for hit in by_tree if hit[0] == by_tree[0][0]),
                chosen.name,
            )
        log.info(
            "firmware profile %s chosen: device-tree model %r contains %r",
            chosen.name,
            model,
            substring,
        )
        return chosen

    by_machine = [profile for profile in profiles if arch in profile.match.machine]
    if by_machine:
        chosen = by_machine[0]
        if len(by_machine) > 1:
            log.warning(
                "machine %s matches profiles %s; taking %s",
                arch,
                ", ".join(profile.name for profile in by_machine),
                chosen.name,
            )
        log.info(
            "firmware profile %s chosen: machine %s (device-tree model %r matched no profile)",
            chosen.name,
            arch,
            model or "absent",
        )
        return chosen

    fallback = _FALLBACK_BY_MACHINE.get(arch)
    for profile in profiles:
        if profile.name == fallback:
            log.info(
                "firmware profile %s chosen: default for machine %s (no profile's [match] "
                "fits device-tree model %r)",
                profile.name,
                arch,
                model or "absent",
            )
            return profile
    raise ProfileError(
        str(directory),
        None,
        f"no profile matches this device (device-tree model {model or 'absent'!r}, "
        f"machine {arch!r}); known: {_known(directory)}; name one or set ${ENV_VAR}",
    )
