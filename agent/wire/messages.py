"""The messages a device reports to the fleet, in one place: state, heartbeat, health,
telemetry, decision uploads, decision thumbnails, events and the model-quality records
(:mod:`agent.wire.quality`: shadow comparisons, drift histograms); with :func:`parse` and
:func:`encode`. Each idea has its module, and every name is importable from here too:

- :mod:`agent.wire.envelope`: what every message carries (schema version, device id, a
  periodic report's identity), the shared field types and :class:`MessageError`;
- :mod:`agent.wire.reports`: the retained state, heartbeat, health and telemetry;
- :mod:`agent.wire.decisions`: decision rows, their uploads and thumbnails;
- :mod:`agent.wire.events`: events, and the install report as an event;
- :mod:`agent.wire.codec`: payload to message (size, gzip, untrusted JSON) and back.

Every message is a JSON object with ``schema_version`` and ``kind`` and keeps fields this
code does not know (``extra="allow"`` at every level), so an older fleet server stores
what a newer agent sends and writes it back unchanged. An incompatible change raises
:data:`SCHEMA_VERSION`; a message with a higher one is refused. The topic of each is in
:mod:`agent.wire.topics` (health and telemetry share the telemetry topic, told apart by
``kind``); the device id in the topic must equal the payload's.

Each record carries its identity from the device, so a redelivered or retried message is
stored once: a heartbeat, a health report or a telemetry sample is (device_id, kind, seq,
ts) (``seq`` counts up from 0 at agent start, ``ts`` tells two runs apart); a decision row is
(device_id, id) with the decision log's UUIDv7, and so is its thumbnail; an event is
(device_id, event_id).
"""

from __future__ import annotations

from agent.wire.codec import M, encode, parse, parse_object, parse_quality, parse_telemetry
from agent.wire.decisions import (
    MAX_DECISION_ROWS,
    MAX_THUMBNAIL_BYTES,
    DecisionRow,
    DecisionUpload,
    ThumbnailUpload,
)
from agent.wire.envelope import (
    MAX_ERRORS_SHOWN,
    MAX_PAYLOAD_BYTES,
    SCHEMA_VERSION,
    Count,
    DeviceId,
    Finite,
    Message,
    MessageError,
    PayloadTooLarge,
    RecordId,
    Sample,
    Timestamp,
    error_text,
)
from agent.wire.events import (
    EVENT_ALARM,
    EVENT_CRASH,
    EVENT_INSTALL,
    EVENT_KINDS,
    EVENT_ROLLBACK,
    Event,
    install_state_event,
)
from agent.wire.quality import (
    DriftBatch,
    DriftHour,
    ShadowBatch,
    ShadowRecord,
    ShadowSummary,
)
from agent.wire.reports import (
    BundleRef,
    Health,
    Heartbeat,
    Percentiles,
    ReportedState,
    Telemetry,
)

__all__ = [
    "EVENT_ALARM",
    "EVENT_CRASH",
    "EVENT_INSTALL",
    "EVENT_KINDS",
    "EVENT_ROLLBACK",
    "MAX_DECISION_ROWS",
    "MAX_ERRORS_SHOWN",
    "MAX_PAYLOAD_BYTES",
    "MAX_THUMBNAIL_BYTES",
    "SCHEMA_VERSION",
    "BundleRef",
    "Count",
    "DecisionRow",
    "DecisionUpload",
    "DeviceId",
    "DriftBatch",
    "DriftHour",
    "Event",
    "Finite",
    "Health",
    "Heartbeat",
    "M",
    "Message",
    "MessageError",
    "PayloadTooLarge",
    "Percentiles",
    "RecordId",
    "ReportedState",
    "Sample",
    "ShadowBatch",
    "ShadowRecord",
    "ShadowSummary",
    "Telemetry",
    "ThumbnailUpload",
    "Timestamp",
    "encode",
    "error_text",
    "install_state_event",
    "parse",
    "parse_object",
    "parse_quality",
    "parse_telemetry",
]
