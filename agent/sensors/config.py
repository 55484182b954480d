"""The ``[[sensors]]`` section: where numeric readings come from and how they are windowed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from agent.kernel.configbase import Section
from agent.line.config import InputConfig

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
REPLAY_SUFFIXES = (".csv", ".jsonl", ".ndjson")
MAX_PLC_RATE_HZ = 1000.0


class SensorConfig(Section):
    """One sensor: an MQTT topic on the local broker, a file replayed at a fixed rate, or
    values read from a PLC at a rate (OPC UA nodes, Modbus registers, Logix tags, S7 DBs)."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=64,
        description="Unique sensor name; letters, digits, '_', '.', '-'.",
    )
    kind: Literal["mqtt", "replay", "plc"] = Field(
        description="mqtt: readings from a local MQTT topic; replay: readings from a file; "
        "plc: one reading of `points` from the [[plc]] connection `plc` every 1/rate_hz s."
    )
    plc: str = Field("", description="The [[plc]] connection the points are read from (kind plc).")
    points: list[InputConfig] = Field(
        default_factory=list,
        max_length=256,
        description="One address per field, in the order of `fields` (kind plc); numbers or bools.",
    )
    topic: str = Field(
        "",
        validate_default=True,
        description="MQTT topic the readings arrive on (kind mqtt); one topic, no wildcards.",
    )
    path: str = Field(
        "",
        validate_default=True,
        description="File to replay (kind replay): .csv with a header, or .jsonl/.ndjson.",
    )
    fields: list[str] = Field(
        min_length=1,
        description=(
            "Names of the values in each reading, in tensor order: JSON object keys or "
            "CSV columns; a bare number is one field."
        ),
    )
    window: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Readings per window; the tensor is (1, window, fields), or (1, fields) for 1.",
    )
    stride: int = Field(
        1, ge=1, le=100_000, description="New readings between one window and the next."
    )
    rate_hz: float = Field(
        10.0,
        gt=0,
        le=100_000,
        description="Readings per second: the replay's rate (kind replay), how often the "
        "points are read (kind plc, at most 1,000).",
    )
    loop: bool = Field(True, description="Replay the file again from the start at its end.")
    line: str = Field("", description="Production line this sensor belongs to (for policy).")
    max_silence_s: float = Field(
        60.0,
        gt=0,
        le=7 * 86_400,
        description="An mqtt sensor with no reading for longer than this is reported silent "
        "(/readyz fails, /healthz and /metrics show it); readings that are rejected do not "
        "count as readings.",
    )

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, topic: str, info: ValidationInfo) -> str:
        if info.data.get("kind") != "mqtt":
            return topic
        if not topic:
            raise ValueError("topic is required for an mqtt sensor")
        if "+" in topic or "#" in topic:
            raise ValueError(f"topic {topic!r} has a wildcard; a sensor reads one topic")
        return topic

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str, info: ValidationInfo) -> str:
        if info.data.get("kind") != "replay":
            return path
        if not path:
            raise ValueError("path is required for a replay sensor")
        if not path.lower().endswith(REPLAY_SUFFIXES):
            raise ValueError(f"path {path!r} must end with one of {', '.join(REPLAY_SUFFIXES)}")
        return path

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, fields: list[str]) -> list[str]:
        if any(not f.strip() for f in fields):
            raise ValueError("field names must not be empty")
        if len(set(fields)) != len(fields):
            raise ValueError(f"field names repeat: {fields}")
        return fields

    @model_validator(mode="after")
    def _check_plc(self) -> SensorConfig:
        if self.kind != "plc":
            if self.plc or self.points:
                raise ValueError(f"plc and points apply to plc sensors, not {self.kind}")
            return self
        if not self.plc:
            raise ValueError("plc is required for a plc sensor (a [[plc]] connection's name)")
        if len(self.points) != len(self.fields):
            raise ValueError(
                f"{len(self.points)} points for {len(self.fields)} fields: give one per field"
            )
        if any(p.type == "string" for p in self.points):
            raise ValueError("a sensor reads numbers: a point of type string can't be a field")
        if self.rate_hz > MAX_PLC_RATE_HZ:
            raise ValueError(
                f"rate_hz {self.rate_hz:g} is over {MAX_PLC_RATE_HZ:g} for a plc sensor"
            )
        return self
