"""A bundle directory as the repository sees it: its files, their target paths, ``build``.

A bundle is exactly ``manifest.json`` plus the model files ``manifest.models`` lists. Any
other file in the directory is refused (by ``build``, ``publish`` and ``verify``), so
what an operator sees in the directory is what gets signed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.kernel.errors import BundleError
from agent.wire.manifest import (
    MANIFEST_NAME,
    BundleManifest,
    dump_manifest,
    manifest_object,
    read_manifest_bytes,
    validate_manifest,
)
from fleet_server.repository._files import hash_file

BUNDLES_PREFIX = "bundles"


def target_path(name: str, release: int, file: str) -> str:
    """The TUF target path of a bundle file: ``bundles/<name>/<release>/<file>``."""
    return f"{BUNDLES_PREFIX}/{name}/{release}/{file}"


def manifest_target(name: str, release: int) -> str:
    """The target path of a release's manifest (what a directive names)."""
    return target_path(name, release, MANIFEST_NAME)


def _inside(root: Path, rel: str) -> Path:
    path = root / rel
    try:
        real = path.resolve(strict=True)
    except OSError:
        raise BundleError(str(path), "listed in the manifest but missing") from None
    if not real.is_relative_to(root.resolve()):
        raise BundleError(str(path), f"resolves outside the bundle ({real})")
    if not real.is_file():
        raise BundleError(str(path), "not a regular file")
    return path


def bundle_files(bundle_dir: Path, manifest: BundleManifest) -> list[str]:
    """The bundle's files relative to ``bundle_dir``: the manifest, then each model file.

    Raises:
        BundleError: a listed file is missing, not a regular file or outside the
            directory, or the directory holds a file the manifest does not list.
    """
    root = Path(bundle_dir)
    files = [MANIFEST_NAME, *sorted({v.file for v in manifest.models.values()})]
    for rel in files:
        _inside(root, rel)
    listed = set(files)
    extra = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if not p.is_dir() and p.relative_to(root).as_posix() not in listed
    )
    if extra:
        raise BundleError(
            str(root),
            f"holds files the manifest does not list: {', '.join(extra)} "
            "(remove them, or list model files under models)",
        )
    return files


def build_bundle(
    bundle_dir: Path, *, release: int | None = None, version: str | None = None
) -> BundleManifest:
    """Hash every model file and write its sha256 and size into the manifest.

    ``release`` and ``version`` replace the manifest's when given. The manifest may have
    stale or missing ``sha256``/``size`` before; it is validated in full after.

    Raises:
        BundleError: no or invalid manifest, a listed file missing, an unlisted file in
            the directory, or the manifest can't be written.
    """
    root = Path(bundle_dir)
    source = str(root / MANIFEST_NAME)
    raw: Any = manifest_object(read_manifest_bytes(root), source)
    if not isinstance(raw.get("models"), dict):
        raise BundleError(source, "models: missing, or the manifest is not an object")
    for key, variant in raw["models"].items():
        if not isinstance(variant, dict) or not isinstance(variant.get("file"), str):
            raise BundleError(source, f"models.{key}.file: missing")
        path = _inside(root, variant["file"])
        variant["sha256"], variant["size"] = hash_file(path)
    if release is not None:
        raw["release"] = release
    if version is not None:
        raw["version"] = version
    manifest = validate_manifest(raw, source)
    bundle_files(root, manifest)
    dump_manifest(manifest, root)
    return manifest
