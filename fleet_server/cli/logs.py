"""Logging for the fleet's command lines: one format, and no lines from imports.

``fleetctl`` and ``fleet-server`` start light: a command imports its libraries when it
runs, after logging is set up. A library that logs as it is imported would then be heard
where it never was (when everything was imported first, before logging was set up, such
lines went nowhere): alembic logs each of its plugins at INFO ("setup plugin ...") as it
is first imported. Its plugin logger is held at WARNING; it logs nothing else a command
would show (the rest is autogenerate, which no command runs).
"""

from __future__ import annotations

import logging

FORMAT = "%(levelname)s %(name)s: %(message)s"
QUIET_ON_IMPORT = ("alembic.runtime.plugins",)
"""Loggers that speak only as their library is imported."""


def configure(level: int) -> None:
    """Log to stderr at ``level`` in :data:`FORMAT`, without :data:`QUIET_ON_IMPORT`'s
    import-time lines."""
    logging.basicConfig(level=level, format=FORMAT)
    for name in QUIET_ON_IMPORT:
        logging.getLogger(name).setLevel(logging.WARNING)
