"""Reading firmware profiles from files: a directory of ``<name>.toml`` (the bundled
``firmware_profiles`` package by default) or any path, each validated by the schema.

Every failure (missing, unreadable, not UTF-8, bad TOML, unknown key, bad value, a name
that disagrees with its file) is a :class:`ProfileError` naming the file and the dotted
field.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from pathlib import Path
from typing import Any, TypeAlias

from pydantic import BaseModel, ValidationError

from runtime.errors import ProfileError
from runtime.profiles.schema import Profile

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable

    import tomllib
else:
    from importlib.abc import Traversable

    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

ProfileDir: TypeAlias = Traversable
"""A directory of profiles: the bundled package's resources or a path."""

_PACKAGE = "firmware_profiles"
_SUFFIX = ".toml"


def list_profiles(profiles_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of the profiles in ``profiles_dir`` (default: the bundled ones), sorted.

    Raises:
        ProfileError: ``profiles_dir`` is not a directory.
    """
    directory = resolve_dir(profiles_dir)
    if not directory.is_dir():
        raise ProfileError(str(directory), None, "profiles directory does not exist")
    return names_in(directory)


def resolve_dir(profiles_dir: str | os.PathLike[str] | None) -> ProfileDir:
    """``profiles_dir``, or the bundled profiles when it is None."""
    if profiles_dir is None:
        return importlib.resources.files(_PACKAGE)
    return Path(profiles_dir)


def _is_path(name_or_path: str) -> bool:
    return "/" in name_or_path or os.sep in name_or_path or name_or_path.endswith(_SUFFIX)


def names_in(directory: ProfileDir) -> list[str]:
    """The profile names in ``directory``, sorted."""
    return sorted(
        entry.name[: -len(_SUFFIX)]
        for entry in directory.iterdir()
        if entry.name.endswith(_SUFFIX) and entry.is_file()
    )


def known(directory: ProfileDir) -> str:
    """The profile names in ``directory`` for an error message (never raises)."""
    try:
        names = names_in(directory) if directory.is_dir() else []
    except OSError:
        names = []
    return ", ".join(names) if names else f"none (no *.toml in {directory})"


def load_name_or_path(name_or_path: str, directory: ProfileDir) -> Profile:
    """The profile at a path (containing "/" or ending in .toml), or named in ``directory``.

    Raises:
        ProfileError: as :func:`runtime.profiles.load_profile`.
    """
    if _is_path(name_or_path):
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(
                name_or_path, None, f"no such profile file; known profiles: {known(directory)}"
            )
        return _load_file(path)
    return load_named(name_or_path, directory)


def load_named(name: str, directory: ProfileDir) -> Profile:
    """The profile ``<name>.toml`` in ``directory``, whose own name must be ``name``.

    Raises:
        ProfileError: as :func:`runtime.profiles.load_profile`.
    """
    entry = directory.joinpath(name + _SUFFIX)
    if not entry.is_file():
        raise ProfileError(
            name, None, f"no profile named {name!r} in {directory}; known: {known(directory)}"
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
