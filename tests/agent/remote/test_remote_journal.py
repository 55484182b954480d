"""The agent's log under systemd is the journal of its unit, read with the real
``journalctl``: journal files written by systemd's own ``systemd-journal-remote`` (from
the journal export format) stand for the system's journal, and the agent is pointed at
them with ``[remote] journal_directory``."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.remote.logread import JournalSource, LogQuery
from tests.agent.remote.remote_support import Fleet, make_agent, make_fleet

JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")  # make sysdeps
UNIT = "edgefleet-agent.service"
BOOTED = 1_700_000_000_000_000
"""Microseconds: the made-up boot's time, so that monotonic times follow real ones (the
journal orders one boot's entries by them)."""


def write_journal(path: Path, entries: list[tuple[float, str, str]]) -> None:
    """A journal file at ``path`` holding ``(time, unit, message)`` entries."""
    if not JOURNAL_REMOTE.is_file():
        pytest.fail(f"{JOURNAL_REMOTE} is missing: run `make sysdeps` (systemd-journal-remote)")
    export = "".join(
        f"__REALTIME_TIMESTAMP={int(ts * 1e6)}\n__MONOTONIC_TIMESTAMP={int(ts * 1e6) - BOOTED}\n"
        f"_BOOT_ID=0123456789abcdef0123456789abcdef\n_SYSTEMD_UNIT={unit}\n"
        f"SYSLOG_IDENTIFIER=edge-agent\n_PID=4242\nMESSAGE={msg}\n\n"
        for ts, unit, msg in entries
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(JOURNAL_REMOTE), f"--output={path}", "-"],
        input=export.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_journal_of_the_unit_is_read_newest_last_filtered_and_followed(tmp_path: Path) -> None:
    now = time.time()
    write_journal(
        tmp_path / "j" / "a.journal",
        [(now - 50, UNIT, "old start"), (now - 30, UNIT, "camera c1 open"),
         (now - 20, "sshd.service", "not ours"), (now - 10, UNIT, "camera c1 lost"),
         (now - 5, UNIT, "decision log ok")],
    )  # fmt: skip
    src = JournalSource(UNIT, tmp_path / "j")

    def msgs(query: LogQuery) -> list[str]:
        return [e.text.partition("edge-agent[4242]: ")[2] for e in src.tail(query)]

    assert msgs(LogQuery(now - 40, 10)) == ["camera c1 open", "camera c1 lost", "decision log ok"]
    assert msgs(LogQuery(0, 2)) == ["camera c1 lost", "decision log ok"]
    assert msgs(LogQuery(0, 10, grep="camera")) == ["camera c1 open", "camera c1 lost"]
    write_journal(tmp_path / "j" / "b.journal", [(now + 1, UNIT, "written after")])
    assert [e.text.partition("]: ")[2] for e in src.follow(LogQuery(0, 10))] == ["written after"]
    assert src.follow(LogQuery(0, 10)) == []


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    fleet, files = make_fleet(tmp_path / "fleet")
    yield fleet
    fleet.stop()
    files.stop()
    fleet.broker.stop()


def test_an_agent_whose_log_is_the_journal_sends_its_units_lines_redacted(
    fleet: Fleet, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    now = time.time()
    write_journal(
        journal / "system.journal",
        [(now - 3, UNIT, "uplink: connect mqtts://cam-3:S3cretPw@fleet:8883 refused"),
         (now - 2, "other.service", "another unit's line"),
         (now - 1, UNIT, "installer: token=abc123def committed")],
    )  # fmt: skip
    agent = make_agent(
        fleet, tmp_path / "cam-3", "cam-3",
        f'[remote]\njournal_directory = "{journal}"\njournal_unit = "{UNIT}"\n',
    ).start()  # fmt: skip
    try:
        rid = fleet.request("cam-3", "logs", {"lines": 10})
        answer = fleet.final(rid)
    finally:
        agent.stop()
    assert answer["status"] == "ok", answer
    assert answer["detail"]["source"] == "journal"
    text = fleet.data_of(rid).decode()
    assert "uplink: connect mqtts://cam-3:***@fleet:8883 refused" in text
    assert "installer: token=*** committed" in text
    assert "another unit's line" not in text
    assert "S3cretPw" not in text
    assert "abc123def" not in text
