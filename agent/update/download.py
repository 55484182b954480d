"""Download one assigned bundle through an ngclient Updater into a staging directory.

Only the Updater's public API is used: ``get_targetinfo`` (a signed target or none) and
``download_target`` (bytes checked against the signed length and hashes before they are
written). The manifest is parsed only once its bytes verified; each model file it lists
must be a signed target of the same bundle and release (no mix and match) whose sha256
and size are the manifest's. On any failure the staging directory is removed.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from tuf.api.exceptions import DownloadError, RepositoryError
from tuf.api.metadata import TargetFile  # type: ignore[attr-defined, unused-ignore]
from tuf.ngclient.updater import Updater

from agent.kernel.durable import fsync_dir
from agent.kernel.errors import BundleError
from agent.update.directive import bundle_target
from agent.update.errors import BundleRejected, FetchFailed, MetadataRejected, StagingFailed
from agent.wire.manifest import MANIFEST_NAME, parse_manifest

log = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    """``Type: message``, with the cause's message when the error wraps one."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    return f"{text} ({cause})" if cause is not None and str(cause) not in text else text


def custom_of(target: TargetFile) -> dict[str, Any]:
    """The target's ``custom`` fields ({} when there are none)."""
    custom = target.custom
    return custom if isinstance(custom, dict) else {}


def check_release(target: TargetFile, name: str, release: int) -> None:
    """Raises BundleRejected unless the target's custom fields say bundle ``name`` at
    ``release`` (files of another release: mix and match)."""
    custom = custom_of(target)
    got_name, got_release = custom.get("bundle"), custom.get("release")
    if got_name != name or type(got_release) is not int or got_release != release:
        raise BundleRejected(
            f"{target.path}: signed for bundle {got_name!r} release {got_release!r}, "
            f"not {name!r} release {release} (files of different releases)"
        )


def targetinfo(updater: Updater, path: str) -> TargetFile | None:
    """The signed target ``path``, or None.

    Raises:
        MetadataRejected: delegated metadata needed for the lookup failed.
    """
    try:
        return updater.get_targetinfo(path)
    except (RepositoryError, DownloadError, OSError) as exc:
        raise MetadataRejected(f"looking up {path}: {describe(exc)}") from exc


def download_bundle(
    updater: Updater,
    staging: Path,
    *,
    manifest_path: str,
    name: str,
    release: int,
    length: int,
    hashes: dict[str, str],
) -> Path:
    """Download bundle ``name`` ``release`` (manifest target ``manifest_path`` with the
    assigned ``length`` and ``hashes``) into ``staging``, which must be empty or absent.

    Raises:
        FetchFailed: a file could not be downloaded or its bytes don't match.
        BundleRejected: a file missing from the repository, files of another release,
            or a manifest that does not match the assignment.
        StagingFailed: ``staging`` is not empty or can't be written (disk full).
        MetadataRejected: delegated metadata needed for a lookup failed.
    """
    _prepare(staging)
    try:
        found = targetinfo(updater, manifest_path)
        target = _checked_manifest_target(found, manifest_path, name, release, length, hashes)
        _download_files(updater, target, staging, name, release)
    except BaseException:
        remove_tree(staging)
        raise
    return staging


def _prepare(staging: Path) -> None:
    try:
        busy = staging.exists() and any(staging.iterdir())
        if not busy:
            staging.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StagingFailed(f"{staging}: {exc.strerror or exc}") from exc
    if busy:
        raise StagingFailed(f"{staging} is not empty")


def _checked_manifest_target(
    target: TargetFile | None,
    manifest_path: str,
    name: str,
    release: int,
    length: int,
    hashes: dict[str, str],
) -> TargetFile:
    if target is None:
        raise BundleRejected(f"{manifest_path} is not a signed target")
    if target.length != length or target.hashes != hashes:
        raise BundleRejected(f"{manifest_path} changed in the repository since assigned")
    check_release(target, name, release)
    return target


def _download_files(
    updater: Updater, manifest_target: TargetFile, staging: Path, name: str, release: int
) -> None:
    path = _download(updater, manifest_target, staging / MANIFEST_NAME)
    try:  # parsed only now that its bytes are verified
        manifest = parse_manifest(path.read_bytes(), str(path))
    except BundleError as exc:
        raise BundleRejected(f"{manifest_target.path}: {exc.reason}") from exc
    if manifest.name != name or manifest.release != release:
        raise BundleRejected(
            f"{manifest_target.path}: the manifest says {manifest.name} release "
            f"{manifest.release}, not {name} release {release}"
        )
    for key, variant in manifest.models.items():
        target_path = bundle_target(name, release, variant.file)
        target = targetinfo(updater, target_path)
        if target is None:
            raise BundleRejected(
                f"models.{key}: {target_path} is not a signed target (partial bundle)"
            )
        check_release(target, name, release)
        if target.hashes.get("sha256") != variant.sha256 or target.length != variant.size:
            raise BundleRejected(
                f"models.{key}: {target_path} is signed with another sha256 or size "
                "than the manifest lists (files of different releases)"
            )
        _download(updater, target, staging / variant.file)
    try:
        for directory in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            fsync_dir(directory)
    except OSError as exc:
        raise StagingFailed(f"{staging}: cannot sync: {exc.strerror or exc}") from exc


def _download(updater: Updater, target: TargetFile, dest: Path) -> Path:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        updater.download_target(target, filepath=str(dest))
        fd = os.open(dest, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except DownloadError as exc:
        raise FetchFailed(f"{target.path}: {describe(exc)}") from exc
    except RepositoryError as exc:
        raise FetchFailed(f"{target.path}: not the signed length/hashes: {exc}") from exc
    except OSError as exc:
        raise StagingFailed(f"{dest}: {exc.strerror or exc}") from exc
    return dest


def remove_tree(path: Path) -> None:
    """Remove a partial staging directory; a failure is logged, not raised (the caller
    is already raising the reason it failed)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("cannot remove the partial staging dir %s: %s", path, exc)  # noqa: TRY400
