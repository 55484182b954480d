"""Which verified action requests the device carries out: a pure rule (:func:`decide`)
and the highest counter handled, kept on disk (:class:`HandledCounter`).

The fleet gives each device's action requests a counter of their own, one up per
request, and publishes the newest retained on the device's request topic. The device
carries out a request only when its counter is above the highest it has handled, and
before its expiry at the effective time (the time floor's: a clock set back does not
make an expired request valid again). The counter is written durably **before** the
request is carried out, so a restart it asked for does not run it again.

A retained copy of the request handled last comes again on every reconnect: that one
is passed over in silence (it was answered). The same request sent live (not retained)
is a replay and is refused, said so; so is any lower counter. A request refused as
expired moves the counter too (it verified, and it must not be answered again on every
reconnect).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from agent.kernel.durable import write_durable
from agent.kernel.readlimit import read_at_most
from agent.remote.request import ActionRequest
from agent.wire import untrusted

log = logging.getLogger(__name__)

COUNTER_FILE = "action-counter.json"
"""In the trust directory, beside ``directive-counter.json``."""
_MAX_BYTES = 4096

CARRY_OUT = "carry-out"
SILENT = "silent"
REFUSE = "refuse"


@dataclass(frozen=True)
class Handled:
    """The highest action counter handled on this device, and that request's digest."""

    counter: int = 0
    digest: str = ""


@dataclass(frozen=True)
class Decision:
    """What to do with a verified request.

    Attributes:
        what: :data:`CARRY_OUT`, :data:`SILENT` (the retained copy of the last one
            handled) or :data:`REFUSE`.
        reason: why it is refused.
        record: whether its counter becomes the highest handled.
    """

    what: str
    reason: str = ""
    record: bool = False


def decide(request: ActionRequest, handled: Handled, *, retained: bool, now: datetime) -> Decision:
    """What to do with ``request`` (signature and device already verified), given the
    highest counter ``handled``, whether it came as the broker's retained copy, and the
    effective time ``now``."""
    if request.counter == handled.counter and request.digest == handled.digest:
        if retained:
            return Decision(SILENT)
        return Decision(REFUSE, f"replayed: request {request.request_id} was handled already")
    if request.counter <= handled.counter:
        return Decision(
            REFUSE,
            f"replayed or reordered: counter {request.counter} is not above "
            f"{handled.counter}, the highest handled",
        )
    if request.is_expired(now):
        return Decision(
            REFUSE,
            f"expired at {request.expires.isoformat()} (effective time {now.isoformat()})",
            record=True,
        )
    return Decision(CARRY_OUT, record=True)


class HandledCounter:
    """``<trust_dir>/action-counter.json``, written durably."""

    def __init__(self, trust_dir: Path) -> None:
        self.path = Path(trust_dir) / COUNTER_FILE
        self.unreadable = 0

    def read(self) -> Handled:
        """The handled state; none yet is counter 0. An unreadable file is counter 0 too
        (logged): expiry still refuses an old request."""
        try:
            data = read_at_most(self.path, _MAX_BYTES, "action counter")
            raw = untrusted.loads_object(data, what=str(self.path), max_bytes=_MAX_BYTES)
            counter, digest = raw["counter"], raw.get("digest", "")
        except FileNotFoundError:
            return Handled()
        except (OSError, untrusted.UntrustedInputError, KeyError) as exc:
            return self._unreadable(str(exc))
        if type(counter) is not int or counter < 0 or not isinstance(digest, str):
            return self._unreadable(f"counter {counter!r}, digest {digest!r}")
        return Handled(counter, digest)

    def _unreadable(self, why: str) -> Handled:
        self.unreadable += 1
        log.error("action counter %s is unreadable (%s); using 0", self.path, why)
        return Handled()

    def write(self, handled: Handled) -> None:
        """Persist ``handled`` durably (never lower than what is there).

        Raises:
            OSError: the file can't be written.
        """
        if handled.counter < self.read().counter:
            return
        data = json.dumps({"counter": handled.counter, "digest": handled.digest}) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durable(self.path, data.encode())
