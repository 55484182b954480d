"""The fleet server's error root and its data-carrying subclasses.

Library code raises these; ``fleetctl`` turns them into a one-line message and exit code 2.
"""

from __future__ import annotations

from agent.kernel.errors import EdgefleetError


class FleetError(EdgefleetError):
    """Root of every error the fleet server raises on purpose."""


class KeystoreError(FleetError):
    """A keystore, a key file or a passphrase is missing, unreadable or wrong.

    Attributes:
        path: the keystore directory or key file.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"keystore {path}: {reason}")


class PassphraseError(KeystoreError):
    """No usable passphrase for a role's keys.

    Attributes:
        role: the role whose keys need it.
        names: the variable / credential names looked up, most specific first.
    """

    def __init__(self, path: str, role: str, names: tuple[str, ...], reason: str) -> None:
        self.role = role
        self.names = names
        super().__init__(path, reason)


class RepoError(FleetError):
    """The bundle repository is missing, corrupt, or an operation on it can't be done.

    Attributes:
        path: the repository directory (or the file at fault).
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"repository {path}: {reason}")


class ReleaseNotNewer(RepoError):
    """Publishing a release number that is not above every one already published.

    Attributes:
        bundle: the bundle name.
        release: the release number offered.
        highest: the highest release already published under that name.
    """

    def __init__(self, path: str, bundle: str, release: int, highest: int) -> None:
        self.bundle = bundle
        self.release = release
        self.highest = highest
        super().__init__(
            path,
            f"bundle '{bundle}' release {release} is not newer than the published "
            f"release {highest}; raise manifest.release (fleetctl bundle build --release)",
        )


class BundleMismatch(RepoError):
    """A bundle directory does not match what the repository signed.

    Attributes:
        bundle_dir: the bundle directory checked.
        file: the file at fault, relative to the bundle ("" for the bundle as a whole).
    """

    def __init__(self, path: str, bundle_dir: str, file: str, reason: str) -> None:
        self.bundle_dir = bundle_dir
        self.file = file
        where = f"{bundle_dir}/{file}" if file else bundle_dir
        super().__init__(path, f"{where}: {reason}")


class DirectiveError(FleetError):
    """A directive can't be issued.

    Attributes:
        device_id: the device it was for.
        reason: what is wrong.
    """

    def __init__(self, device_id: str, reason: str) -> None:
        self.device_id = device_id
        self.reason = reason
        super().__init__(f"directive for device '{device_id}': {reason}")
