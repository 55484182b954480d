"""``edge-agent enroll``: trade a one-time token for this device's fleet identity.

Example::

    edge-agent enroll https://fleet.example.com:8443 --token - --config /etc/edgefleet/agent.toml

The token is read from standard input when given as ``-`` (it stays out of the process
list and the shell history).
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from agent.config import load_config
from agent.directives.link import trust_dir
from agent.enrollment.identity import IDENTITY_DIR, enroll
from agent.kernel.errors import EdgefleetError
from agent.uplink.config import UplinkConfig

EXIT_ERROR = 2
_MAX_TOKEN = 4096
FROM_STDIN = "-"


def _agent_version() -> str:
    try:
        return metadata.version("edgefleet")
    except metadata.PackageNotFoundError:
        return ""


def _read_token(token: str) -> str:
    if token != FROM_STDIN:
        return token
    return sys.stdin.readline(_MAX_TOKEN).strip()


def cmd_enroll(server_url: str, token: str, config_path: str, *, replace: bool = False) -> int:
    """Enroll the device of ``config_path`` with the fleet server at ``server_url``: the
    identity goes to the uplink's identity directory, the TUF trust root to the fleet
    trust directory. Prints one line; 0 on success, 2 on any error."""
    try:
        cfg = load_config(Path(config_path))
        state_dir = cfg.agent.state_dir
        uplink = getattr(cfg, "uplink", None)
        identity_dir = uplink.identity_dir if isinstance(uplink, UplinkConfig) else IDENTITY_DIR
        identity = enroll(
            server_url,
            _read_token(token),
            state_dir,
            cfg.agent.device_id,
            trust_dir=trust_dir(cfg.bundles, state_dir),
            identity_dir=identity_dir,
            agent_version=_agent_version(),
            replace=replace,
        )
        cert = identity.check()
    except EdgefleetError as exc:
        print(f"edge-agent: enroll: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(
        f"enrolled {identity.device_id}: certificate valid until "
        f"{cert.not_valid_after_utc:%Y-%m-%d}, broker {identity.broker_host}:"
        f"{identity.broker_port}, identity in {identity.directory}"
    )
    return 0
