"""Events: something that happened once on the device (an install step, a rollback, a
crash, an alarm), identified by (device_id, event_id); and the installer's retained
install report read as an ``install`` event.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from agent.wire.base import slug
from agent.wire.envelope import Message, MessageError, RecordId, Timestamp, error_text

EVENT_INSTALL = "install"
EVENT_ROLLBACK = "rollback"
EVENT_CRASH = "crash"
EVENT_ALARM = "alarm"
EVENT_KINDS = (EVENT_INSTALL, EVENT_ROLLBACK, EVENT_CRASH, EVENT_ALARM)
"""Event kinds this code knows; others are kept and stored as they are."""


def _event_kind(value: str) -> str:
    return slug(value, "event kind")


class Event(Message):
    """Something that happened once: an install step, an alarm, a rollback, a crash.

    Unlike the other messages, ``kind`` is the event's kind (see :data:`EVENT_KINDS`); the
    topic says it is an event.
    """

    kind: Annotated[str, AfterValidator(_event_kind)] = Field(
        description="install | rollback | crash | alarm | ..."
    )
    event_id: RecordId = Field(description="Made by the device; the same on every retry.")
    ts: Timestamp = Field(description="Unix time of the event.")
    payload: dict[str, Any] = Field(default_factory=dict, description="Kind-specific details.")

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, event_id)."""
        return (self.device_id, self.event_id)


def install_state_event(device_id: str, report: Mapping[str, Any]) -> Event:
    """The installer's retained report (``install/state``) as an ``install`` event.

    The report carries no id, so the event's id is a digest of its content: the same
    report delivered again (a retained copy on resubscribe) is the same record.

    Raises:
        MessageError: the device id is invalid, or the report's ``device_id`` differs.
    """
    claimed = report.get("device_id", device_id)
    if claimed != device_id:
        raise MessageError(
            "install-state", f"device_id {claimed!r} differs from the topic's {device_id!r}"
        )
    canonical = json.dumps(report, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(f"{device_id}\n{canonical}".encode()).hexdigest()[:32]
    ts = report.get("ts")
    when = float(ts) if isinstance(ts, (int, float)) and math.isfinite(ts) and ts > 0 else None
    try:
        return Event(
            device_id=device_id,
            kind=EVENT_INSTALL,
            event_id=f"install-state-{digest}",
            ts=when if when is not None else time.time(),
            payload=dict(report),
        )
    except ValidationError as exc:
        raise MessageError("install-state", error_text(exc)) from exc
