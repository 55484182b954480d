"""Secrets by name: a file in ``$CREDENTIALS_DIRECTORY`` (systemd credentials) first,
then the environment. Configuration files name a secret; they never hold it.

The packaged units load a whole directory of secret files with
``LoadCredential=edgefleet:/etc/edgefleet/credentials/<part>``; systemd (252) names each
credential ``edgefleet_<FILE NAME>``, so a secret ``NAME`` is read from
``$CREDENTIALS_DIRECTORY/NAME`` or, failing that, ``$CREDENTIALS_DIRECTORY/edgefleet_NAME``.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    """The secret called ``name``, or None when neither place has it (or it is empty)."""
    path = credential_file(os.environ.get("CREDENTIALS_DIRECTORY"), name)
    if path is not None:
        return path.read_text(encoding="utf-8").strip() or None
    return os.environ.get(name) or None
