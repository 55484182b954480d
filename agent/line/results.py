"""What a station answered, as its listeners get it (the OPC UA and Modbus servers the
line reads, the console's live view): one :class:`StationResult` per trigger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STATUS_CODES: dict[str, int] = {
    "ok": 1,  # decided within the deadline: the decision's outcome
    "deadline_missed": 2,  # no decision by the deadline: the fail-safe result
    "overrun": 3,  # a trigger while busy: answered with the fail-safe result, not decided
    "error": 4,  # not decided: the station is halted, or Stop/Abort gave the part up
    # (a failed inference or a frame that never came is answered at the deadline:
    # deadline_missed)
}
"""The ``status`` a station writes beside each result, and its number on the wire."""


@dataclass(frozen=True)
class StationResult:
    """One trigger's answer.

    Attributes:
        station: the station's name.
        seq: the station's result number (1, 2, ...; every trigger gets one, overruns too).
        trigger_seq: the trigger's number at the station (the same as ``seq`` unless the
            PLC's trigger counter skipped: then the missed ones were overruns).
        status: a key of :data:`STATUS_CODES`.
        outcome: the outcome written (the decision's, or the fail-safe one).
        outcome_code: its number (the station's ``outcome_codes``).
        score: the decision's score (0.0 for a fail-safe result).
        label: the decision's label ("" for a fail-safe result).
        part_id: the part id the PLC gave with the trigger ("" when none).
        decision_id: the decision's id ("" when nothing was decided).
        model_name: the model that decided ("" when nothing was).
        model_version: its version.
        trigger_to_result_ms: from seeing the trigger to queueing the result's writes.
        wall_time: when the result was made (unix seconds).
    """

    station: str
    seq: int
    trigger_seq: int
    status: str
    outcome: str
    outcome_code: int
    score: float
    label: str
    part_id: str
    decision_id: str
    model_name: str
    model_version: str
    trigger_to_result_ms: float
    wall_time: float

    @property
    def status_code(self) -> int:
        return STATUS_CODES[self.status]


class ResultListener(Protocol):
    """Told of every result (on the station's thread); must return at once (queue it)."""

    def on_result(self, result: StationResult) -> None: ...
