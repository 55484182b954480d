"""A station's recipes (OPC 40100) are the signed bundles installed for its pipeline: the
committed slot (active) and the previous one while it is intact. Selecting one may only
choose such a slot: the active one is a no-op, the previous one is the installer's own
rollback (verified slots only, under the installer's lock), after which the pipelines
load it. Nothing else can be selected: a bundle reaches a device through the fleet's
signed directives or a signed side-load, never through a PLC.

A pipeline that runs a configured directory (no ``installed`` bundle) has one recipe, that
bundle, always active.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.config import AgentConfig, PipelineConfig
from agent.installer import Installer
from agent.installer.errors import InstallError
from agent.kernel.bundle import load_bundle
from agent.kernel.errors import EdgefleetError
from agent.line.servers.vision import Recipe

log = logging.getLogger(__name__)

SELECTABLE = frozenset({"committed", "previous"})
"""The slot states a recipe may be selected from (verified, intact)."""


def recipe_id(name: str, version: str, slot: str) -> str:
    return f"{name}@{version}/{slot}"


class Recipes:
    """The recipes of each station's pipeline, and their selection.

    Args:
        config: the agent's configuration.
        installer: the installer (None: no installed bundles; directories only).
        reload: load the pipelines again after a slot changed.
    """

    def __init__(
        self,
        config: AgentConfig,
        installer: Installer | None,
        reload: Callable[[], object],
    ) -> None:
        self.config = config
        self.installer = installer
        self._reload = reload
        self._pipelines = {p.name: p for p in config.pipelines}
        self._station_pipeline = {s.name: s.pipeline for s in config.stations}

    def _pipeline(self, station: str) -> PipelineConfig | None:
        name = self._station_pipeline.get(station)
        return self._pipelines.get(name) if name else None

    def list(self, station: str) -> list[Recipe]:
        """The station's recipes (empty for an unknown station)."""
        pipe = self._pipeline(station)
        if pipe is None:
            return []
        if pipe.installed and self.installer is not None:
            out = []
            for st in self.installer.status():
                if st.name != pipe.installed or st.state not in SELECTABLE or st.bundle is None:
                    continue
                b = st.bundle
                rid = recipe_id(b.name, b.version, st.slot)
                out.append(Recipe(rid, b.name, b.version, b.digest, st.active))
            if out:
                return out
        if pipe.bundle is None:
            return []
        try:
            bundle = load_bundle(pipe.bundle)
        except EdgefleetError as exc:
            log.warning("station %s: its bundle does not load: %s", station, exc)
            return []
        m = bundle.manifest
        rid = recipe_id(m.name, m.version, "configured")
        return [Recipe(rid, m.name, m.version, bundle.digest, True)]

    def select(self, station: str, wanted: str) -> str | None:
        """Make recipe ``wanted`` active at ``station``; None when done, else why not."""
        recipes = self.list(station)
        match = next((r for r in recipes if r.id == wanted), None)
        if match is None:
            known = ", ".join(r.id for r in recipes) or "none"
            return f"no installed, verified recipe {wanted!r} at {station} (have {known})"
        if match.active:
            return None
        pipe = self._pipeline(station)
        if pipe is None or not pipe.installed or self.installer is None:
            return f"{wanted!r} is not in an installer slot"
        try:
            self.installer.rollback(pipe.installed)
        except InstallError as exc:
            return f"the installer refused: {exc.reason}"
        log.warning("station %s: recipe %s selected (the installer's rollback)", station, wanted)
        self._reload()
        return None
