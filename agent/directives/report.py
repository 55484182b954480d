"""What the running agent tells the fleet about its bundles: the reported state (which
bundle it runs, which it ran before, and the candidate in a shadow slot)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from agent.installer import Installer
from agent.installer.shadow import SHADOW_SLOT


def agent_version() -> str:
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def reported_state(
    profile_name: str, installer: Installer | None, labels: dict[str, str]
) -> dict[str, Any]:
    """``ReportedState`` fields besides device id, time and online: ``active``,
    ``previous`` and ``shadow`` (the candidate running beside the active bundle; the
    first bundle's, by name, when several have one)."""
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
    return out
