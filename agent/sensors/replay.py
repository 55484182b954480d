"""A sensor that replays readings from a file (CSV with a header, or JSON lines) at a
fixed rate, optionally looping; bad lines are skipped, counted and logged by line number."""

from __future__ import annotations

import csv
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from agent.capture.backoff import Backoff
from agent.errors import SensorError
from agent.sensors.base import SensorSource
from agent.sensors.config import SensorConfig
from agent.sensors.parse import BadReading, Reading, parse_csv_row, parse_payload

logger = logging.getLogger(__name__)

_RETRY_INITIAL_S = 1.0
_RETRY_MAX_S = 30.0

Line = tuple[int, Reading | BadReading]


class ReplaySensor(SensorSource):
    """Replays ``config.path`` at ``config.rate_hz`` readings per second in a thread."""

    def __init__(self, config: SensorConfig) -> None:
        super().__init__(config)
        self.path = Path(config.path)
        self._csv = self.path.suffix.lower() == ".csv"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    def start(self) -> None:
        """Check the file and start replaying.

        Raises:
            SensorError: the file does not exist, can't be read, or (CSV) its header
                lacks a configured field; or the sensor is already running.
        """
        if self._thread is not None and self._thread.is_alive():
            raise SensorError(self.name, "already started")
        self._check_file()
        self._stop.clear()
        self._slot.reopen()
        self._thread = threading.Thread(target=self._run, name=f"sensor-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._slot.close()
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, timeout_s))
            if thread.is_alive():
                logger.warning(
                    "sensor %s: replay thread did not end in %.1f s", self.name, timeout_s
                )
        self._set_up(False, "stopped", failure=False)

    def _check_file(self) -> None:
        if not self.path.is_file():
            raise SensorError(self.name, f"replay file {self.path} does not exist")
        try:
            with self._open() as f:
                if self._csv:
                    self._header(csv.reader(f))
        except OSError as e:
            raise SensorError(self.name, f"can't read replay file {self.path}: {e}") from e

    def _open(self) -> TextIO:
        return self.path.open(encoding="utf-8", errors="replace", newline="")

    def _header(self, reader: Iterator[list[str]]) -> tuple[list[int], int]:
        try:
            names = [h.strip() for h in next(reader)]
        except StopIteration:
            raise SensorError(self.name, f"replay file {self.path} has no CSV header") from None
        except csv.Error as e:
            raise SensorError(self.name, f"replay file {self.path}: bad CSV header: {e}") from e
        for field in self.config.fields:
            if field not in names:
                raise SensorError(
                    self.name,
                    f"replay file {self.path}: no column {field!r} in the header {names}",
                )
        return [names.index(f) for f in self.config.fields], len(names)

    def _lines(self, f: TextIO) -> Iterator[Line]:
        """(line number, reading or why not) for every non-blank line after any header."""
        fields = self.config.fields
        if not self._csv:
            for lineno, text in enumerate(f, 1):
                if text.strip():
                    try:
                        yield lineno, parse_payload(text, fields, self.name)
                    except BadReading as e:
                        yield lineno, e
            return
        reader = csv.reader(f)
        columns, width = self._header(reader)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield reader.line_num, BadReading(self.name, f"malformed CSV: {e}")
                continue
            if row:
                try:
                    yield reader.line_num, parse_csv_row(row, columns, width, fields, self.name)
                except BadReading as e:
                    yield reader.line_num, e

    def _run(self) -> None:
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S)
        while not self._stop.is_set():
            try:
                delivered = self._replay_once(backoff)
            except SensorError as e:
                self._retry(e.reason, backoff)
                continue
            except OSError as e:
                self._retry(f"can't read replay file {self.path}: {e}", backoff)
                continue
            except Exception as e:  # a bug must not end the sensor silently
                logger.exception("sensor %s: unexpected error in replay", self.name)
                self._retry(f"{type(e).__name__}: {e}", backoff)
                continue
            if self._stop.is_set():
                return
            self.passes += 1
            if not self.config.loop:
                self._set_up(False, f"end of replay file {self.path}", failure=False)
                return
            self._reset_window()  # the end joined to the start is no time series
            if delivered == 0:
                self._retry(f"no valid reading in replay file {self.path}", backoff)

    def _retry(self, reason: str, backoff: Backoff) -> None:
        delay = backoff.next()
        self._count_error(reason)
        logger.warning("sensor %s: %s; retrying in %.1f s", self.name, reason, delay)
        self._set_up(False, reason)
        self._stop.wait(delay)

    def _replay_once(self, backoff: Backoff) -> int:
        """One pass over the file, paced; the number of readings delivered."""
        period_ns = int(1e9 / self.config.rate_hz)
        next_ns = time.perf_counter_ns()
        delivered = 0
        with self._open() as f:
            for lineno, item in self._lines(f):
                if self._stop.is_set():
                    break
                if isinstance(item, BadReading):
                    self._reject(f"{self.path} line {lineno}", item.reason)
                    continue
                now = time.perf_counter_ns()
                if next_ns > now:
                    if self._stop.wait((next_ns - now) / 1e9):
                        break
                elif next_ns < now - period_ns:
                    next_ns = now  # fell behind: no burst to catch up
                self._deliver(item, time.perf_counter_ns(), time.time())
                next_ns += period_ns
                delivered += 1
                if delivered == 1:
                    backoff.reset()
                    self._set_up(True, f"replaying {self.path}")
        return delivered
