"""Pruning the repository: old metadata versions and target files nothing lists.

A TUF client with consistent snapshots reads ``timestamp.json``, then the
``<V>.snapshot.json`` that timestamp names, then each ``<V>.<role>.json`` that snapshot
names, and walks ``<N>.root.json`` upwards from the root it trusts. A client at an older
version needs nothing older: it verifies the current files against what it holds. So:

- every ``<N>.root.json`` is kept (the chain a client walks), and ``root.json``;
- of snapshot and of each targets role (``targets`` and any delegation with a metadata
  file), the current version and the ``keep`` below it are kept, so that a client that
  read a timestamp just before a publish still finds the snapshot it names; and every
  version a kept snapshot names;
- a file under ``targets/`` is kept when a kept targets version lists it (every release
  of every published bundle is in the current targets: nothing is ever removed from
  it); one that none lists (a publish that failed after copying) goes once it is older
  than ``orphan_grace_s``.

Everything runs under the repository's write lock, so no publish is half seen.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_server.repository.repo import Repository

log = logging.getLogger(__name__)

_VERSIONED = re.compile(r"^([1-9][0-9]{0,18})\.([A-Za-z0-9_.-]+)\.json$")


@dataclass
class RepoPruneResult:
    """What a repository prune removed (or, dry run, would remove)."""

    metadata_removed: list[str] = field(default_factory=list)
    targets_removed: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(vars(self))


def versioned(names: Iterable[str]) -> dict[str, list[int]]:
    """``<V>.<role>.json`` names by role (root left out), versions ascending."""
    out: dict[str, list[int]] = {}
    for name in names:
        m = _VERSIONED.match(name)
        if m and m.group(2) != "root":
            out.setdefault(m.group(2), []).append(int(m.group(1)))
    return {role: sorted(v) for role, v in out.items()}


def kept_versions(versions: Iterable[int], current: int, keep: int) -> set[int]:
    """The versions kept: ``current``, the ``keep`` below it, and any above it."""
    return {v for v in versions if v >= current - keep}


def metadata_to_remove(
    on_disk: Mapping[str, list[int]],
    current: Mapping[str, int],
    referenced: set[str],
    keep: int,
) -> list[str]:
    """The metadata file names to remove (pure): per role, the versions below
    ``current[role] - keep`` that no kept snapshot names (``referenced``: file names);
    a role with no current version is judged from its newest file."""
    out = []
    for role, versions in sorted(on_disk.items()):
        newest = current.get(role, versions[-1])
        kept = kept_versions(versions, newest, keep)
        out += [
            name
            for v in versions
            if v not in kept and (name := f"{v}.{role}.json") not in referenced
        ]
    return out


def _snapshot_refs(path: Path) -> dict[str, int]:
    """``{role: version}`` a snapshot file names (``targets.json`` -> ``targets``)."""
    signed = json.loads(path.read_bytes())["signed"]
    return {
        str(meta_path).removesuffix(".json"): int(meta["version"])
        for meta_path, meta in signed["meta"].items()
    }


def _listed_files(repo: Repository, targets_names: Iterable[str]) -> set[Path]:
    """The stored files (``<dir>/<sha256>.<name>``) the given targets versions list."""
    out: set[Path] = set()
    for name in targets_names:
        signed = json.loads((repo.metadata_dir / name).read_bytes())["signed"]
        for tpath, info in signed.get("targets", {}).items():
            parent, _, base = str(tpath).rpartition("/")
            for digest in info.get("hashes", {}).values():
                out.add(repo.targets_dir / parent / f"{digest}.{base}")
    return out


def prune_repository(
    repo: Repository,
    *,
    keep_versions: int = 10,
    orphan_grace_s: float = 7 * 86_400.0,
    now: float | None = None,
    dry_run: bool = False,
) -> RepoPruneResult:
    """Remove what no client can still need (see the module docstring).

    Raises:
        RepoError: not initialised, locked by another writer too long, or its current
            metadata is unreadable (then nothing is removed).
        OSError: a file can't be removed (what was removed before stays removed).
    """
    at = time.time() if now is None else now
    result = RepoPruneResult(dry_run=dry_run)
    if not repo.initialized():
        return result
    with repo.locked():
        snapshot = repo.snapshot().signed  # raises RepoError when unreadable
        on_disk = versioned(p.name for p in repo.metadata_dir.iterdir() if p.is_file())
        snap_kept = kept_versions(on_disk.get("snapshot", []), snapshot.version, keep_versions)
        referenced: dict[str, set[int]] = {}
        for version in sorted(snap_kept):
            try:
                refs = _snapshot_refs(repo.metadata_dir / f"{version}.snapshot.json")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "repository prune: %s.snapshot.json unreadable (%s); kept all", version, exc
                )
                return result
            for role, v in refs.items():
                referenced.setdefault(role, set()).add(v)
        current = {"snapshot": snapshot.version}
        current |= {m.removesuffix(".json"): meta.version for m, meta in snapshot.meta.items()}
        names = {f"{v}.{role}.json" for role, vs in referenced.items() for v in vs}
        remove = metadata_to_remove(on_disk, current, names, keep_versions)
        kept_targets = [
            f"{v}.targets.json"
            for v in on_disk.get("targets", [])
            if f"{v}.targets.json" not in remove
        ]
        listed = _listed_files(repo, kept_targets)
        for name in remove:
            path = repo.metadata_dir / name
            result.bytes_freed += path.stat().st_size
            result.metadata_removed.append(name)
            if not dry_run:
                path.unlink()
        _prune_targets(repo, listed, at - orphan_grace_s, result)
    if result.metadata_removed or result.targets_removed:
        log.info(
            "repository prune: %d metadata file(s), %d target file(s), %d bytes%s",
            len(result.metadata_removed), len(result.targets_removed), result.bytes_freed,
            " (dry run)" if dry_run else "",
        )  # fmt: skip
    return result


def _prune_targets(
    repo: Repository, listed: set[Path], older_than: float, out: RepoPruneResult
) -> None:
    if not repo.targets_dir.is_dir():
        return
    for path in sorted(repo.targets_dir.rglob("*")):
        if not path.is_file() or path.is_symlink() or path in listed:
            continue
        stat = path.stat()
        if stat.st_mtime >= older_than:
            continue
        out.targets_removed.append(str(path.relative_to(repo.targets_dir)))
        out.bytes_freed += stat.st_size
        if not out.dry_run:
            path.unlink()
