"""The HIL harness's error root and its data-carrying subclasses.

Library code raises these; ``hil`` turns them into a one-line message and exit code 2.
An invariant that does not hold is not an error: it is a failed check in the report.
"""

from __future__ import annotations


class HilError(Exception):
    """Root of every error the harness raises on purpose."""


class CommandFailed(HilError):
    """A command the harness ran (ip, tc, nft, mount, ssh ...) failed.

    Attributes:
        argv: the command.
        returncode: its exit status (None when it did not run or timed out).
        output: what it printed (stderr, else stdout), stripped.
    """

    def __init__(self, argv: list[str], returncode: int | None, output: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.output = output.strip()
        status = "timed out" if returncode is None else f"exit {returncode}"
        said = f": {self.output}" if self.output else ""
        super().__init__(f"`{' '.join(argv)}` failed ({status}){said}")


class DeviceError(HilError):
    """A device under test can't be set up, started or reached.

    Attributes:
        device: the device id.
        reason: what failed.
    """

    def __init__(self, device: str, reason: str) -> None:
        self.device = device
        self.reason = reason
        super().__init__(f"device {device}: {reason}")


class FaultUnavailable(HilError):
    """A fault injector can't work on this device or machine (no sch_netem, no
    libfaketime ...).

    Attributes:
        fault: the injector's name.
        reason: why it is unavailable.
    """

    def __init__(self, fault: str, reason: str) -> None:
        self.fault = fault
        self.reason = reason
        super().__init__(f"fault {fault} unavailable: {reason}")


class FleetSetupError(HilError):
    """The fleet under test (fleet-server, repository, enrollment) can't be set up.

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"fleet: {reason}")


class UsageError(HilError):
    """Bad input to the harness: an unknown scenario, a malformed device URL.

    Attributes:
        what: the argument at fault.
        reason: what is wrong with it.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")
