"""Side-loading from removable media on an offline line: the same python-tuf checks as
over the network, with a directory as the transport.

A side-load directory holds a copy of the fleet's repository (``metadata/``,
``targets/``) and the directive for this device in ``directives/<device_id>.json``
(``fleetctl directive issue --out``).
"""

from __future__ import annotations

from pathlib import Path

from agent.config import AgentConfig
from agent.directives.link import Report, apply_directive, make_client
from agent.errors import AgentError
from agent.installer import Installer
from agent.kernel.readlimit import read_at_most
from agent.update.directive import MAX_DIRECTIVE_BYTES
from agent.update.fetchers import LocalDirFetcher
from runtime import PoolConfig
from runtime.profiles import load_profile


def directive_file(medium: Path, device_id: str) -> Path:
    """The directive for ``device_id`` on the medium.

    Raises:
        AgentError: the directory is not a side-load directory, or holds no directive for
            this device.
    """
    if not (medium / "metadata").is_dir() or not (medium / "targets").is_dir():
        raise AgentError(
            f"{medium}: not a signed side-load directory (needs metadata/, targets/ and "
            f"directives/{device_id}.json); unsigned bundles are never installed"
        )
    path = medium / "directives" / f"{device_id}.json"
    if not path.is_file():
        raise AgentError(f"{medium}: no directive for device '{device_id}' ({path})")
    return path


def sideload(medium: Path, cfg: AgentConfig) -> Report:
    """Verify and install the bundle the medium's directive assigns to this device; the
    health window runs the bundle in the installer's own trial pool.

    Raises:
        AgentError: not a side-load directory, no directive for this device, or a
            directive that can't be read or is over ``MAX_DIRECTIVE_BYTES`` (refused after
            reading one byte past the limit, never read whole).
    """
    device_id = cfg.agent.device_id
    path = directive_file(medium, device_id)
    try:
        directive = read_at_most(path, MAX_DIRECTIVE_BYTES, "directive")
    except OSError as exc:
        raise AgentError(f"{path}: cannot read the directive: {exc.strerror or exc}") from None
    profile = load_profile(cfg.agent.profile)
    installer = Installer(
        cfg.agent.state_dir,
        profile_name=profile.name,
        config=cfg.bundles.installer,
        pool_config=PoolConfig.from_profile(profile, workers=1, pin=False),
    )
    client = make_client(
        cfg.bundles,
        cfg.agent.state_dir,
        LocalDirFetcher(medium),
        device_id=device_id,
        hw=cfg.bundles.hardware_class or profile.name,
    )
    return apply_directive(
        client,
        installer,
        directive,
        staging_root=cfg.agent.state_dir / "staging",
        source=f"side-load:{medium}",
    )
