"""The fleet database's data-access functions, in one namespace.

Each function takes a ``bind``: an :class:`~sqlalchemy.engine.Engine` (the call runs
in its own transaction) or a :class:`~sqlalchemy.engine.Connection` (it runs in the
caller's transaction; use :func:`write_transaction` to group calls atomically).
"""

from __future__ import annotations

from fleet_server.db._tx import Bind
from fleet_server.db._tx import writing as write_transaction
from fleet_server.db.devices import (
    PROFILE_KEY,
    Device,
    get_device,
    list_devices,
    mark_seen,
    set_reported,
    touch_devices,
    upsert_device,
)
from fleet_server.db.images import (
    ImageRecord,
    get_image,
    image_sizes,
    image_sizes_by_device,
    insert_images,
)
from fleet_server.db.quarantine import Quarantined, list_quarantine, quarantine
from fleet_server.db.records import (
    DecisionRecord,
    EventRecord,
    Record,
    count_records,
    insert_decisions,
    insert_events,
    insert_heartbeats,
    insert_telemetry,
    list_decision_records,
    list_events,
    list_heartbeats,
    list_telemetry,
)
from fleet_server.db.rollouts import (
    RolloutDevice,
    RolloutRecord,
    list_rollout_devices,
    list_rollouts,
    load_rollout,
    save_rollout,
    set_rollout_device_status,
    set_rollout_devices,
)
from fleet_server.db.tokens import EnrollmentToken, consume_token, create_token, hash_token

__all__ = [
    "PROFILE_KEY",
    "Bind",
    "DecisionRecord",
    "Device",
    "EnrollmentToken",
    "EventRecord",
    "ImageRecord",
    "Quarantined",
    "Record",
    "RolloutDevice",
    "RolloutRecord",
    "consume_token",
    "count_records",
    "create_token",
    "get_device",
    "get_image",
    "hash_token",
    "image_sizes",
    "image_sizes_by_device",
    "insert_decisions",
    "insert_events",
    "insert_heartbeats",
    "insert_images",
    "insert_telemetry",
    "list_decision_records",
    "list_devices",
    "list_events",
    "list_heartbeats",
    "list_quarantine",
    "list_rollout_devices",
    "list_rollouts",
    "list_telemetry",
    "load_rollout",
    "mark_seen",
    "quarantine",
    "save_rollout",
    "set_reported",
    "set_rollout_device_status",
    "set_rollout_devices",
    "touch_devices",
    "upsert_device",
    "write_transaction",
]
