"""The quality topic in ingest: shadow comparisons and drift buckets, checked record by
record.

A payload of :func:`agent.wire.topics.quality` is a :class:`~agent.wire.quality.ShadowBatch`
or a :class:`~agent.wire.quality.DriftBatch` (:func:`agent.wire.codec.parse_quality`). A
payload that is not one, or whose ``device_id`` differs from the topic's, is quarantined
whole (:class:`~agent.wire.messages.MessageError`). Each record of a valid payload
becomes a :class:`ShadowItem` or :class:`DriftItem` of the topic's device; a record whose
device time (``ts``, a bucket's ``hour``) is out of bounds is set aside alone.

Before storing, the batch asks the sink which model versions it knows for each device
(:meth:`fleet_server.ingest.sink.Sink.known_models`: the fleet's records of the device,
never a decision row of it) and quarantines, alone and with the reason, each record
whose model version is unknown for its device (for a shadow record, the *live* side's;
for a drift bucket, its own): the rest of the message is stored. The line is the
fleet's too: a drift bucket for a line its device is not enrolled on is refused by the
sink and quarantined alone (:func:`foreign_line_reason`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.wire.codec import parse_quality
from agent.wire.messages import MessageError
from agent.wire.quality import DriftHour, ShadowBatch, ShadowRecord

ModelRef = tuple[str, str, str]
"""(device_id, model_name, model_version)."""


@dataclass(frozen=True)
class ShadowItem:
    """A shadow record of the topic's device."""

    device_id: str
    record: ShadowRecord

    @property
    def ts(self) -> float:
        return self.record.ts

    def key(self) -> tuple[str, str]:
        return (self.device_id, self.record.decision_id)

    def model(self) -> ModelRef:
        """The live model the record compares against, which must be known."""
        live = self.record.live
        return (self.device_id, live.model_name, live.model_version)

    def name(self) -> str:
        return f"shadow record {self.record.decision_id}"

    def payload(self) -> bytes:
        """The record alone, as JSON (what the quarantine keeps of it)."""
        return json.dumps(self.record.model_dump(mode="json"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class DriftItem:
    """A drift bucket of the topic's device."""

    device_id: str
    hour: DriftHour

    def key(self) -> tuple[str, str, str, str, str, int]:
        return (self.device_id, *self.hour.key())

    def model(self) -> ModelRef:
        return (self.device_id, self.hour.model_name, self.hour.model_version)

    def name(self) -> str:
        h = self.hour
        return f"drift bucket {h.model_name} {h.model_version} line {h.line} {h.source} {h.hour}"

    def payload(self) -> bytes:
        return json.dumps(self.hour.model_dump(mode="json"), ensure_ascii=False).encode()


QualityItem = ShadowItem | DriftItem


def unknown_reason(item: QualityItem) -> str:
    """Why ``item`` is set aside when its model version is unknown for its device."""
    device_id, model, version = item.model()
    side = "live model" if isinstance(item, ShadowItem) else "model"
    return (
        f"{item.name()}: {side} {model} {version} is unknown for device {device_id} "
        "(the fleet has not recorded it as the device's active, previous or shadow "
        "bundle, and no rollout holding the device targets it)"
    )


def foreign_line_reason(item: DriftItem, enrolled: str | None) -> str:
    """Why a drift bucket is refused when it names a line its device is not enrolled on
    (``enrolled``: the device's line in the registry, None: it has none)."""
    on = f"is enrolled on line {enrolled}" if enrolled else "has no enrolled line"
    return (
        f"{item.name()}: names line {item.hour.line} but device {item.device_id} {on} "
        "(drift is kept for the device's enrolled line only)"
    )


class Batch(Protocol):
    """What :func:`add_quality` needs of :class:`fleet_server.ingest.batch.Batch` (a
    protocol: the batch imports this module)."""

    shadow: list[ShadowItem]
    drift: list[DriftItem]

    def put_item(
        self, kind: str, record: Any, times: Sequence[tuple[str, float]], name: str
    ) -> bool: ...


def add_quality(batch: Batch, device_id: str, payload: bytes, max_bytes: int) -> None:
    """Add the records of a quality payload of ``device_id``'s topic to ``batch``.

    Raises:
        MessageError: oversized, not a valid shadow or drift batch, or of another device.
    """
    message = parse_quality(payload, max_bytes)
    if message.device_id != device_id:
        raise MessageError(
            message.kind,
            f"device_id {message.device_id!r} differs from the topic's {device_id!r}",
        )
    if isinstance(message, ShadowBatch):
        for record in message.records:
            shadow = ShadowItem(device_id, record)
            if batch.put_item("shadow", shadow, [("ts", record.ts)], shadow.name()):
                batch.shadow.append(shadow)
        return
    for hour in message.hours:
        drift = DriftItem(device_id, hour)
        if batch.put_item("drift", drift, [("hour", float(hour.hour))], drift.name()):
            batch.drift.append(drift)
