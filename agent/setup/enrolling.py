"""Setup's enrollment: the identity a device keeps, or a new one from the fleet.

With ``--fleet``, an identity of the same device with the same fleet is kept (no token
is read); another one is replaced only with ``--force``. Without ``--fleet``, the
``[uplink]`` and ``[bundles]`` kept from the previous config go on using the identity in
the state directory, which must be this device's.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from typing import TYPE_CHECKING

from agent.directives.config import BundlesConfig
from agent.directives.link import trust_dir
from agent.enrollment.identity import Identity, enroll
from agent.kernel.durable import make_dirs
from agent.kernel.errors import EdgefleetError
from agent.setup.errors import SetupError

if TYPE_CHECKING:
    from agent.setup.options import SetupOptions, SetupReport
    from agent.setup.previous import Previous


def _same_server(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def kept_enrollment(
    opts: SetupOptions, device_id: str, previous: Previous | None, report: SetupReport
) -> Identity | None:
    """Without ``--fleet``: the identity the kept ``[uplink]``/``[bundles]`` use.

    Raises:
        SetupError: it is another device's (the kept sections would not connect).
    """
    if previous is None or not previous.enrolled:
        return None
    try:
        have = Identity.load(opts.state_dir)
    except EdgefleetError as exc:
        report.warnings.append(f"the kept [uplink]/[bundles] have no usable enrollment: {exc}")
        return None
    if have is None:
        report.warnings.append(
            f"the kept [uplink]/[bundles] have no enrollment in {opts.state_dir}: enroll "
            "with --fleet URL --token -"
        )
        return None
    if have.device_id != device_id:
        raise SetupError(
            "--device-id",
            f"this device is enrolled as {have.device_id} with {have.server_url or '?'}; the "
            f"kept [uplink] and [bundles] would not connect as {device_id}: give --fleet URL "
            f"--token - to enroll {device_id}; nothing changed",
        )
    return have


def enrollment(opts: SetupOptions, device_id: str) -> tuple[Identity | None, bool]:
    """The identity already there, and whether enrolling is needed."""
    if opts.fleet is None:
        return None, False
    try:
        have = Identity.load(opts.state_dir)
    except EdgefleetError as exc:
        if not opts.force:
            raise SetupError("enrollment", f"{exc} (give --force to enroll again)") from None
        return None, True
    if have is None:
        return None, True
    same = have.device_id == device_id and _same_server(have.server_url, opts.fleet)
    if same:
        return have, False
    if not opts.force:
        raise SetupError(
            "--fleet",
            f"this device is enrolled as {have.device_id} with {have.server_url or '?'}: "
            "give --force to enroll again",
        )
    return have, True


def enroll_device(opts: SetupOptions, device_id: str, token: str, replace: bool) -> Identity:
    created = not opts.state_dir.exists()
    try:
        make_dirs(opts.state_dir.parent, mode=0o755)
        make_dirs(opts.state_dir, mode=0o750)
    except OSError as exc:
        raise SetupError("--state-dir", f"cannot create {opts.state_dir}: {exc.strerror}") from exc
    try:
        return enroll(
            opts.fleet or "",
            token,
            opts.state_dir,
            device_id,
            trust_dir=trust_dir(BundlesConfig(), opts.state_dir),
            agent_version=_version(),
            replace=replace,
        )
    except EdgefleetError as exc:
        if created:
            shutil.rmtree(opts.state_dir, ignore_errors=True)
        raise SetupError(f"--fleet {opts.fleet}", " ".join(str(exc).split())) from None


def _version() -> str:
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return ""
