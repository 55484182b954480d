"""One decision as the hot path hands it to the log, and its time-ordered id."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_MS_LIMIT = 1 << 48
_SEQ_MASK = 0xFFF
_RAND_MASK = (1 << 62) - 1
_VARIANT = 1 << 63
_LOW48 = (1 << 48) - 1
_CLAMP_MS = 10


@dataclass
class DecisionRecord:
    """What was decided, from what, by which model, how fast.

    ``append()`` takes ownership: it fills ``id`` when empty and may drop ``thumbnail``
    (an HxWx3 uint8 BGR image the caller no longer writes to) when it is not kept, as a
    JPEG or for the drift input statistics.
    ``latencies_ms`` maps stage names to milliseconds; its "e2e" entry, or else
    ``decision_time - capture_time``, fills the ``e2e_ms`` column.
    """

    capture_time: float
    decision_time: float
    source: str
    line: str
    model_name: str
    model_version: str
    bundle_digest: str
    backend: str
    config_hash: str
    input_digest: str
    outputs: dict[str, Any]
    outcome: str
    thresholds: dict[str, Any]
    latencies_ms: dict[str, float]
    thumbnail: npt.NDArray[np.uint8] | None = None
    id: str = ""
    station: str = ""
    """The station whose trigger this decision answers ("" for a free-running pipeline)."""
    part_id: str = ""
    """The part id the PLC gave with the trigger ("" when none)."""
    deadline_missed: bool = False
    """The station's deadline passed before this decision: the fail-safe result was
    written to the PLC instead of this decision's."""
    frame_only: bool = False
    """Set by ``append()``: ``thumbnail`` is kept for the drift input statistics only
    (:mod:`agent.drift`), not as a JPEG."""


class _IdClock:
    """The last millisecond handed out and the counter within it (RFC 9562 method 1)."""

    def __init__(self) -> None:
        self.last_ms = -1
        self.seq = 0


_clock = _IdClock()
_clock_lock = threading.Lock()


def new_id(t: float | None = None) -> str:
    """A UUIDv7 string for unix time ``t`` (now by default); strings sort by time.

    Ids made one after another for the same millisecond sort in the order they were made
    (a 12-bit counter that starts at a random value); a time up to 10 ms behind the
    previous id's is counted on from that id's millisecond, so ids made in a row keep
    their order. 62 random bits keep ids from other processes apart. Not for secrets:
    the bits come from ``random`` (reseeded on fork).

    Raises:
        ValueError: ``t`` is negative or past the year 10889.
    """
    ms = int((time.time() if t is None else t) * 1000)
    if not 0 <= ms < _MS_LIMIT:
        raise ValueError(f"time {t!r} is outside what a UUIDv7 can hold")
    rand = random.getrandbits(64)
    clock = _clock
    with _clock_lock:
        if 0 <= clock.last_ms - ms <= _CLAMP_MS:  # same ms, or just behind: keep counting
            ms = clock.last_ms
            seq = clock.seq = clock.seq + 1
            if seq > _SEQ_MASK:  # 2048+ ids in one ms: borrow the next ms
                ms += 1
                seq = clock.seq = 0
                clock.last_ms = ms
        else:
            clock.last_ms = ms
            seq = clock.seq = rand >> 53  # a random start in the lower half leaves room
    low = (rand & _RAND_MASK) | _VARIANT
    return "%08x-%04x-7%03x-%04x-%012x" % (  # noqa: UP031 - one C call, the fastest
        ms >> 16,
        ms & 0xFFFF,
        seq,
        low >> 48,
        low & _LOW48,
    )
