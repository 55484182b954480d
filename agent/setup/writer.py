"""The configuration ``edge-agent setup`` writes for a new device: rendered as commented
TOML, checked by the same parser ``edge-agent run`` uses before it is written, written
durably with mode 0640 (root and the service's group read it).

What a fresh device's file holds (docs/adr/0012-first-start-setup.md says why):

- ``[agent]``: the device id, the state directory, the firmware profile by name (the one
  ``auto`` chose, so that the drop-in's limits and the running agent agree).
- ``[http]``: the local health and metrics port (loopback).
- one ``[[cameras]]`` per camera given or found, ``line = "line1"``.
- with a bundle: one ``[[pipelines]]`` per camera running it: ``bundle`` (the copy setup
  made in the state directory) and ``installed`` (its name), so that a signed bundle of
  that name, rolled out by the fleet or side-loaded, takes over; the copy stays the
  fallback until then.
- enrolled: ``[uplink]`` and ``[bundles]`` enabled (reports, decision uploads, directives).

Over an existing config (``--force``), what setup was not asked to change is written back
as it was (:mod:`agent.setup.previous` says what replaces what).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, parse_config
from agent.discovery.safetext import one_line
from agent.kernel.durable import make_dirs, write_durable
from agent.kernel.toml import parse_toml
from agent.setup import tomlout
from agent.setup.previous import FLEET_SECTIONS, Previous, extra

DEFAULT_LINE = "line1"
CONFIG_MODE = 0o640


@dataclass(frozen=True)
class CameraEntry:
    """One camera in the new config."""

    name: str
    kind: str
    uri: str = ""
    width: int | None = None
    height: int | None = None
    note: str = ""
    detect_uri: str = ""
    username: str = ""
    password_env: str = ""


@dataclass(frozen=True)
class BundleEntry:
    """The bundle the new config's pipelines run."""

    name: str
    version: str
    path: Path


@dataclass(frozen=True)
class DevicePlan:
    """Everything the new config says."""

    device_id: str
    state_dir: Path
    profile: str
    profile_reason: str
    http_port: int
    cameras: list[CameraEntry] = field(default_factory=list)
    bundle: BundleEntry | None = None
    fleet_url: str = ""
    previous: Previous | None = None
    """The config written over: its sections and keys setup does not render are kept."""
    camera_tables: list[dict[str, Any]] | None = None
    """The previous config's cameras, written back as they were (no ``--camera``)."""
    pipeline_tables: list[dict[str, Any]] | None = None
    """The previous config's pipelines, written back as they were (no ``--bundle``)."""


def _s(value: str) -> str:
    """A TOML basic string.

    Raises:
        ValueError: not text TOML can hold (a lone surrogate).
    """
    return tomlout.string(value)


def render(plan: DevicePlan, now: datetime | None = None) -> str:
    """The config file's text.

    Raises:
        ValueError: a value is not text TOML can hold (a lone surrogate).
    """
    when = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    prev = plan.previous
    kept = prev.kept_sections() if prev is not None else []
    out = [
        f"# Written by `edge-agent setup` on {when}. Every key: README.md, Configuration.",
        "# Check it with `edge-agent check-config`; `edge-agent setup --force` writes it again.",
    ]
    if prev is not None:  # top-level keys of the previous file (before any table)
        for name in kept:
            if not isinstance(prev.data[name], (dict, list)):
                out += tomlout.section(name, prev.data[name])
    out += [
        "",
        "[agent]",
        f"device_id = {_s(plan.device_id)}",
        f"state_dir = {_s(str(plan.state_dir))}",
        f"profile = {_s(plan.profile)}  # {one_line(plan.profile_reason)}",
        *tomlout.body(("agent",), extra(prev, "agent")),
        "",
        "[http]",
        f"port = {plan.http_port}  # /healthz /readyz /metrics on 127.0.0.1",
        *tomlout.body(("http",), extra(prev, "http")),
    ]
    out += _fleet_sections(plan)
    out += _cameras(plan)
    out += _pipelines(plan)
    if prev is not None:
        tables = [n for n in kept if isinstance(prev.data[n], (dict, list))]
        if tables:
            out += ["", f"# Kept from the previous {prev.path.name} as it was."]
        for name in tables:
            out += tomlout.section(name, prev.data[name])
    return "\n".join(out) + "\n"


def _fleet_sections(plan: DevicePlan) -> list[str]:
    """``[uplink]`` and ``[bundles]``: enabled when enrolling now (their other keys kept),
    else the previous config's as they were."""
    prev = plan.previous
    if not plan.fleet_url:
        out: list[str] = []
        for name in FLEET_SECTIONS:
            if prev is not None and name in prev.data:
                out += tomlout.section(name, prev.data[name])
        return out
    return [
        "",
        f"# Enrolled with {one_line(plan.fleet_url)}: the identity is in <state_dir>/identity.",
        "[uplink]",
        "enabled = true",
        *tomlout.body(("uplink",), extra(prev, "uplink")),
        "",
        "[bundles]",
        "enabled = true",
        *tomlout.body(("bundles",), extra(prev, "bundles")),
    ]


def _cameras(plan: DevicePlan) -> list[str]:
    out: list[str] = []
    if plan.camera_tables is not None:
        for table in plan.camera_tables:
            out += tomlout.section("cameras", [table])
        return out
    if not plan.cameras:
        out += ["", "# No camera: add a [[cameras]] table (README.md, Configuration)."]
    for cam in plan.cameras:
        out += ["", "[[cameras]]"]
        if cam.note:
            out.append(f"# {one_line(cam.note)}")  # a camera's words: one line, no controls
        out += [f"name = {_s(cam.name)}", f"kind = {_s(cam.kind)}"]
        if cam.uri:
            out.append(f"uri = {_s(cam.uri)}")
        if cam.detect_uri:
            out.append(f"detect_uri = {_s(cam.detect_uri)}  # the sub-stream the agent decodes")
        if cam.username:
            out.append(f"username = {_s(cam.username)}")
        if cam.password_env:
            out.append(
                f"password_env = {_s(cam.password_env)}  # the password: a file of this name in "
                "the credentials directory, or this environment variable"
            )
        if cam.width is not None and cam.height is not None:
            out += [f"width = {cam.width}", f"height = {cam.height}"]
        out.append(f"line = {_s(DEFAULT_LINE)}")
    return out


def _pipelines(plan: DevicePlan) -> list[str]:
    out: list[str] = []
    if plan.pipeline_tables is not None:
        for table in plan.pipeline_tables:
            out += tomlout.section("pipelines", [table])
        return out
    if plan.bundle is None:
        out += [
            "",
            "# No pipeline: `edge-agent setup --bundle DIR` (or a [[pipelines]] table naming",
            "# `installed = NAME`) gives the fleet's rollouts of bundle NAME a pipeline to run in.",
        ]
    else:
        b = plan.bundle
        for cam in plan.cameras:
            out += [
                "",
                "[[pipelines]]",
                f"name = {_s(_pipeline_name(cam.name, plan))}",
                f"source = {_s(cam.name)}",
                f"# {b.name} {b.version} as set up; a signed {b.name} from the fleet or a",
                "# side-load (edge-agent install) takes over, this copy stays the fallback",
                f"bundle = {_s(str(b.path))}",
                f"installed = {_s(b.name)}",
            ]
    return out


def _pipeline_name(camera: str, plan: DevicePlan) -> str:
    return camera if len(plan.cameras) > 1 else "main"


def check(text: str, path: Path) -> AgentConfig:
    """Parse ``text`` as the config at ``path`` would be parsed by ``edge-agent run``.

    Raises:
        ConfigError: it is not a valid configuration (the field named).
    """
    return parse_config(parse_toml(text, str(path)), str(path), path.parent)


def write_config(path: Path, text: str, *, gid: int | None = None) -> None:
    """Write ``text`` to ``path`` durably, mode 0640; group ``gid`` when given (root
    keeps the file, the service's group reads it).

    Raises:
        OSError: the directory can't be made or the file written.
    """
    make_dirs(path.parent, mode=0o755)
    write_durable(path, text.encode(), mode=CONFIG_MODE)
    if gid is not None and os.stat(path).st_gid != gid:
        os.chown(path, -1, gid)
