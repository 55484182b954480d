"""Apply one signed directive: verify (python-tuf), download the bundle as verified
targets, install it (stage, checks, switch, health, commit or roll back), and say what
happened. The transport (MQTT or a side-load directory) is the fetcher's business."""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuf.ngclient.fetcher import FetcherInterface

from agent.directives.config import BundlesConfig
from agent.errors import AgentError
from agent.installer import Installer, InstallError
from agent.kernel.durable import write_durable
from agent.kernel.readlimit import read_at_most
from agent.update.client import Assignment, BundleClient
from agent.update.errors import UpdateError
from agent.update.timefloor import TimeFloor
from agent.update.trust import MAX_ROOT_BYTES, ROOT_FILE, check_root

log = logging.getLogger(__name__)

Report = dict[str, Any]
ProbeFactory = Callable[[str], Callable[[], Mapping[str, float]]]
"""Given the bundle name being installed, the health probe for its window (or None for
the installer's own trial pool)."""


def trust_dir(cfg: BundlesConfig, state_dir: Path) -> Path:
    return cfg.trust_dir if cfg.trust_dir.is_absolute() else state_dir / cfg.trust_dir


def provision_trust(cfg: BundlesConfig, state_dir: Path) -> Path:
    """Copy the enrollment root into the trust directory when it has none yet.

    Raises:
        AgentError: no trusted root and none to provision, or the provisioned root is not
            a root signed by a threshold of its own keys.
    """
    tdir = trust_dir(cfg, state_dir)
    if (tdir / ROOT_FILE).exists():
        return tdir
    if cfg.initial_root is None:
        raise AgentError(f"no trusted root in {tdir} and bundles.initial_root is not set")
    try:
        data = read_at_most(cfg.initial_root, MAX_ROOT_BYTES, "bundles.initial_root")
    except OSError as e:
        raise AgentError(f"bundles.initial_root {cfg.initial_root}: {e.strerror or e}") from None
    check_root(data, str(cfg.initial_root))
    tdir.mkdir(parents=True, exist_ok=True)
    write_durable(tdir / ROOT_FILE, data)
    return tdir


def make_client(
    cfg: BundlesConfig, state_dir: Path, fetcher: FetcherInterface, *, device_id: str, hw: str
) -> BundleClient:
    tdir = provision_trust(cfg, state_dir)
    return BundleClient(
        tdir,
        fetcher,
        device_id=device_id,
        hardware_class=hw,
        time_floor=TimeFloor(tdir / "time-floor.json"),
    )


def previous_slot_holds(installer: Installer, name: str, release: int, sha256: str) -> bool:
    """Whether ``name``'s previous (not active) slot holds exactly ``release``, with a
    manifest whose sha256 is the one the fleet signed."""
    for slot in installer.status():
        if slot.name != name or slot.active or slot.state != "previous" or slot.bundle is None:
            continue
        if slot.bundle.release != release:
            continue
        try:
            data = (slot.path / "manifest.json").read_bytes()
        except OSError:
            return False
        return hashlib.sha256(data).hexdigest() == sha256
    return False


def apply_directive(
    client: BundleClient,
    installer: Installer,
    directive: bytes,
    *,
    staging_root: Path,
    source: str,
    probe_factory: ProbeFactory | None = None,
) -> Report:
    """Verify, download, install. Never raises an AgentError: the report says the step
    and the reason (``outcome``: committed, noop, refused or failed)."""
    report: Report = {"at": time.time(), "source": source}
    try:
        a = client.check_directive(directive)
    except UpdateError as e:
        log.error("directive refused at %s: %s", e.step, e.reason)  # noqa: TRY400
        return report | {"outcome": "refused", "step": e.step, "reason": e.reason}
    report |= {"bundle": a.name, "release": a.release, "version": a.version, "counter": a.counter}
    if a.already_applied:
        return report | {"outcome": "noop", "step": "plan", "reason": "already applied"}
    if previous_slot_holds(installer, a.name, a.release, a.hashes.get("sha256", "")):
        return _revert(client, installer, a, report)
    return _install(client, installer, a, report, staging_root, source, probe_factory)


def _revert(client: BundleClient, installer: Installer, a: Assignment, report: Report) -> Report:
    """The fleet reverts a wave: the assigned release is the one this device ran before,
    intact in its other slot. Going back is a rollback, not an install."""
    try:
        result = installer.rollback(a.name)
    except InstallError as e:
        return report | {"outcome": "failed", "step": e.step, "reason": e.reason}
    client.record_applied(a.counter, a.digest)
    return report | {
        "outcome": result.outcome,
        "step": "rollback",
        "reason": "",
        "slot": result.slot,
    }


def _install(
    client: BundleClient,
    installer: Installer,
    a: Assignment,
    report: Report,
    staging_root: Path,
    source: str,
    probe_factory: ProbeFactory | None,
) -> Report:
    staging = staging_root / f"{a.name}-{a.release}"
    shutil.rmtree(staging, ignore_errors=True)
    staging_root.mkdir(parents=True, exist_ok=True)
    try:
        bundle_dir = client.download_bundle(a, staging)
        probe = probe_factory(a.name) if probe_factory is not None else None
        result = installer.install(bundle_dir, source=source, health_probe=probe)
    except UpdateError as e:
        log.error("bundle %s release %d refused at %s: %s", a.name, a.release, e.step, e.reason)  # noqa: TRY400
        return report | {"outcome": "refused", "step": e.step, "reason": e.reason}
    except InstallError as e:
        client.record_applied(a.counter, a.digest)  # a new directive is needed to retry
        log.error("install of %s release %d failed at %s: %s", a.name, a.release, e.step, e.reason)  # noqa: TRY400
        return report | {"outcome": "failed", "step": e.step, "reason": e.reason}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    client.record_applied(a.counter, a.digest)
    return report | {"outcome": result.outcome, "step": "commit", "reason": "", "slot": result.slot}
