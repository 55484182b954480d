"""A station's configuration (``[[stations]]``): which PLC connection triggers which
pipeline, what it reads with the trigger, what it writes back, and its deadline.

Example::

    [[plc]]
    name = "plc1"
    driver = "modbus"
    host = "10.0.0.5"

    [[stations]]
    name = "reject-gate"
    pipeline = "cam-a"
    plc = "plc1"
    deadline_ms = 120
    fail_safe = "reject"
    trigger = { point = "coil:0" }
    part_id = { point = "hr:10", type = "uint32" }
    outputs = [
      { point = "hr:20", type = "uint16", value = "outcome_code" },
      { point = "hr:22", type = "uint32", value = "seq" },
      { point = "coil:1", type = "bool", value = "busy" },
      { point = "coil:2", type = "bool", value = "result_valid" },
    ]
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agent.kernel.configbase import Section
from agent.line.values import ValueType

MAX_DEADLINE_MS = 60_000.0
MAX_OUTPUTS = 64

OutputValue = Literal[
    "outcome_code",
    "outcome",
    "outcome_is",
    "status",
    "score",
    "label",
    "part_id",
    "decision_id",
    "seq",
    "busy",
    "result_valid",
    "trigger_to_result_ms",
    "model_version",
]
"""What a station output carries (see docs/stations.md for each)."""

HANDSHAKE_VALUES = frozenset({"busy", "result_valid"})
"""Outputs the handshake sets and clears by itself (the rest are written with a result)."""


class InputConfig(Section):
    """One value the station reads from its PLC."""

    point: str = Field(
        min_length=1,
        max_length=256,
        description="The address in the driver's syntax: an OPC UA node id "
        "(`ns=2;s=Station1.Trigger`), a Modbus `coil:N`/`di:N`/`hr:N`/`ir:N`, a Logix tag "
        "name, an S7 `DB1.DBX0.0`, an MQTT topic.",
    )
    type: ValueType = Field("bool", description="The value's type on the PLC.")


class TriggerConfig(InputConfig):
    """The signal that starts an inspection."""

    edge: Literal["rising", "change"] = Field(
        "rising",
        description="`rising`: a bool going false -> true (reset by the PLC before the next); "
        "`change`: a counter the PLC steps once per part (no trigger is lost between "
        "polls: a step of n counts n - 1 overruns).",
    )
    poll_ms: float = Field(
        5.0,
        ge=1,
        le=10_000,
        description="How often the trigger is read where the protocol has no "
        "subscriptions (Modbus, Logix, S7); OPC UA's sampling interval.",
    )


class OutputConfig(Section):
    """One value the station writes to its PLC: the allow-list of what the agent writes."""

    point: str = Field(min_length=1, max_length=256, description="The address (see inputs).")
    type: ValueType = Field(description="The value's type on the PLC.")
    value: OutputValue = Field(description="What is written there.")
    scale: float = Field(
        1.0,
        gt=0,
        le=1e9,
        description="Numbers are multiplied by this before writing (e.g. 1000: a score as "
        "an integer of thousandths).",
    )
    outcome: str | None = Field(
        None,
        max_length=64,
        description="With value = `outcome_is`: the output is true when the result's outcome "
        'is this one (a reject gate\'s bit: `outcome = "reject"`), false otherwise.',
    )

    @model_validator(mode="after")
    def _check_outcome(self) -> OutputConfig:
        if (self.value == "outcome_is") != (self.outcome is not None):
            raise ValueError('`outcome` goes with value = "outcome_is", and only with it')
        return self


class StationConfig(Section):
    """A triggered inspection: a PLC signal, a camera's frame at or after it through a
    pipeline, and the result written back before the deadline."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The station's name (decision log, metrics, the OPC UA VisionSystem).",
    )
    pipeline: str = Field(description="The pipeline that decides; its source is the camera.")
    plc: str | None = Field(
        None,
        description="The [[plc]] connection that triggers and is answered; none: only the "
        "agent's own servers trigger it ([opcua_server], [modbus_server]).",
    )
    trigger: TriggerConfig | None = Field(None, description="The trigger input (needs `plc`).")
    part_id: InputConfig | None = Field(
        None, description="Read with the trigger: the part's id, stored with the decision."
    )
    ack: InputConfig | None = Field(
        None,
        description="The PLC's acknowledgement (a bool): result_valid is cleared when it "
        "goes true. None: when the trigger goes false (`rising`) or at the next trigger.",
    )
    deadline_ms: float = Field(
        gt=0,
        le=MAX_DEADLINE_MS,
        description="From seeing the trigger to the result written: past it, the fail-safe "
        "result is written and the decision, when it comes, is logged as deadline_missed.",
    )
    fail_safe: str = Field(
        "reject", description="The outcome written when no decision is ready by the deadline."
    )
    outcome_codes: dict[str, int] = Field(
        default_factory=lambda: {"pass": 1, "reject": 2, "review": 3},
        description="Outcome -> number written by an `outcome_code` output (0: unknown).",
    )
    capture: Literal["after_trigger", "software_trigger"] = Field(
        "after_trigger",
        description="`after_trigger`: the first frame captured at or after the trigger; "
        "`software_trigger`: fire the camera's software trigger (a camera that has one). "
        'A camera with trigger_mode = "hardware" is paired by `hardware_trigger_window_ms`.',
    )
    hardware_trigger_window_ms: tuple[float, float] = Field(
        (100.0, 50.0),
        description="[before, after]: a hardware-triggered camera (trigger_mode = "
        '"hardware", a photo-eye on its input line) exposes before the PLC\'s trigger '
        "reaches the agent; its frame for a trigger is the newest one captured from "
        "`before` ms before to `after` ms after the station saw the trigger (the camera's "
        "own timestamp). Keep before + after under the time between two parts; the "
        "decisions' `outputs.capture.after_trigger_ms` show where the frames fall.",
    )
    outputs: list[OutputConfig] = Field(
        default_factory=list,
        max_length=MAX_OUTPUTS,
        description="What the station writes (nothing else is ever written).",
    )

    @model_validator(mode="after")
    def _check(self) -> StationConfig:
        if self.trigger is not None and self.plc is None:
            raise ValueError("a trigger needs `plc`, the connection it is read from")
        if self.outputs and self.plc is None:
            raise ValueError("outputs need `plc`, the connection they are written to")
        seen: set[str] = set()
        for out in self.outputs:
            if out.outcome is not None and out.outcome not in self.outcome_codes:
                raise ValueError(f"output {out.point!r}: outcome {out.outcome!r} has no code")
            if out.point in seen:
                raise ValueError(f"output point {out.point!r} is named twice")
            seen.add(out.point)
        if self.fail_safe not in self.outcome_codes:
            raise ValueError(
                f"fail_safe {self.fail_safe!r} has no code in outcome_codes {self.outcome_codes}"
            )
        for name, code in self.outcome_codes.items():
            if not 0 <= code <= 65535:
                raise ValueError(f"outcome_codes.{name} = {code} is outside 0..65535")
        before, after = self.hardware_trigger_window_ms
        if not (0 <= before <= MAX_DEADLINE_MS and 0 <= after <= MAX_DEADLINE_MS) or not (
            before + after > 0
        ):
            raise ValueError(
                f"hardware_trigger_window_ms {[before, after]}: before and after are "
                f"0..{MAX_DEADLINE_MS:g} ms, and not both 0"
            )
        for name in ("trigger", "part_id", "ack"):
            cfg = getattr(self, name)
            if cfg is not None and cfg.point in seen:
                raise ValueError(f"{name} point {cfg.point!r} is also an output")
        return self
