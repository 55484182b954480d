"""What the running agent tells the fleet about its bundles: the reported state (which
bundle it runs, which it ran before, and the candidate in a shadow slot).

A pipeline stage that names an installed bundle runs its configured directory until
the installer holds one (the bundle ``edge-agent setup`` copied, or one put there by
hand): that bundle is reported as active too (name, version, release, digest), so the
fleet knows what a revert returns such a device to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.installer import Installer
from agent.installer.shadow import SHADOW_SLOT
from agent.kernel.bundle import load_bundle
from agent.kernel.errors import BundleError

if TYPE_CHECKING:
    from agent.config import AgentConfig

log = logging.getLogger(__name__)


def configured_bundles(config: AgentConfig) -> dict[str, Path]:
    """Installed bundle name -> the directory its stages run until one is installed
    (the first stage naming it with a ``bundle`` directory)."""
    out: dict[str, Path] = {}
    for p in config.pipelines:
        for ref in (p, *p.chain):
            if ref.installed and ref.bundle is not None:
                out.setdefault(ref.installed, ref.bundle)
    return out


def _configured_ref(name: str, path: Path) -> dict[str, Any] | None:
    """The bundle in ``path`` as a reported bundle ref; None when it does not load or
    names another bundle (the reason is logged)."""
    try:
        stat = (path / "manifest.json").stat()
    except OSError as exc:
        log.warning("bundle %s: configured directory %s: %s", name, path, exc.strerror or exc)
        return None
    return _load_ref(name, str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _load_ref(name: str, path: str, mtime_ns: int, size: int) -> dict[str, Any] | None:
    """Loaded once per manifest version (``mtime_ns``, ``size``): every model file is
    hashed for the digest."""
    try:
        bundle = load_bundle(Path(path))
    except BundleError as exc:
        log.warning("bundle %s: configured directory %s: %s", name, path, exc.reason)
        return None
    m = bundle.manifest
    if m.name != name:
        log.warning("bundle %s: configured directory %s holds bundle %s", name, path, m.name)
        return None
    return {"name": m.name, "version": m.version, "release": m.release, "digest": bundle.digest}


def agent_version() -> str:
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def reported_state(
    profile_name: str,
    installer: Installer | None,
    labels: dict[str, str],
    configured: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """``ReportedState`` fields besides device id, time and online: ``active``,
    ``previous`` and ``shadow`` (the candidate running beside the active bundle; the
    first bundle's, by name, when several have one). ``configured``
    (:func:`configured_bundles`): a bundle no slot holds yet runs from its configured
    directory, and is reported active when no installed one is."""
    out: dict[str, Any] = {
        "agent_version": agent_version(),
        "profile": profile_name,
        "labels": labels,
    }
    if installer is None:
        return out
    for slot in installer.status():
        if slot.bundle is None:
            continue
        ref = {
            "name": slot.name,
            "version": slot.bundle.version,
            "release": slot.bundle.release,
            "digest": slot.bundle.digest,
        }
        if slot.active and "active" not in out:
            out["active"] = ref
        elif slot.state == "previous" and "previous" not in out:
            out["previous"] = ref
        elif slot.state == SHADOW_SLOT and "shadow" not in out:
            out["shadow"] = ref
    if "active" not in out:  # no slot runs: the configured directory does
        for name, path in sorted((configured or {}).items()):
            found = _configured_ref(name, path)
            if found is not None:
                out["active"] = found
                break
    return out
