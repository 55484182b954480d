"""Reading the agent's log for a logs request: the journal of its unit under systemd
(``journalctl -o json``), its own rotating files otherwise (:mod:`agent.remote.logfile`).

A :class:`LogQuery` says from when (``since``), which entries (``grep``: a substring,
case-insensitive unless it holds a capital, as ``journalctl --grep`` does) and how many
(the newest ``lines``). :meth:`LogSource.tail` answers it; :meth:`LogSource.follow`
gives what was written since the last answer (for ``--follow``). Every read is bounded:
a file source reads at most its files (``3 x (backups + 1) x max_file_kb``); the journal
source stops ``journalctl`` once it has enough entries, and after :data:`JOURNAL_TIMEOUT_S`.
"""

from __future__ import annotations

import calendar
import collections
import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.remote.config import LogsConfig, RemoteConfig
from agent.remote.logfile import ROLES, SUFFIX, TIME_FORMAT, log_dir, stderr_is_journal

log = logging.getLogger(__name__)

JOURNAL_TIMEOUT_S = 30.0
MAX_ENTRY_CHARS = 16 * 1024
"""An entry longer than this is cut (a log line is not a file)."""
_TS_CHARS = len("2026-11-28T09:15:02.123Z")


@dataclass(frozen=True)
class LogQuery:
    """Which entries: at or after ``since`` (Unix s), holding ``grep``, the newest ``lines``."""

    since: float
    lines: int
    grep: str = ""

    def matches(self, text: str) -> bool:
        if not self.grep:
            return True
        if self.grep.islower() or not any(c.isupper() for c in self.grep):
            return self.grep.lower() in text.lower()
        return self.grep in text


@dataclass(frozen=True)
class Entry:
    """One log entry: its time (Unix s) and its text (one line, or a traceback's lines)."""

    ts: float
    text: str


class LogSource(Protocol):
    """Where the agent's log is."""

    name: str
    """``journal`` or ``file``."""

    def tail(self, query: LogQuery) -> list[Entry]:
        """The newest ``query.lines`` entries matching, oldest first."""
        ...

    def follow(self, query: LogQuery) -> list[Entry]:
        """Entries written since the last :meth:`tail` or :meth:`follow` that match."""
        ...


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ENTRY_CHARS else f"{text[:MAX_ENTRY_CHARS]}... (cut)"


def parse_stamp(line: str) -> float | None:
    """The Unix time an entry's line starts with (``2026-11-28T09:15:02.123Z``), or None
    for a line that continues the entry before it."""
    if len(line) < _TS_CHARS or line[_TS_CHARS - 1] != "Z" or line[10] != "T":
        return None
    try:
        parsed = time.strptime(line[:19], TIME_FORMAT)
        millis = int(line[20:23])
    except ValueError:
        return None
    return calendar.timegm(parsed) + millis / 1000.0


def _entries(path: Path, offset: int = 0) -> Iterator[Entry]:
    """The entries of one file from ``offset`` (a continuation line with no entry
    before it stands on its own, dated like the first entry after it is unknown: 0)."""
    try:
        f = path.open("r", encoding="utf-8", errors="replace")
    except OSError:
        return
    with f:
        if offset:
            f.seek(offset)
        ts: float | None = None
        lines: list[str] = []
        for raw in f:
            line = raw.rstrip("\n")
            stamp = parse_stamp(line)
            if stamp is None and lines:
                if sum(len(x) for x in lines) < MAX_ENTRY_CHARS:
                    lines.append(line)
                continue
            if lines:
                yield Entry(ts or 0.0, _cut("\n".join(lines)))
            ts, lines = stamp, [line]
        if lines:
            yield Entry(ts or 0.0, _cut("\n".join(lines)))


@dataclass
class FileSource:
    """The rotating files of every process (``<role>.log`` and ``<role>.log.<n>``)."""

    directory: Path
    name: str = "file"
    _offsets: dict[str, tuple[int, int]] = field(default_factory=dict)

    def _files(self, role: str) -> list[Path]:
        """Oldest first: ``role.log.<n>`` down to ``role.log.1``, then ``role.log``."""
        base = self.directory / f"{role}{SUFFIX}"
        backups = []
        for p in self.directory.glob(f"{role}{SUFFIX}.*"):
            suffix = p.name.rsplit(".", 1)[1]
            if suffix.isdigit():
                backups.append((int(suffix), p))
        return [p for _, p in sorted(backups, reverse=True)] + [base]

    def tail(self, query: LogQuery) -> list[Entry]:
        merged: list[Entry] = []
        for role in ROLES:
            kept: collections.deque[Entry] = collections.deque(maxlen=query.lines)
            for path in self._files(role):
                for e in _entries(path):
                    if e.ts >= query.since and query.matches(e.text):
                        kept.append(e)
            merged += kept
            self._mark(role)
        merged.sort(key=lambda e: e.ts)
        return merged[-query.lines :] if query.lines else []

    def _mark(self, role: str) -> None:
        path = self.directory / f"{role}{SUFFIX}"
        try:
            info = path.stat()
        except OSError:
            self._offsets.pop(role, None)
            return
        self._offsets[role] = (info.st_ino, info.st_size)

    def follow(self, query: LogQuery) -> list[Entry]:
        out: list[Entry] = []
        for role in ROLES:
            path = self.directory / f"{role}{SUFFIX}"
            try:
                info = path.stat()
            except OSError:
                continue
            inode, offset = self._offsets.get(role, (info.st_ino, 0))
            if inode != info.st_ino or info.st_size < offset:
                offset = 0  # rotated: the new file from its start
            out += [e for e in _entries(path, offset) if query.matches(e.text)]
            self._offsets[role] = (info.st_ino, info.st_size)
        out.sort(key=lambda e: e.ts)
        return out[-query.lines :]


def _message(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def journal_entry(raw: dict[str, Any]) -> Entry | None:
    """A ``journalctl -o json`` record as an entry (None: no time)."""
    try:
        ts = int(raw["__REALTIME_TIMESTAMP"]) / 1e6
    except (KeyError, ValueError, TypeError):
        return None
    stamp = time.strftime(TIME_FORMAT, time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"
    who = _message(raw.get("SYSLOG_IDENTIFIER") or raw.get("_COMM") or "?")
    pid = _message(raw.get("_PID") or "")
    text = f"{stamp} {who}{f'[{pid}]' if pid else ''}: {_message(raw.get('MESSAGE'))}"
    return Entry(ts, _cut(text))


def unit_of_this_process(cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """The systemd unit this process runs in (``edgefleet-agent.service``), from its
    cgroup; None outside a service's cgroup."""
    try:
        text = cgroup.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        for part in reversed(line.rpartition(":")[2].split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


@dataclass
class JournalSource:
    """The journal of the agent's unit, read with ``journalctl -o json``."""

    unit: str | None
    directory: Path | None = None
    name: str = "journal"
    binary: str = "journalctl"
    _cursor: str | None = None

    def _argv(self, *extra: str) -> list[str]:
        argv = [self.binary, "--output=json", "--no-pager", *extra]  # no --quiet: its hints
        if self.directory is not None:
            argv.append(f"--directory={self.directory}")
        if self.unit:
            argv.append(f"--unit={self.unit}")
        return argv

    def _read(self, argv: list[str], query: LogQuery, limit: int) -> tuple[list[Entry], str]:
        """Matching entries in journalctl's order, at most ``limit``, and the cursor of
        the last entry read (matching or not; "" when none)."""
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
            )
        except OSError as exc:
            raise LogReadError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        timer = threading.Timer(JOURNAL_TIMEOUT_S, proc.kill)
        timer.start()
        out: list[Entry] = []
        cursor = ""
        try:
            assert proc.stdout is not None  # noqa: S101
            for line in proc.stdout:
                try:
                    raw = json.loads(line[: 4 * MAX_ENTRY_CHARS])
                except ValueError:
                    continue
                if not isinstance(raw, dict):
                    continue
                cursor = str(raw.get("__CURSOR", "")) or cursor
                entry = journal_entry(raw)
                if entry is None or entry.ts < query.since or not query.matches(entry.text):
                    continue
                out.append(entry)
                if len(out) >= limit:
                    break
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -9) and not out:
            raise LogReadError(f"journalctl exited {proc.returncode}: {err.strip()[:300]}")
        if not cursor and ("not seeing messages" in err or "No journal files" in err):
            # no entry at all, and journalctl says why: not a member of systemd-journal
            raise LogReadError(f"journalctl: {' '.join(err.split())[:300]}")
        return out, cursor

    def tail(self, query: LogQuery) -> list[Entry]:
        newest, cursor = self._read(self._argv("--reverse", "--lines=1"), LogQuery(0.0, 1), 1)
        self._cursor = cursor or self._cursor  # follow goes on after the newest entry
        if not newest or newest[0].ts < query.since:
            return []
        since = f"--since=@{max(0, int(query.since))}"
        found, _ = self._read(self._argv(since, "--reverse"), query, query.lines)
        return list(reversed(found))

    def follow(self, query: LogQuery) -> list[Entry]:
        extra = [f"--after-cursor={self._cursor}"] if self._cursor else ["--lines=0"]
        found, cursor = self._read(
            self._argv(*extra), LogQuery(0.0, query.lines, query.grep), 100_000
        )
        self._cursor = cursor or self._cursor
        return found[-query.lines :]


class LogReadError(Exception):
    """The log could not be read (journalctl missing or failing)."""


def source_for(remote: RemoteConfig, logs: LogsConfig, state_dir: Path) -> LogSource:
    """Where this agent's log is: the journal (``[remote] journal_directory``, or this
    process's unit when its stderr is the journal), else its rotating files."""
    binary = shutil.which("journalctl") or "journalctl"
    if remote.journal_directory is not None:
        return JournalSource(remote.journal_unit, remote.journal_directory, binary=binary)
    if stderr_is_journal() and logs.file != "always":
        return JournalSource(remote.journal_unit or unit_of_this_process(), binary=binary)
    return FileSource(log_dir(logs, state_dir))


__all__ = [
    "Entry",
    "FileSource",
    "JournalSource",
    "LogQuery",
    "LogReadError",
    "LogSource",
    "journal_entry",
    "parse_stamp",
    "source_for",
    "unit_of_this_process",
]
