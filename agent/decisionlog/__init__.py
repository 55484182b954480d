"""The decision log: one SQLite row per decision, written off the hot path.

See docs/decision-log.md for the schema, the durability promise and example queries.
"""

from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.log import DecisionLog
from agent.decisionlog.query import format_rows, get, parse_time, query
from agent.decisionlog.record import DecisionRecord, new_id
from agent.decisionlog.schema import NOT_UPLOADED, QUEUED, UPLOADED
from agent.decisionlog.writer import (
    ALARM_CORRUPT,
    ALARM_EVICTED_UNUPLOADED,
    ALARM_FOREIGN,
    ALARM_WRITE_FAILED,
)

__all__ = [
    "ALARM_CORRUPT",
    "ALARM_EVICTED_UNUPLOADED",
    "ALARM_FOREIGN",
    "ALARM_WRITE_FAILED",
    "NOT_UPLOADED",
    "QUEUED",
    "UPLOADED",
    "DecisionLog",
    "DecisionLogConfig",
    "DecisionRecord",
    "format_rows",
    "get",
    "new_id",
    "parse_time",
    "query",
]
