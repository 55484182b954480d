"""The device's update client: python-tuf verification of signed bundles, the director's
assignment, and the fetchers the ngclient downloads through (MQTT, local directory).

Nothing here activates a bundle: :meth:`BundleClient.download_bundle` leaves a verified
bundle directory for the installer to stage, switch to and commit.
"""

from agent.update.client import Assignment, BundleClient
from agent.update.errors import (
    BundleRejected,
    DirectiveRefused,
    FetchFailed,
    MetadataRejected,
    RollbackRefused,
    StagingFailed,
    StaleMetadataError,
    TrustRootError,
    UpdateError,
)
from agent.update.fetchers import LocalDirFetcher, MqttFetcher
from agent.update.timefloor import TimeFloor

__all__ = [
    "Assignment",
    "BundleClient",
    "BundleRejected",
    "DirectiveRefused",
    "FetchFailed",
    "LocalDirFetcher",
    "MetadataRejected",
    "MqttFetcher",
    "RollbackRefused",
    "StagingFailed",
    "StaleMetadataError",
    "TimeFloor",
    "TrustRootError",
    "UpdateError",
]
