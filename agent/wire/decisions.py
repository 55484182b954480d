"""Decisions uploaded to the fleet: batches of decision-log rows and the JPEG thumbnail
of a decision. A decision row is identified by (device_id, id) with the decision log's
UUIDv7, and so is its thumbnail; either may arrive first and is stored once.

A decision that answers a station's PLC trigger names the station, the part id the PLC
passed and whether the station's deadline passed first; rows of older agents and of
free-running pipelines carry none of these (``""``, ``""``, ``false``). A part id comes
from a PLC: :func:`part_id_problem` and :func:`station_problem` say what the fleet
refuses, so the agent can check a value before it logs it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from agent.wire.base import WireModel
from agent.wire.envelope import (
    DeviceId,
    Finite,
    Message,
    MessageError,
    RecordId,
    Timestamp,
    error_text,
)
from agent.wire.jpeg import JpegError, jpeg_size

MAX_DECISION_ROWS = 1000
"""The most decision rows one upload carries."""
MAX_THUMBNAIL_BYTES = 256 * 1024
"""The largest JPEG a thumbnail message carries (its base64 text is a third more)."""

MAX_PART_ID_CHARS = 128
"""The longest part id a decision row carries."""
STATION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A station name (matched whole): a letter or digit, then up to 63 of those and ``_.-``."""

_JSON_COLUMNS = ("outputs", "thresholds", "latencies_ms")


def part_id_problem(value: str) -> str:
    """Why ``value`` can't be a decision's part id ("" when it can): more than
    :data:`MAX_PART_ID_CHARS` characters, or a character that is not printable (a
    control character, a line break or tab, a bidi or other format control, a lone
    surrogate). ``""`` (no part id) is fine."""
    if len(value) > MAX_PART_ID_CHARS:
        return f"a part id of {len(value)} characters (at most {MAX_PART_ID_CHARS})"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"a part id holding the unprintable character U+{ord(bad):04X}"
    return ""


def station_problem(value: str) -> str:
    """Why ``value`` can't be a decision's station ("" when it can): not empty and not
    a name of :data:`STATION_PATTERN`."""
    if value and STATION_PATTERN.fullmatch(value) is None:
        shown = value if len(value) <= 80 else value[:80] + "..."
        return (
            f"{shown!r} is not a station name (a letter or digit, then letters, digits, "
            "'_', '.', '-'; 1-64 characters)"
        )
    return ""


def _part_id(value: str) -> str:
    why = part_id_problem(value)
    if why:
        raise ValueError(why)
    return value


def _station(value: str) -> str:
    why = station_problem(value)
    if why:
        raise ValueError(why)
    return value


PartId = Annotated[str, AfterValidator(_part_id)]
StationName = Annotated[str, AfterValidator(_station)]


class DecisionRow(WireModel):
    """One decision-log row (agent.decisionlog.schema.COLUMNS less the local ``uploaded``)."""

    id: RecordId = Field(description="The decision's UUIDv7 from the device's log.")
    capture_time: Timestamp = Field(description="Unix time of the frame's capture.")
    decision_time: Timestamp = Field(description="Unix time of the decision.")
    device_id: DeviceId = Field(description="The deciding device.")
    source: str = Field(description="Camera or sensor name.")
    line: str = Field(description="Production line.")
    model_name: str = Field(description="Model (pipeline) name.")
    model_version: str = Field(description="Model version.")
    bundle_digest: str = Field(description="Digest of the bundle that decided.")
    backend: str = Field(description="Inference backend.")
    config_hash: str = Field(description="Hash of the decision configuration.")
    input_digest: str = Field(description="Digest of the model input.")
    outputs: dict[str, Any] = Field(description="Post-processed model outputs.")
    outcome: str = Field(description="pass / reject / review ...")
    thresholds: dict[str, Any] = Field(description="Thresholds the policy applied.")
    latencies_ms: dict[str, Finite | None] = Field(description="Per stage, ms.")
    e2e_ms: Finite | None = Field(None, description="Capture to decision, ms.")
    thumbnail: str | None = Field(None, description="Thumbnail path on the device, if kept.")
    station: StationName = Field(
        "", description="The station whose PLC trigger this answers ('' free-running)."
    )
    part_id: PartId = Field("", description="The part id the PLC passed ('' when none).")
    deadline_missed: bool = Field(
        False,
        strict=True,
        description="The station's deadline passed first: the PLC got the fail-safe result.",
    )

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, id)."""
        return (self.device_id, self.id)

    @classmethod
    def from_log_row(cls, row: Mapping[str, Any]) -> DecisionRow:
        """A row read from the decision log (JSON columns as text, ``deadline_missed``
        as 0/1, ``uploaded`` dropped).

        Raises:
            MessageError: a JSON column is not JSON, or a field is missing or invalid.
        """
        data = {k: v for k, v in row.items() if k != "uploaded"}
        for name in _JSON_COLUMNS:
            if isinstance(data.get(name), str):
                try:
                    data[name] = json.loads(data[name])
                except json.JSONDecodeError as exc:
                    raise MessageError(
                        "decisions", f"row {row.get('id')!r}: {name}: {exc}"
                    ) from exc
        missed = data.get("deadline_missed")
        if type(missed) is int and missed in (0, 1):  # SQLite's boolean
            data["deadline_missed"] = bool(missed)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise MessageError("decisions", error_text(exc)) from exc


class DecisionUpload(Message):
    """A batch of decision rows, all of this device."""

    kind: Literal["decisions"] = Field("decisions", description="Message kind.")
    rows: list[DecisionRow] = Field(
        min_length=1, max_length=MAX_DECISION_ROWS, description="The rows, oldest first."
    )

    @model_validator(mode="after")
    def _rows_of_this_device(self) -> DecisionUpload:
        for row in self.rows:
            if row.device_id != self.device_id:
                raise ValueError(
                    f"row {row.id} is of device {row.device_id!r}, the upload of {self.device_id!r}"
                )
        return self


class ThumbnailUpload(Message):
    """The JPEG thumbnail the decision log kept of one decision.

    Queued just before the upload batch that holds the decision; the fleet keeps it
    beside the decision, whichever of the two arrives first. ``data`` is the JPEG in
    standard base64; it is checked to be a JPEG of at most :data:`MAX_THUMBNAIL_BYTES`
    whose size can be read.
    """

    kind: Literal["thumbnail"] = Field("thumbnail", description="Message kind.")
    decision_id: RecordId = Field(description="The decision's id (DecisionRow.id).")
    decision_time: Timestamp = Field(description="Unix time of the decision.")
    content_type: Literal["image/jpeg"] = Field("image/jpeg", description="Image format.")
    data: str = Field(
        min_length=4,
        max_length=4 * ((MAX_THUMBNAIL_BYTES + 2) // 3),
        description="The JPEG, standard base64.",
    )

    @model_validator(mode="after")
    def _a_jpeg(self) -> ThumbnailUpload:
        data = self.jpeg()
        if len(data) > MAX_THUMBNAIL_BYTES:
            raise ValueError(f"data: a JPEG of {len(data)} bytes, over {MAX_THUMBNAIL_BYTES}")
        try:
            jpeg_size(data)
        except JpegError as exc:
            raise ValueError(f"data: {exc}") from exc
        return self

    def jpeg(self) -> bytes:
        """The JPEG bytes.

        Raises:
            ValueError: ``data`` is not standard base64.
        """
        try:
            return base64.b64decode(self.data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"data: not base64: {exc}") from exc

    def key(self) -> tuple[str, str]:
        """The record's identity: (device_id, decision_id)."""
        return (self.device_id, self.decision_id)

    @classmethod
    def of(
        cls, device_id: str, decision_id: str, decision_time: float, jpeg: bytes
    ) -> ThumbnailUpload:
        """The message of a thumbnail file's bytes.

        Raises:
            MessageError: not a JPEG whose size can be read, over the size limit, or an
                invalid id or time.
        """
        try:
            return cls(
                device_id=device_id,
                decision_id=decision_id,
                decision_time=decision_time,
                data=base64.b64encode(jpeg).decode("ascii"),
            )
        except ValidationError as exc:
            raise MessageError("thumbnail", error_text(exc)) from exc
