"""The device's trust directory: the trusted root, the ngclient's metadata cache and the
highest directive counter applied.

Layout (``trust_dir``, under the agent's state directory)::

    root.json                 the trusted root (provisioned; later a link the ngclient
                              points at root_history/<N>.root.json)
    root_history/<N>.root.json  every root version trusted so far (ngclient)
    timestamp.json, snapshot.json, targets.json   the ngclient's verified cache
    directive-counter.json    highest directive counter applied, and its digest
    time-floor.json           the time floor (:mod:`agent.update.timefloor`)
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tuf.api.exceptions import RepositoryError, UnsignedMetadataError
from tuf.api.metadata import Metadata, Root  # type: ignore[attr-defined, unused-ignore]

from agent.kernel.durable import fsync_dir, write_durable
from agent.kernel.readlimit import read_at_most
from agent.update.directive import duplicate_keys
from agent.update.errors import TrustRootError
from agent.wire import untrusted
from agent.wire.untrusted import PayloadTooLarge

log = logging.getLogger(__name__)

ROOT_FILE = "root.json"
ROOT_HISTORY = "root_history"
COUNTER_FILE = "directive-counter.json"
_HISTORY_NAME = re.compile(r"^([1-9][0-9]{0,9})\.root\.json$")
MAX_ROOT_BYTES = 512_000
"""A root metadata file larger than this is refused after reading one byte past it."""
_MAX_COUNTER_BYTES = 4096


def check_root(data: bytes, source: str) -> Metadata[Root]:
    """Parse ``data`` as root metadata signed by a threshold of its own distinct keys.

    Raises:
        TrustRootError: over ``MAX_ROOT_BYTES``, not root metadata (or JSON that is too
            deep, holds a number out of range or text that is not Unicode), not signed by
            itself, or a role listing one key under two keyids.
    """
    try:
        untrusted.loads_object(data, what=source, max_bytes=MAX_ROOT_BYTES)
    except untrusted.UntrustedInputError as exc:
        raise TrustRootError(f"not valid root metadata: {exc}") from None
    try:
        md = Metadata[Root].from_bytes(data)
        if not isinstance(md.signed, Root):
            raise TrustRootError(f"{source}: a {md.signed.type} document, not root")
        md.signed.verify_delegate(Root.type, md.signed_bytes, md.signatures)
    except UnsignedMetadataError as exc:
        raise TrustRootError(f"{source}: not signed by its own keys: {exc}") from exc
    except (RepositoryError, ValueError) as exc:
        raise TrustRootError(f"{source}: not valid root metadata: {exc}") from exc
    problems = duplicate_keys(md.signed)
    if problems:
        raise TrustRootError(f"{source}: {'; '.join(problems)}")
    return md


def _read_root(path: Path) -> bytes:
    """At most ``MAX_ROOT_BYTES`` of ``path``.

    Raises:
        TrustRootError: the file is larger.
        OSError: it can't be read.
    """
    try:
        return read_at_most(path, MAX_ROOT_BYTES, "root metadata")
    except PayloadTooLarge as exc:
        raise TrustRootError(str(exc)) from None


def trusted_root(trust_dir: Path) -> Metadata[Root]:
    """The trusted root of ``trust_dir``, checked; a missing ``root.json`` (power lost
    while the ngclient relinked it) is restored from the newest valid root in
    ``root_history``. A corrupt or unsigned one is refused, never deleted.

    Raises:
        TrustRootError: no trusted root, or the one there is corrupt or not signed by itself.
    """
    path = trust_dir / ROOT_FILE
    try:
        return check_root(_read_root(path), str(path))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise TrustRootError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    history = trust_dir / ROOT_HISTORY
    versions = sorted(
        (int(m[1]) for p in _listdir(history) if (m := _HISTORY_NAME.match(p.name))),
        reverse=True,
    )
    for version in versions:
        candidate = history / f"{version}.root.json"
        try:
            md = check_root(_read_root(candidate), str(candidate))
        except (TrustRootError, OSError) as exc:
            log.warning("root history %s is not usable: %s", candidate, exc)
            continue
        path.unlink(missing_ok=True)  # a dangling link
        os.symlink(os.path.join(ROOT_HISTORY, candidate.name), path)
        fsync_dir(trust_dir)
        log.warning("restored %s from %s", path, candidate)
        return md
    raise TrustRootError(f"{path}: no trusted root on this device (provision one)")


def _listdir(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def sync_tree(trust_dir: Path) -> None:
    """fsync every file the ngclient wrote into ``trust_dir`` (it does not), then the
    directories, so that a power loss can't leave a truncated trusted root.

    Raises:
        OSError: a file or directory can't be synced.
    """
    for directory in (trust_dir / ROOT_HISTORY, trust_dir):
        for entry in _listdir(directory):
            if entry.is_file() and not entry.is_symlink():
                fd = os.open(entry, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        if directory.is_dir():
            fsync_dir(directory)


@dataclass(frozen=True)
class Applied:
    """The highest directive counter applied on this device and that directive's digest."""

    counter: int = 0
    digest: str = ""


class AppliedCounter:
    """``<trust_dir>/directive-counter.json``, written durably."""

    def __init__(self, trust_dir: Path) -> None:
        self.path = trust_dir / COUNTER_FILE
        self.unreadable = 0

    def read(self) -> Applied:
        """The applied state; none yet (or an unreadable file, logged) is counter 0.

        An unreadable file falls back to 0 rather than locking updates out; expiry and
        the installed release still refuse an old directive.
        """
        try:
            data = read_at_most(self.path, _MAX_COUNTER_BYTES, "directive counter")
            raw = untrusted.loads_object(data, what=str(self.path), max_bytes=_MAX_COUNTER_BYTES)
            counter, digest = raw["counter"], raw.get("digest", "")
        except FileNotFoundError:
            return Applied()
        except (OSError, untrusted.UntrustedInputError, KeyError) as exc:
            return self._unreadable(str(exc))
        if type(counter) is not int or counter < 0 or not isinstance(digest, str):
            return self._unreadable(f"counter {counter!r}, digest {digest!r}")
        return Applied(counter, digest)

    def _unreadable(self, why: str) -> Applied:
        self.unreadable += 1
        log.error("applied directive counter %s is unreadable (%s); using 0", self.path, why)
        return Applied()

    def write(self, applied: Applied) -> None:
        """Persist ``applied`` durably.

        Raises:
            OSError: the file can't be written.
        """
        data = json.dumps({"counter": applied.counter, "digest": applied.digest}) + "\n"
        write_durable(self.path, data.encode())
