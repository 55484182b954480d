"""Fixtures the uplink tests share (see uplink_fixtures.py): a module's own fixture of
the same name (test_identity.py's ``broker`` ...) still wins for that module."""

from tests.agent.uplink.uplink_fixtures import (  # noqa: F401 - fixtures, found by name
    broker,
    enrolled,
    fleet,
    pki,
    server,
    uplinks,
)
