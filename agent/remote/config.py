"""The ``[remote]`` section (the fleet's remote actions: logs, restart, reload,
diagnostics) and the ``[logs]`` section (the agent's own rotating log files)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from agent.kernel.configbase import Section
from agent.wire.actions import MAX_FOLLOW_S, MAX_LINES


class RemoteConfig(Section):
    """Remote actions the fleet signs (docs/device-logs-and-actions.md)."""

    enabled: bool = Field(
        True,
        description="Answer the fleet's signed action requests (needs the fleet's trust root "
        "and a fleet session: an enrolled device, or [bundles] enabled with its broker).",
    )
    max_lines: int = Field(
        2000,
        ge=1,
        le=MAX_LINES,
        description="Most log lines one request sends (its own limit can only be lower).",
    )
    max_bytes_kb: int = Field(
        1024,
        ge=16,
        le=64 * 1024,
        description="Most KiB one request sends (log lines, or "
        "the diagnostics archive); what is over it is left out and said so.",
    )
    chunk_kb: int = Field(32, ge=1, le=64, description="KiB of data in one chunk message.")
    rate_kb_s: float = Field(
        64.0,
        gt=0,
        le=100_000,
        description="KiB per second the uploads of remote actions "
        "may take of the device's link, at most (a token bucket of one chunk).",
    )
    max_follow_s: int = Field(
        MAX_FOLLOW_S,
        ge=0,
        le=MAX_FOLLOW_S,
        description="Longest a logs request may follow new lines (0: no following).",
    )
    queue: int = Field(
        4,
        ge=1,
        le=64,
        description="Requests waiting while one is carried out; a request "
        "over it is refused as busy.",
    )
    journal_unit: str | None = Field(
        None,
        max_length=256,
        description="The systemd unit whose journal is read under "
        "systemd (default: the unit this process runs in, from /proc/self/cgroup).",
    )
    journal_directory: Path | None = Field(
        None,
        description="Read the journal from this directory (journalctl --directory) "
        "instead of the system's: a journal copied off a device, or a test's.",
    )


class LogsConfig(Section):
    """The agent's log: the journal under systemd, else rotating files of its own."""

    file: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Write the rotating log files: auto = unless the log goes to the "
        "journal (systemd's $JOURNAL_STREAM), always, or never.",
    )
    directory: Path = Field(
        Path("logs"), description="Where the files are; relative to the state directory."
    )
    max_file_kb: int = Field(
        2048, ge=16, le=1024 * 1024, description="KiB of one file before it is rotated."
    )
    backups: int = Field(
        2,
        ge=0,
        le=100,
        description="Rotated files kept per process (supervisor, hot path, "
        "companion): the files take at most 3 x (backups + 1) x max_file_kb.",
    )
