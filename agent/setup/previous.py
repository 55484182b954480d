"""What ``edge-agent setup --force`` keeps of the config it writes over.

Setup writes ``[agent]`` (device_id, state_dir, profile), ``[http]`` (port), the cameras,
the pipelines and, enrolling, ``[uplink]`` and ``[bundles]``. Run again over an existing
config, it changes only what it was asked to change and keeps the rest as it was:

| given | what it replaces |
| --- | --- |
| ``--camera`` | the ``[[cameras]]``; setup's own pipelines follow the new cameras |
| ``--bundle`` | the ``[[pipelines]]`` |
| ``--fleet`` | ``enabled`` of ``[uplink]`` and ``[bundles]`` (their other keys stay) |
| ``--device-id``, ``--state-dir``, ``--profile``, ``--http-port`` | that key |

Every other section and key stays, and the report names what was kept and what was
replaced. Where keeping is impossible (a pipeline of the old config reads a camera the new
cameras drop), setup refuses, naming what would be lost, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.kernel.errors import ConfigError
from agent.kernel.toml import load_toml_file
from agent.setup.errors import SetupError

RENDERED_KEYS = {"agent": ("device_id", "state_dir", "profile"), "http": ("port",)}
"""Keys of the tables setup renders itself; the tables' other keys are kept."""
FLEET_SECTIONS = ("uplink", "bundles")
SETUP_PIPELINE_KEYS = {"name", "source", "bundle", "installed"}
"""A pipeline with these keys only, naming the same bundle as every other, is setup's."""


@dataclass(frozen=True)
class Previous:
    """An existing config as TOML data (the file is read, not validated: what it holds
    is kept, and the new file is checked as a whole)."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    def table(self, name: str) -> dict[str, Any]:
        v = self.data.get(name)
        return dict(v) if isinstance(v, Mapping) else {}

    def tables(self, name: str) -> list[dict[str, Any]]:
        v = self.data.get(name)
        if not isinstance(v, list):
            return []
        return [dict(x) for x in v if isinstance(x, Mapping)]

    def get(self, section: str, name: str) -> Any:
        return self.table(section).get(name)

    @property
    def enrolled(self) -> bool:
        """Its ``[uplink]`` or ``[bundles]`` is enabled."""
        return any(self.get(s, "enabled") is True for s in FLEET_SECTIONS)

    def setup_bundle(self) -> tuple[str, Path] | None:
        """(name, path) of the bundle setup's pipelines run, when every pipeline is one
        setup made (name, source, ``bundle`` and ``installed``, all the same bundle)."""
        pipes = self.tables("pipelines")
        if not pipes or any(set(p) != SETUP_PIPELINE_KEYS for p in pipes):
            return None
        found = {(str(p["installed"]), str(p["bundle"])) for p in pipes}
        if len(found) != 1:
            return None
        name, path = found.pop()
        return name, Path(path)

    def kept_sections(self) -> list[str]:
        """The top-level entries setup does not render at all (kept as they are)."""
        rendered = {*RENDERED_KEYS, "cameras", "pipelines", *FLEET_SECTIONS}
        return [k for k in self.data if k not in rendered]


def read_previous(path: Path) -> Previous:
    """The config at ``path``.

    Raises:
        SetupError: it can't be read as TOML: setup can't tell what it would drop.
    """
    try:
        data = load_toml_file(path)
    except ConfigError as exc:
        raise SetupError(
            str(path),
            f"{exc.reason}: setup keeps what an existing config holds and can't read this "
            "one; nothing changed (fix it, or move it away to write a new one)",
        ) from None
    return Previous(path, data)


def extra(previous: Previous | None, section: str) -> dict[str, Any]:
    """The keys of ``previous``'s ``section`` that setup does not render."""
    if previous is None:
        return {}
    skip = set(RENDERED_KEYS.get(section, ()))
    if section in FLEET_SECTIONS:
        skip.add("enabled")
    return {k: v for k, v in previous.table(section).items() if k not in skip}


def lost_pipelines(previous: Previous, cameras: set[str]) -> list[str]:
    """Pipelines of ``previous`` whose source is neither one of ``cameras`` nor one of
    its sensors: ``name (source)``."""
    sensors = {str(s.get("name")) for s in previous.tables("sensors")}
    return [
        f"{p.get('name', '?')} (reads {p.get('source', '?')})"
        for p in previous.tables("pipelines")
        if str(p.get("source")) not in cameras | sensors
    ]
