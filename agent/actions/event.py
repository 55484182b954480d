"""The event an action delivers: one decision, as the robot or PLC receives it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ActionEvent:
    """One decision for the actions. Times are seconds since the epoch (``time.time()``)."""

    decision_id: str
    outcome: str
    source: str
    line: str
    capture_time: float
    decision_time: float
    model: str
    model_version: str
    score: float
    label: str | None
    summary: dict[str, Any]

    def payload(self) -> bytes:
        """Compact UTF-8 JSON of every field; a non-finite score is written as null.

        Raises:
            ValueError: ``summary`` holds something JSON can't represent.
        """
        body = asdict(self)
        if not math.isfinite(self.score):
            body["score"] = None
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
