"""What ``edge-agent setup`` is asked to do (:class:`SetupOptions`) and what it did
(:class:`SetupReport`): the types :mod:`agent.setup.device` and
:mod:`agent.setup.enrolling` both use, in a module of their own so that neither imports
the other for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.setup import dropin
from agent.setup.cameras import DEV_DIR, SYSFS_ROOT

KEPT_UNLESS_GIVEN = ("state_dir", "profile", "http_port")
"""Options with a default that an existing config's value overrides unless given."""


@dataclass(frozen=True)
class SetupOptions:
    """What ``edge-agent setup`` was asked to do (paths are this system's)."""

    config: Path
    state_dir: Path
    profile: str = "auto"
    cameras: tuple[str, ...] = ()
    bundle: Path | None = None
    fleet: str | None = None
    credentials_dir: Path = Path("/etc/edgefleet/credentials/agent")
    dropin_dir: Path | None = dropin.DEFAULT_DIR
    device_id: str | None = None
    http_port: int = 9464
    owner: str | None = None
    force: bool = False
    sysfs_root: Path = SYSFS_ROOT
    dev_dir: Path = DEV_DIR
    camera_user: str = ""
    camera_password_env: str = ""
    discover_timeout_s: float = 3.0
    discover_interface: str | None = None
    discover_ip: str = "both"
    given: frozenset[str] = frozenset(KEPT_UNLESS_GIVEN)
    """Which of :data:`KEPT_UNLESS_GIVEN` the user gave; over an existing config, the
    others are taken from it (the command line leaves out what was not typed)."""


@dataclass
class SetupReport:
    """What setup did, for the terminal or ``--json``."""

    config: str
    device_id: str
    profile: str
    profile_reason: str
    cameras: list[dict[str, Any]] = field(default_factory=list)
    found: list[dict[str, Any]] = field(default_factory=list)
    bundle: dict[str, str] | None = None
    enrolled: dict[str, Any] | None = None
    dropin: str | None = None
    credentials_dir: str = ""
    owner: str = ""
    done: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
