"""Secrets by name: a file in ``$CREDENTIALS_DIRECTORY`` (systemd credentials) first,
then the environment. Configuration files name a secret; they never hold it."""

from __future__ import annotations

import os
from pathlib import Path


def read_secret(name: str) -> str | None:
    """The secret called ``name``, or None when neither place has it (or it is empty)."""
    cred_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    if cred_dir:
        path = Path(cred_dir) / name
        if path.is_file():
            return path.read_text(encoding="utf-8").strip() or None
    return os.environ.get(name) or None
