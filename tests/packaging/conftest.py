"""Fixtures of the package tests (make package-test; they need root, make test leaves them
out): the .debs (debs.py), the OCI archives made from them (image_fixtures.py); each test
module boots its own Debian bookworm with the packages' declared dependencies only."""

from tests.packaging.debs import _can_boot, debs  # noqa: F401 - fixtures, found by name
from tests.packaging.image_fixtures import archives, image  # noqa: F401
