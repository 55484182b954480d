"""Secrets by name: a file in ``$CREDENTIALS_DIRECTORY`` (systemd credentials) first,
then the environment. Configuration files name a secret; they never hold it.

A secret given in the environment is moved out of it as ``edge-agent run`` starts
(:func:`hold_from_environment`) and handed to its two processes through a pipe
(:func:`handoff`, :func:`receive_handoff`), never through their environment: no process
the agent starts (hot path, companion, runtime workers, decoder children) shows a secret
in ``/proc/<pid>/environ`` or ``cmdline``.

The packaged units load a whole directory of secret files with
``LoadCredential=edgefleet:/etc/edgefleet/credentials/<part>``; systemd (252) names each
credential ``edgefleet_<FILE NAME>``, so a secret ``NAME`` is read from
``$CREDENTIALS_DIRECTORY/NAME`` or, failing that, ``$CREDENTIALS_DIRECTORY/edgefleet_NAME``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

PIPE_CAPACITY = 65536
"""The most bytes of secrets handed to a child through a pipe (Linux's default pipe
buffer: the parent writes them all before the child runs)."""
CREDENTIAL_DIR_ID = "edgefleet"
"""The ID the units give their credentials directory (``LoadCredential=ID:DIR``)."""


def credential_file(directory: str | Path | None, name: str) -> Path | None:
    """The file of credential ``name`` in ``directory`` (``$CREDENTIALS_DIRECTORY``):
    ``NAME``, else ``edgefleet_NAME``; None when neither is a file or no directory."""
    if not directory:
        return None
    for file_name in (name, f"{CREDENTIAL_DIR_ID}_{name}"):
        path = Path(directory) / file_name
        if path.is_file():
            return path
    return None


def read_secret(name: str) -> str | None:
    """The secret called ``name``, or None when no place has it (or it is empty): the
    credentials directory, then what this process holds (moved out of its environment or
    handed by its parent), then the environment."""
    path = credential_file(os.environ.get("CREDENTIALS_DIRECTORY"), name)
    if path is not None:
        return path.read_text(encoding="utf-8").strip() or None
    return _held.get(name) or os.environ.get(name) or None


HANDOFF_ENV = "EDGEFLEET_SECRETS_FD"
"""Names the pipe a child of ``edge-agent run`` reads the secrets held for it from."""
NAMES_SECRET_SUFFIX = "_env"  # noqa: S105 - a field-name suffix, not a secret
"""Configuration fields that name a secret end in this (``password_env``, ``token_env``)."""

_held: dict[str, str] = {}
"""Secrets this process took out of its environment (:func:`hold_from_environment`) or
was handed by its parent (:func:`receive_handoff`), by name."""


def secret_names(config: object) -> set[str]:
    """The secrets a configuration names: the values of its fields ending in ``_env``,
    at any depth (models, lists, dicts)."""
    names: set[str] = set()
    seen: set[int] = set()

    def walk(value: object) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        fields = getattr(type(value), "model_fields", None)
        if isinstance(fields, dict):
            for name in fields:
                item = getattr(value, name, None)
                if name.endswith(NAMES_SECRET_SUFFIX) and isinstance(item, str) and item:
                    names.add(item)
                else:
                    walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(config)
    return names


def hold_from_environment(names: Iterable[str]) -> list[str]:
    """Move the secrets ``names`` out of this process's environment into memory, where
    :func:`read_secret` still finds them: a process this one starts after this (a
    runtime worker, a decoder child, ``ffmpeg``) inherits no secret in its environment,
    where ``/proc/<pid>/environ`` would show it. Returns the names moved."""
    moved = []
    for name in sorted(set(names)):
        value = os.environ.pop(name, None)
        if value:
            _held[name] = value
            moved.append(name)
    return moved


def handoff(pass_fds: list[int]) -> dict[str, str]:
    """The environment entry that hands the held secrets to a child: a pipe with them
    written into it, its read end appended to ``pass_fds`` (close it in the parent once
    the child started: :func:`close_handoff`). Empty when nothing is held."""
    if not _held:
        return {}
    payload = json.dumps(_held).encode()
    if len(payload) > PIPE_CAPACITY:
        raise ValueError(f"secrets of {len(payload)} bytes: more than a pipe holds")
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, payload)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    pass_fds.append(read_fd)
    return {HANDOFF_ENV: str(read_fd)}


def close_handoff(pass_fds: list[int]) -> None:
    """Close this process's copies of the pipes :func:`handoff` made."""
    for fd in pass_fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def receive_handoff() -> int:
    """In a child: read the secrets the parent handed (:func:`handoff`) into memory and
    remove the pipe's name from the environment; how many were handed."""
    raw = os.environ.pop(HANDOFF_ENV, None)
    if raw is None:
        return 0
    fd = int(raw)
    try:
        with os.fdopen(fd, "rb") as pipe:
            data = json.loads(pipe.read(PIPE_CAPACITY + 1) or b"{}")
    except (OSError, ValueError) as exc:
        raise OSError(f"the secrets handed on fd {fd} can't be read: {exc}") from exc
    handed = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    _held.update(handed)
    return len(handed)


def held_values() -> list[str]:
    """The values of the secrets this process holds (moved out of its environment or
    handed by its parent): what :mod:`agent.remote.redact` takes out of what leaves the
    device."""
    return [v for v in _held.values() if v]
