"""Errors of the update client: each names the step that failed and why.

The installer reports ``step`` and ``reason`` as they are; the step names are the
constants below.
"""

from __future__ import annotations

from agent.errors import AgentError

STEP_TRUST_ROOT = "trust-root"
STEP_REFRESH = "refresh"
STEP_DIRECTIVE = "directive"
STEP_FETCH = "fetch"
STEP_VERIFY = "verify"
STEP_STAGE = "stage"


class UpdateError(AgentError):
    """An update step failed; nothing it fetched was activated.

    Attributes:
        step: the step that failed (one of the ``STEP_*`` constants).
        reason: what failed.
    """

    def __init__(self, step: str, reason: str) -> None:
        self.step = step
        self.reason = reason
        super().__init__(f"update {step}: {reason}")


class TrustRootError(UpdateError):
    """The device's trusted root metadata is missing, corrupt or not signed by itself.

    Nothing is fetched while it is so; the trusted root is never deleted by the client.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_TRUST_ROOT, reason)


class StaleMetadataError(UpdateError):
    """The metadata is expired at the device's effective time: a freeze attack, a
    repository that stopped re-signing, or a clock far ahead. The device keeps running
    what it has and reports itself stale.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_REFRESH, reason)


class MetadataRejected(UpdateError):
    """Repository metadata failed verification (signatures, threshold, versions,
    hashes, lengths) or could not be fetched during a refresh.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_REFRESH, reason)


class DirectiveRefused(UpdateError):
    """A directive is not signed by the director, not for this device or hardware class,
    expired, replayed, or names a target the repository does not sign as named.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_DIRECTIVE, reason)


class RollbackRefused(DirectiveRefused):
    """A directive names a release lower than the one installed, or a counter not higher
    than the highest applied one.
    """


class FetchFailed(UpdateError):
    """A target could not be downloaded: missing, cut off, longer than signed, or its
    bytes do not match the signed hashes.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_FETCH, reason)


class BundleRejected(UpdateError):
    """The verified files do not make one bundle of the assigned release: a file missing
    from the repository, files of another release (mix and match), or a manifest that
    does not match what was assigned.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_VERIFY, reason)


class StagingFailed(UpdateError):
    """The bundle could not be written into the staging directory (disk full, I/O)."""

    def __init__(self, reason: str) -> None:
        super().__init__(STEP_STAGE, reason)
