"""What the parsers of ``fleetctl`` and ``fleet-server`` show before a command runs: the
default config path and the values argparse offers as choices.

Each is a copy of the library's own name, which tests/fleet_server/test_cli_light.py
checks is equal. The copies are here because the modules that define them import
pydantic, SQLAlchemy, TUF or cryptography (over a second of CPU in all), and building the
parser happens on every start: ``fleetctl devices list`` or any ``--help`` would pay for
libraries only other commands use. A command imports what it needs when it runs.
"""

from __future__ import annotations

DEFAULT_CONFIG = "/etc/edgefleet/fleet.toml"
"""``fleet_server.config.DEFAULT_CONFIG``."""

PASSPHRASE_NAME = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 (the name of a secret, not one)
"""``fleet_server.repository.keys.DEFAULT_PASSPHRASE_NAME``."""

KEY_ROLES = ("root", "targets", "snapshot", "timestamp", "director")
"""``fleet_server.repository.keys.ROLES``: the roles that sign the repository."""

USER_ROLES = ("operator", "line-manager", "viewer")
"""``fleet_server.auth.roles.ROLES``: the roles of the console's and API's users."""

POSTPROCESS_KINDS = ("classification", "score", "detection")
"""``agent.wire.postprocess.POSTPROCESS_KINDS``."""
