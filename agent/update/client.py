"""The device's update client: python-tuf's ngclient over an injected fetcher, plus the
director's assignment, the time floor and the directive counter.

Order of work, each step verifying before anything is parsed or kept:
:meth:`BundleClient.refresh` (root -> timestamp -> snapshot -> targets, at the effective
time) -> :meth:`BundleClient.check_directive` -> :meth:`BundleClient.download_bundle`
(manifest, then each model file: signed targets of the same release, hashes as the
manifest says) -> the installer stages, switches and commits ->
:meth:`BundleClient.record_applied`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tuf.api.exceptions import DownloadError, ExpiredMetadataError, RepositoryError
from tuf.api.metadata import Root, Signed, Snapshot, Targets, Timestamp  # type: ignore[attr-defined, unused-ignore]
from tuf.ngclient.config import UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface
from tuf.ngclient.updater import Updater

from agent.update.directive import (
    MODE_ACTIVE,
    MODE_REVERT,
    MODE_SHADOW,
    duplicate_keys,
    verify_directive,
)
from agent.update.download import custom_of, describe, download_bundle, targetinfo
from agent.update.errors import (
    STEP_REFRESH,
    DirectiveRefused,
    MetadataRejected,
    RollbackRefused,
    StaleMetadataError,
    TrustRootError,
    UpdateError,
)
from agent.update.timefloor import TimeFloor
from agent.update.trust import Applied, AppliedCounter, sync_tree, trusted_root
from agent.wire.fetch import METADATA_BASE_URL, TARGETS_BASE_URL

log = logging.getLogger(__name__)

_REFRESH_LOCKS: dict[Path, threading.Lock] = {}
_REFRESH_LOCKS_LOCK = threading.Lock()


def refresh_lock(trust_dir: Path) -> threading.Lock:
    """The lock every refresh of ``trust_dir`` in this process holds: the directives
    service and the remote actions service refresh the same metadata cache."""
    key = Path(trust_dir).absolute()
    with _REFRESH_LOCKS_LOCK:
        return _REFRESH_LOCKS.setdefault(key, threading.Lock())


class _Updater(Updater):
    """An ngclient Updater whose expiry checks use the effective time (time floor)
    instead of the raw clock, and that shows its trusted metadata.
    """

    def __init__(
        self, trust_dir: Path, fetcher: FetcherInterface, config: UpdaterConfig, now: datetime
    ) -> None:
        super().__init__(
            str(trust_dir),
            METADATA_BASE_URL,
            target_base_url=TARGETS_BASE_URL,
            fetcher=fetcher,
            config=config,
            bootstrap=None,  # the device's provisioned root.json is the trust anchor
        )
        # TrustedMetadataSet checks every expiry against reference_time (taken from the
        # clock at construction); the root it has loaded so far is not checked yet.
        if not isinstance(getattr(self._trusted_set, "reference_time", None), datetime):
            raise UpdateError(STEP_REFRESH, "this python-tuf has no reference_time to set")
        self._trusted_set.reference_time = now

    def trusted(self, role: str) -> Signed:
        """The verified top-level metadata of ``role`` (KeyError: not loaded)."""
        return self._trusted_set[role]


@dataclass(frozen=True)
class Assignment:
    """A verified directive for this device, checked against the repository.

    Attributes:
        target_path: ``bundles/<name>/<release>/manifest.json``.
        name, release: the bundle and release assigned.
        length, hashes: the manifest target's, as the repository signed them.
        counter: the directive's counter.
        already_applied: nothing to do (this directive, or this release, is installed).
        expires: the directive's expiry.
        digest: the directive's digest (equal digests: the same directive).
        version: the bundle's semantic version ("" when the repository gives none).
        profiles: firmware profiles the bundle is for (empty: any).
        mode: the directive's mode: ``active`` (install and switch) or ``shadow``
            (install into the shadow slot; see :mod:`agent.installer.shadow`).
    """

    target_path: str
    name: str
    release: int
    length: int
    hashes: dict[str, str]
    counter: int
    already_applied: bool = False
    expires: datetime | None = None
    digest: str = ""
    version: str = ""
    profiles: tuple[str, ...] = ()
    mode: str = MODE_ACTIVE

    @property
    def shadow(self) -> bool:
        """Whether the directive installs into the shadow slot (never switches)."""
        return self.mode == MODE_SHADOW

    @property
    def revert(self) -> bool:
        """Whether the fleet sends the device back to this release (it may be below the
        committed one; installed like any assign when no slot holds it)."""
        return self.mode == MODE_REVERT


class BundleClient:
    """Verifies directives and downloads assigned bundles through a TUF repository.

    Args:
        trust_dir: the trusted root and the metadata cache (:mod:`agent.update.trust`).
        fetcher: the transport (:class:`agent.update.fetchers.MqttFetcher` or
            :class:`agent.update.fetchers.LocalDirFetcher`).
        device_id: this device.
        hardware_class: this device's firmware profile name.
        time_floor: gives the effective time and is raised at each successful refresh.
        config: ngclient limits (metadata sizes, root rotations).
    """

    def __init__(
        self,
        trust_dir: Path,
        fetcher: FetcherInterface,
        *,
        device_id: str,
        hardware_class: str,
        time_floor: TimeFloor,
        config: UpdaterConfig | None = None,
    ) -> None:
        self.trust_dir = Path(trust_dir)
        self.fetcher = fetcher
        self.device_id = device_id
        self.hardware_class = hardware_class
        self.time_floor = time_floor
        self.config = config or UpdaterConfig()
        self.stale = False
        """Whether the last refresh found the metadata expired (a freeze, or the clock)."""
        self.stale_reason = ""
        self.floor_write_failures = 0
        self._counter = AppliedCounter(self.trust_dir)
        self._updater: _Updater | None = None
        self._digests: dict[int, str] = {}

    def refresh(self) -> None:
        """Load the newest trusted metadata (root, timestamp, snapshot, targets).

        Raises:
            TrustRootError: the device's trusted root is missing, corrupt or unsigned;
                nothing was fetched.
            StaleMetadataError: the metadata is expired at the effective time; the
                client is marked stale and the trusted root is kept.
            MetadataRejected: metadata failed verification or could not be fetched.
            UpdateError: this python-tuf offers no way to check at the effective time.
        """
        with refresh_lock(self.trust_dir):
            self._refresh()

    def trusted_targets(self) -> Targets:
        """The repository's top-level targets, verified by a refresh done now: what a
        signed action request is checked against (:mod:`agent.remote.request`).

        Raises:
            TrustRootError, StaleMetadataError, MetadataRejected, UpdateError: as
                :meth:`refresh`.
        """
        self.refresh()
        assert self._updater is not None  # noqa: S101
        targets = self._updater.trusted(Targets.type)
        assert isinstance(targets, Targets)  # noqa: S101
        return targets

    def _refresh(self) -> None:
        self._updater = None
        trusted_root(self.trust_dir)
        now = self.time_floor.now()
        try:
            updater = _Updater(self.trust_dir, self.fetcher, self.config, now)
        except (OSError, RepositoryError) as exc:
            raise TrustRootError(f"{self.trust_dir}: {exc}") from exc
        try:
            updater.refresh()
        except ExpiredMetadataError as exc:
            raise self._stale(f"{exc} (effective time {now.isoformat()})") from exc
        except (RepositoryError, DownloadError, OSError) as exc:
            raise MetadataRejected(describe(exc)) from exc
        finally:
            self._sync()
        for role in (Root.type, Timestamp.type, Snapshot.type, Targets.type):
            if updater.trusted(role).is_expired(now):
                raise self._stale(f"{role}.json is expired (effective time {now.isoformat()})")
        root = updater.trusted(Root.type)
        targets = updater.trusted(Targets.type)
        assert isinstance(root, Root)  # noqa: S101
        assert isinstance(targets, Targets)  # noqa: S101
        problems = duplicate_keys(root) + duplicate_keys(targets)
        if problems:
            raise MetadataRejected("; ".join(problems))
        self.stale, self.stale_reason = False, ""
        self._updater = updater
        try:
            self.time_floor.raise_to(self.time_floor.clock())
        except OSError as exc:
            self.floor_write_failures += 1
            log.error("cannot persist the time floor %s: %s", self.time_floor.path, exc)  # noqa: TRY400

    def check_directive(
        self,
        directive_bytes: bytes,
        *,
        installed_name: str | None = None,
        installed_release: int | None = None,
    ) -> Assignment:
        """Verify a directive and check it against this device and the repository.

        The directive applied last (same counter and digest) comes back with
        ``already_applied`` set, even if it has expired since; so does one naming the
        installed release of the installed bundle.

        Raises:
            DirectiveRefused: bad signature, another device or hardware class, expired,
                a target the repository does not sign with the same hashes, or a bundle
                not for this hardware class.
            RollbackRefused: a counter not above the highest applied (replay), or a
                release below the installed one.
            TrustRootError, StaleMetadataError, MetadataRejected: from the refresh done
                first when none was.
        """
        updater = self._refreshed()
        targets = updater.trusted(Targets.type)
        assert isinstance(targets, Targets)  # noqa: S101
        d = verify_directive(
            directive_bytes,
            targets,
            device_id=self.device_id,
            hardware_class=self.hardware_class,
        )
        applied = self._counter.read()
        if d.counter == applied.counter and d.digest == applied.digest:
            # Applied already: nothing to fetch, even if it (or its release) is gone since.
            return Assignment(
                target_path=d.target_path,
                name=d.name,
                release=d.release,
                length=d.length,
                hashes=dict(d.hashes),
                counter=d.counter,
                already_applied=True,
                expires=d.expires,
                digest=d.digest,
                mode=d.mode,
            )
        if d.counter <= applied.counter:
            raise RollbackRefused(
                f"counter {d.counter} is not above {applied.counter}, the highest applied "
                "(a replayed or reordered directive)"
            )
        now = self.time_floor.now()
        if d.is_expired(now):
            raise DirectiveRefused(
                f"expired at {d.expires.isoformat()} (effective time {now.isoformat()})"
            )
        target = targetinfo(updater, d.target_path)
        if target is None:
            raise DirectiveRefused(f"{d.target_path} is not a signed target of the repository")
        if (
            not set(d.hashes) & set(target.hashes)
            or target.length != d.length
            or any(d.hashes[alg] != target.hashes.get(alg) for alg in d.hashes)
        ):
            raise DirectiveRefused(
                f"{d.target_path}: the directive's length/hashes differ from the repository's"
            )
        custom = custom_of(target)
        profiles = custom.get("profiles") or []
        if not isinstance(profiles, list) or (profiles and self.hardware_class not in profiles):
            raise DirectiveRefused(
                f"{d.target_path}: bundle is for profiles {profiles}, not {self.hardware_class!r}"
            )
        done = False
        if installed_name == d.name and installed_release is not None:
            if d.release < installed_release:
                raise RollbackRefused(
                    f"release {d.release} of {d.name} is below the installed {installed_release}"
                )
            done = d.release == installed_release
        self._digests[d.counter] = d.digest
        return Assignment(
            target_path=d.target_path,
            name=d.name,
            release=d.release,
            length=target.length,
            hashes=dict(target.hashes),
            counter=d.counter,
            already_applied=done,
            expires=d.expires,
            digest=d.digest,
            version=str(custom.get("version", "")),
            profiles=tuple(str(p) for p in profiles),
            mode=d.mode,
        )

    def download_bundle(self, assignment: Assignment, staging_dir: Path) -> Path:
        """Download and verify the assigned bundle into ``staging_dir`` (created; must
        not hold anything); on any failure the staging directory is removed.

        Raises:
            FetchFailed: a file could not be downloaded or its bytes don't match.
            BundleRejected: a file missing from the repository, files of another
                release, or a manifest that does not match the assignment.
            StagingFailed: ``staging_dir`` is not empty or can't be written (disk full).
            TrustRootError, StaleMetadataError, MetadataRejected: from the refresh done
                first when none was.
        """
        return download_bundle(
            self._refreshed(),
            Path(staging_dir),
            manifest_path=assignment.target_path,
            name=assignment.name,
            release=assignment.release,
            length=assignment.length,
            hashes=assignment.hashes,
        )

    def record_applied(self, counter: int, digest: str | None = None) -> None:
        """Persist ``counter`` as the highest directive applied (never lowers it).

        ``digest`` defaults to that of the directive with this counter that
        :meth:`check_directive` verified.

        Raises:
            UpdateError: the counter file can't be written.
        """
        current = self._counter.read()
        if counter < current.counter:
            log.warning("not lowering the applied counter %d to %d", current.counter, counter)
            return
        applied = Applied(counter, digest if digest is not None else self._digests.get(counter, ""))
        try:
            self._counter.write(applied)
        except OSError as exc:
            raise UpdateError("commit", f"cannot persist the directive counter: {exc}") from exc

    def applied_counter(self) -> int:
        """The highest directive counter applied on this device (0: none)."""
        return self._counter.read().counter

    # -- internals ------------------------------------------------------------------

    def _refreshed(self) -> _Updater:
        if self._updater is None:
            self.refresh()
        assert self._updater is not None  # noqa: S101
        return self._updater

    def _stale(self, reason: str) -> StaleMetadataError:
        self.stale, self.stale_reason = True, reason
        log.error("update metadata is stale: %s", reason)
        return StaleMetadataError(f"stale: {reason}")

    def _sync(self) -> None:
        try:
            sync_tree(self.trust_dir)
        except OSError as exc:
            log.error("cannot sync the trust directory %s: %s", self.trust_dir, exc)  # noqa: TRY400
