"""Which candidate each pipeline shadows, loaded and checked before the pool starts.

A pipeline whose first stage is an installed bundle ``NAME`` shadows the candidate in
that bundle's shadow slot (:func:`agent.installer.shadow.shadow_bundle`) while ``[shadow]
enabled``. The candidate is served by the same pool as ``<pipeline>#shadow``. A candidate
that does not load, is not for this device's profile, or can't take the live model's
input is a problem of its own (``shadow <pipeline>``): the live pipeline runs without it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.config import AgentConfig, PipelineConfig
from agent.installer.shadow import shadow_bundle
from agent.kernel.bundle import Bundle, load_bundle
from agent.kernel.errors import BundleError
from agent.shadow.stats import ShadowKey
from agent.wire.manifest import MANIFEST_NAME

SHADOW_PROBLEM = "shadow "
"""The prefix of a shadow's problem (``shadow <pipeline>``); a reload clears them."""
MODEL_SUFFIX = "#shadow"
SHADOW_QUEUE_BOUND = 2
"""Queue places of a candidate in the pool: a shadow thread has one frame at a time."""

ShadowResolver = Callable[[PipelineConfig], Path | None]
"""The shadow slot a pipeline's candidate is in, or None (no candidate)."""

ShadowRef = tuple[str, str]
"""A candidate as a reload sees it: (slot path, sha256 of its manifest file)."""


def installed_shadows(cfg: AgentConfig) -> ShadowResolver:
    """The default: a pipeline whose first stage names an installed bundle shadows that
    bundle's shadow slot, when ``[shadow] enabled``."""

    def resolve(p: PipelineConfig) -> Path | None:
        if not cfg.shadow.enabled or not p.installed:
            return None
        return shadow_bundle(cfg.agent.state_dir, p.installed)

    return resolve


def shadow_ref(path: Path | None) -> ShadowRef | None:
    """What a reload compares: the slot and its manifest's digest (a new candidate in the
    same slot has a new manifest). None without a readable manifest."""
    if path is None:
        return None
    try:
        data = (Path(path) / MANIFEST_NAME).read_bytes()
    except OSError:
        return None
    return (str(path), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class ShadowPlan:
    """A candidate that loaded: its bundle, its model name in the pool, its key."""

    pipeline: str
    bundle: Bundle
    model: str
    key: ShadowKey
    model_path: str
    """The model file the pool loads (a load error names it)."""


def plan_shadow(pipeline: str, path: Path, live: Bundle, profile: str) -> ShadowPlan:
    """Load the candidate in ``path`` for a pipeline whose first stage is ``live``.

    Raises:
        BundleError: it does not load, is not for ``profile``, or can't take the live
            model's input (an image model needs preprocessing where the live one has it,
            a tensor model the same input shape and type).
    """
    bundle = load_bundle(path)
    bundle.check_profile(profile)
    lm, cm = live.manifest, bundle.manifest
    if lm.preprocess is not None and cm.preprocess is None:
        raise BundleError(str(path), "the live model takes images; this one has no preprocess")
    if lm.preprocess is None:
        if cm.preprocess is not None:
            raise BundleError(str(path), "the live model takes tensors; this one takes images")
        if (lm.input.concrete_shape(), lm.input.dtype) != (
            cm.input.concrete_shape(),
            cm.input.dtype,
        ):
            raise BundleError(
                str(path),
                f"input {cm.input.dtype}{list(cm.input.concrete_shape() or [])} differs from the "
                f"live model's {lm.input.dtype}{list(lm.input.concrete_shape() or [])}",
            )
    key = ShadowKey(cm.name, cm.version, cm.release, bundle.digest)
    model_path = str(bundle.model_file())
    return ShadowPlan(pipeline, bundle, f"{pipeline}{MODEL_SUFFIX}", key, model_path)
