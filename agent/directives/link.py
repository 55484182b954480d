"""Apply one signed directive: verify (python-tuf), download the bundle as verified
targets, install it (stage, checks, switch, health, commit or roll back), and say what
happened. The transport (MQTT or a side-load directory) is the fetcher's business.

A directive with ``mode = "shadow"`` goes through the same checks (counter, expiry,
signature, hashes, lengths, profile, verified download) and installs into the bundle's
shadow slot (:meth:`Installer.install_shadow`): staged, loaded, warmed up and
benchmarked, never switched. A shadow of the active release is a no-op (nothing to
compare). Any other verified directive for the bundle (a switch, or a revert to the
running release) empties its shadow slot once it is handled. Every report of a verified
directive says its ``mode``.

A directive with ``mode = "revert"`` sends the device back to a release: a rollback to
the previous slot when that slot holds it, else fetched, verified and installed like any
assign, though it is below the committed release (the fleet signed that it wants it:
e.g. the bundle the device was set up with, which no slot holds)."""

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
from agent.installer.shadow import shadow_dir
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
    report |= {
        "bundle": a.name,
        "release": a.release,
        "version": a.version,
        "counter": a.counter,
        "mode": a.mode,
    }
    if a.already_applied:
        out = report | {"outcome": "noop", "step": "plan", "reason": "already applied"}
    elif a.shadow:
        return _shadow(client, installer, a, report, staging_root, source)
    elif previous_slot_holds(installer, a.name, a.release, a.hashes.get("sha256", "")):
        out = _revert(client, installer, a, report)
    else:
        # a revert whose release no slot holds (e.g. the bundle the device was set up
        # with) is fetched and installed like any assign; the directive allows it lower
        out = _install(client, installer, a, report, staging_root, source, probe_factory)
    return out if a.shadow else _end_shadow(installer, a.name, out)


def _end_shadow(installer: Installer, name: str, report: Report) -> Report:
    """A verified directive that is not a shadow ends the comparison: empty the bundle's
    shadow slot (``shadow_cleared``: the release removed)."""
    try:
        removed = installer.clear_shadow(name)
    except InstallError as e:
        log.error("the shadow slot of %s was not emptied: %s", name, e.reason)  # noqa: TRY400
        return report | {"shadow_error": e.reason}
    if removed is None:
        return report
    log.info("shadow candidate %s release %d removed", name, removed.release)
    return report | {"shadow_cleared": removed.release}


def _shadow(
    client: BundleClient,
    installer: Installer,
    a: Assignment,
    report: Report,
    staging_root: Path,
    source: str,
) -> Report:
    """Install the assigned release into the shadow slot (never switching), after the
    same verified download as an install; a no-op without a download when the release
    is the active one or already the shadow."""
    sha = a.hashes.get("sha256", "")
    for what, held in (
        ("active", installer.committed(a.name)),
        ("shadow", installer.shadow(a.name)),
    ):
        if (
            held is not None
            and held.release == a.release
            and _slot_manifest_is(installer, a.name, what, sha)
        ):
            client.record_applied(a.counter, a.digest)
            why = (
                "the active release: nothing to compare"
                if what == "active"
                else "already the shadow"
            )
            return report | {"outcome": "noop", "step": "plan", "reason": why}
    staging = staging_root / f"{a.name}-{a.release}-shadow"
    shutil.rmtree(staging, ignore_errors=True)
    staging_root.mkdir(parents=True, exist_ok=True)
    try:
        bundle_dir = client.download_bundle(a, staging)
        result = installer.install_shadow(bundle_dir, source=source)
    except UpdateError as e:
        log.error("shadow %s release %d refused at %s: %s", a.name, a.release, e.step, e.reason)  # noqa: TRY400
        _drop_superseded(installer, a.name)
        return report | {"outcome": "refused", "step": e.step, "reason": e.reason}
    except InstallError as e:
        client.record_applied(a.counter, a.digest)  # a new directive is needed to retry
        log.error("shadow %s release %d failed at %s: %s", a.name, a.release, e.step, e.reason)  # noqa: TRY400
        outcome = "refused" if e.step == "plan" else "failed"  # plan: never switchable
        return report | {"outcome": outcome, "step": e.step, "reason": e.reason}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    client.record_applied(a.counter, a.digest)
    out = report | {"outcome": result.outcome, "slot": result.slot, "reason": ""}
    if result.outcome == "committed":
        bench = result.benchmark
        return out | {"step": "shadow", "benchmark_p95_ms": bench.p95_ms if bench else None}
    return out | {"step": "plan"}


def _slot_manifest_is(installer: Installer, name: str, slot: str, sha256: str) -> bool:
    """Whether ``name``'s active (``slot`` "active") or shadow slot holds a manifest
    whose sha256 is the one the fleet signed."""
    path = (
        installer.active_bundle(name) if slot == "active" else shadow_dir(installer.state_dir, name)
    )
    if path is None:
        return False
    try:
        data = (path / "manifest.json").read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == sha256


def _drop_superseded(installer: Installer, name: str) -> None:
    """A shadow directive whose bundle was refused still supersedes the candidate in the
    slot: the fleet no longer wants that one compared."""
    try:
        installer.clear_shadow(name)
    except InstallError as e:
        log.error("the shadow slot of %s was not emptied: %s", name, e.reason)  # noqa: TRY400


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
        result = installer.install(bundle_dir, source=source, health_probe=probe, revert=a.revert)
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
