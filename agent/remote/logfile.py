"""The agent's own rotating log files, for a device whose log does not go to the journal.

Under systemd the agent's stderr is the journal (``$JOURNAL_STREAM`` names it), and the
journal of its unit is what a logs request reads (:mod:`agent.remote.logread`). Anywhere
else (a container, a shell, a test) each process of ``edge-agent run`` also writes its
own file under ``<state_dir>/logs``: ``supervisor.log``, ``hotpath.log``,
``companion.log`` (``agent.log`` for ``--single-process``), each rotated at
``[logs] max_file_kb`` with ``[logs] backups`` older files kept: one writer per file, so
rotation needs no lock between processes. The file is written on a thread of its own
(a bounded queue in between: a thread that logs never waits on the disk). Every entry
starts with its UTC time
(``2026-11-28T09:15:02.123Z``), the process and the level; the lines of a traceback
follow their entry.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os
import queue
import sys
import time
from pathlib import Path

from agent.remote.config import LogsConfig

log = logging.getLogger(__name__)

JOURNAL_STREAM = "JOURNAL_STREAM"
SUFFIX = ".log"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
ROLES = ("supervisor", "hotpath", "companion", "agent")
QUEUE_BOUND = 10_000
"""Records waiting for the file's thread; past it a record is dropped (counted)."""


def stderr_is_journal(environ: dict[str, str] | None = None, fd: int | None = None) -> bool:
    """Whether stderr is connected to the journal: systemd sets ``$JOURNAL_STREAM`` to
    the ``device:inode`` of the stream it gave the service (inherited by its children)."""
    env = os.environ if environ is None else environ
    value = env.get(JOURNAL_STREAM, "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(sys.stderr.fileno() if fd is None else fd)
    except (OSError, ValueError, AttributeError):
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


def log_dir(cfg: LogsConfig, state_dir: Path) -> Path:
    """The directory of the log files (``[logs] directory``, from the state directory)."""
    return cfg.directory if cfg.directory.is_absolute() else Path(state_dir) / cfg.directory


def writes_files(cfg: LogsConfig) -> bool:
    """Whether the agent writes its rotating files (``[logs] file``, and the journal)."""
    return cfg.file == "always" or (cfg.file == "auto" and not stderr_is_journal())


class UtcFormatter(logging.Formatter):
    """``2026-11-28T09:15:02.123Z <role> LEVEL name: message``."""

    def __init__(self, role: str) -> None:
        super().__init__(f"%(asctime)s.%(msecs)03dZ {role} %(levelname)s %(name)s: %(message)s")
        self.datefmt = TIME_FORMAT
        self.converter = time.gmtime


def install(cfg: LogsConfig, state_dir: Path, role: str) -> Path | None:
    """Add the rotating file of ``role`` to the root logger (unless the log goes to the
    journal, or ``[logs] file = "never"``); the file's path, or None. A directory that
    can't be made is logged and left: the agent runs without its file."""
    if not writes_files(cfg):
        return None
    directory = log_dir(cfg, state_dir)
    path = directory / f"{role}{SUFFIX}"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        handler = logging.handlers.RotatingFileHandler(
            path,
            maxBytes=cfg.max_file_kb * 1024,
            backupCount=cfg.backups,
            encoding="utf-8",
        )
    except OSError as exc:
        log.warning("no log file %s: %s", path, exc.strerror or exc)
        return None
    handler.setFormatter(UtcFormatter(role))
    # the file is written on a thread of its own: a thread that logs (the hot path's
    # too) only puts the record in a bounded queue, and a full queue drops it, counted
    records: queue.Queue[logging.LogRecord] = queue.Queue(QUEUE_BOUND)
    listener = logging.handlers.QueueListener(records, handler, respect_handler_level=True)
    listener.start()
    queued = DroppingQueueHandler(records)
    queued.listener = listener
    atexit.register(queued.stop)
    logging.getLogger().addHandler(queued)
    return path


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """Puts records in a bounded queue without waiting; one that does not fit is
    dropped and counted (:attr:`dropped`), never an error on the thread that logged."""

    dropped = 0
    listener: logging.handlers.QueueListener | None = None
    """The thread that writes the file (:meth:`stop` flushes what is queued)."""

    def stop(self) -> None:
        """Write what is queued and stop the file's thread (once; at exit too)."""
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.stop()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            DroppingQueueHandler.dropped += 1
