"""The shadow slot: ``<state_dir>/bundles/<name>/slot-shadow``.

A directive with ``mode = "shadow"`` installs a candidate here, beside the active slots
(the same fetch, signature, hash and profile checks, and the same warm-up), without
switching: the hot path runs it on a sampled share of the frames of every pipeline whose
first stage is bundle ``<name>``, and it never acts. A later directive that is not a
shadow (the switch, or a revert to the running release) empties the slot.

This module is the contract between the installer, which fills and empties the slot,
and the hot path, which reads it (:func:`shadow_bundle`). The installer stages and checks
a candidate in :func:`shadow_staging_dir` and renames it into the slot only once it has
loaded, warmed up and passed its self-benchmark, so the slot never holds a bundle that
was not checked (:mod:`agent.installer.shadowslot`).
"""

from __future__ import annotations

from pathlib import Path

from agent.wire.manifest import MANIFEST_NAME

SHADOW_SLOT = "shadow"
SHADOW_STATE_FILE = "shadow-state.json"
"""Beside the slots: the shadow install in progress or its last result."""


def shadow_dir(state_dir: Path, name: str) -> Path:
    """The shadow slot directory of bundle ``name``."""
    return Path(state_dir) / "bundles" / name / f"slot-{SHADOW_SLOT}"


def shadow_bundle(state_dir: Path, name: str) -> Path | None:
    """The shadow slot of ``name`` when it holds a staged bundle (its manifest is written
    last, so a slot with a manifest is complete); ``None`` otherwise."""
    path = shadow_dir(state_dir, name)
    return path if (path / MANIFEST_NAME).is_file() else None


def shadow_staging_dir(state_dir: Path, name: str) -> Path:
    """Where a candidate is staged and checked before it is renamed into the slot."""
    return shadow_dir(state_dir, name).with_name(f"slot-{SHADOW_SLOT}.staging")


def shadow_retired_dir(state_dir: Path, name: str) -> Path:
    """Where the replaced candidate goes for the moment between the two renames."""
    return shadow_dir(state_dir, name).with_name(f"slot-{SHADOW_SLOT}.old")
