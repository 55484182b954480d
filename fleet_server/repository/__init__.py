"""The fleet's bundle repository: keys, signed TUF metadata, published bundles, directives.

See docs/keys-and-repository.md for the key handling and the on-disk layout.
"""

from __future__ import annotations

from fleet_server.repository._store import Expiries
from fleet_server.repository.bundledir import (
    build_bundle,
    bundle_files,
    manifest_target,
    target_path,
)
from fleet_server.repository.director import (
    issue_directive,
    last_counter,
    next_counter,
)
from fleet_server.repository.keys import ROLES, KeyInfo, KeyStore, Passphrases
from fleet_server.repository.repo import (
    DIRECTOR,
    PublishedBundle,
    PublishedFile,
    Repository,
)

__all__ = [
    "DIRECTOR",
    "ROLES",
    "Expiries",
    "KeyInfo",
    "KeyStore",
    "Passphrases",
    "PublishedBundle",
    "PublishedFile",
    "Repository",
    "build_bundle",
    "bundle_files",
    "issue_directive",
    "last_counter",
    "manifest_target",
    "next_counter",
    "target_path",
]
