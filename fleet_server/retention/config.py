"""The ``[retention]`` section of the fleet server's configuration.

Each table (or family of tables) has a budget: an age in days and/or a number of rows;
a row past either is pruned by the leader (docs/retention.md). ``max_age_days`` or
``max_rows`` left unset (omitted from the file) means no limit of that kind.

```toml
[retention]
interval_s = 3600
batch_rows = 5000

[retention.heartbeats]
max_age_days = 7
max_rows = 50_000_000

[retention.decisions]
max_age_days = 90
labelled_days = 730
```
"""

from __future__ import annotations

from pydantic import Field, model_validator

from agent.kernel.configbase import Section

MAX_DAYS = 36_500.0
"""The longest age budget: a hundred years."""
MAX_ROWS = 10**12


def _age(default: float | None, what: str) -> float | None:
    return Field(
        default,
        gt=0,
        le=MAX_DAYS,
        description=f"Days a {what} is kept after its time (unset: no age limit).",
    )


def _rows(default: int | None, what: str) -> int | None:
    return Field(
        default,
        ge=1,
        le=MAX_ROWS,
        description=f"Most {what}s kept, the newest (unset: no row limit).",
    )


class HeartbeatsBudget(Section):
    """``heartbeats``: a device's liveness records (``devices.last_seen`` keeps the last)."""

    max_age_days: float | None = _age(7.0, "heartbeat")
    max_rows: int | None = _rows(None, "heartbeat")


class AuditBudget(Section):
    """``audit_log``: the audit trail (who changed what). Nothing else deletes a row."""

    max_age_days: float | None = Field(
        400.0, gt=0, le=MAX_DAYS, description="Days an entry is kept (unset: no age limit)."
    )
    max_rows: int | None = Field(
        1_000_000, ge=1, le=MAX_ROWS, description="Most entries kept (unset: no row limit)."
    )


class AlertsBudget(Section):
    """``alerts`` (with their webhook deliveries, dead letters included, which go with
    them): judged by when an alert resolved; an alert still firing is never pruned."""

    max_age_days: float | None = Field(
        180.0,
        gt=0,
        le=MAX_DAYS,
        description="Days a resolved alert is kept after it resolved (unset: no age limit).",
    )
    max_rows: int | None = Field(
        100_000, ge=1, le=MAX_ROWS, description="Most resolved alerts kept (unset: no limit)."
    )


class DeviceActionsBudget(Section):
    """``device_actions``: remote actions asked of devices and their answers."""

    max_age_days: float | None = _age(30.0, "remote action")
    max_rows: int | None = _rows(100_000, "remote action")


class ActionChunksBudget(Section):
    """``action_chunks``: what remote actions brought back (log lines, diagnostics
    archives, up to 32 KiB a row): the bulk of remote actions, kept shorter."""

    max_age_days: float | None = _age(7.0, "remote action chunk")
    max_rows: int | None = _rows(20_000, "remote action chunk")


class TelemetryBudget(Section):
    """``telemetry``: health samples (``devices.health`` keeps the newest)."""

    max_age_days: float | None = _age(30.0, "telemetry sample")
    max_rows: int | None = _rows(None, "telemetry sample")


class EventsBudget(Section):
    """``events``: install reports, alarms. The install events a running rollout reads
    are kept whatever their age."""

    max_age_days: float | None = _age(180.0, "device event")
    max_rows: int | None = _rows(None, "device event")


class DecisionsBudget(Section):
    """``decisions`` (with their reviews, which go with them). A reviewed decision is
    kept ``labelled_days``, and whatever its age while a rollout of its model that is
    not finished may judge its labels."""

    max_age_days: float | None = _age(90.0, "decision")
    max_rows: int | None = _rows(None, "decision")
    labelled_days: float | None = Field(
        730.0,
        gt=0,
        le=MAX_DAYS,
        description="Days a reviewed decision (a ground-truth label) and its image are "
        "kept; at least max_age_days (unset: kept forever).",
    )

    @model_validator(mode="after")
    def _labelled_at_least_age(self) -> DecisionsBudget:
        age, labelled = self.max_age_days, self.labelled_days
        if age is not None and labelled is not None and labelled < age:
            raise ValueError(
                f"labelled_days ({labelled:g}) must be at least max_age_days ({age:g}): "
                "a reviewed decision is kept at least as long as any other"
            )
        return self


class ImagesBudget(Section):
    """``decision_images``: thumbnails, the bulk of the database. An image goes with its
    decision, and is kept as long as its decision is a protected label."""

    max_age_days: float | None = _age(90.0, "decision image")
    max_rows: int | None = _rows(None, "decision image")


class QualityBudget(Section):
    """``shadow_results`` and ``drift_hours``; a drift reference window (pinned, or the
    first ``[drift] reference_hours`` of a version on a line) is kept whatever its age."""

    max_age_days: float | None = _age(90.0, "shadow result or drift bucket")
    max_rows: int | None = _rows(None, "shadow result or drift bucket")


class QuarantineBudget(Section):
    """``quarantine``: payloads ingest set aside (ingest also keeps at most 10,000)."""

    max_age_days: float | None = _age(30.0, "quarantined payload")
    max_rows: int | None = _rows(10_000, "quarantined payload")


class ExpiredBudget(Section):
    """Sign-in sessions and enrollment tokens once expired (or, tokens, used)."""

    sessions_after_days: float = Field(
        1.0, ge=0, le=MAX_DAYS, description="Days an expired or idle session row is kept."
    )
    tokens_after_days: float = Field(
        30.0,
        ge=0,
        le=MAX_DAYS,
        description="Days an enrollment token is kept after it was used or expired.",
    )


class RepositoryBudget(Section):
    """Old TUF metadata versions and unreferenced target files of the bundle repository."""

    enabled: bool = Field(True, description="Prune the repository's old metadata and files.")
    keep_versions: int = Field(
        10,
        ge=1,
        le=100_000,
        description="Snapshot and targets versions kept below the current one (clients "
        "that read an older timestamp mid-update still find theirs).",
    )
    orphan_grace_days: float = Field(
        7.0,
        ge=0,
        le=MAX_DAYS,
        description="Days a target file no kept metadata lists stays (an interrupted "
        "publish); files of every published release are never removed.",
    )


class RetentionSection(Section):
    """Retention budgets per table, applied by the leader every ``interval_s``."""

    enabled: bool = Field(True, description="Run retention in fleet-server serve.")
    interval_s: float = Field(
        3600.0, gt=0, le=86_400, description="Seconds between two retention runs."
    )
    batch_rows: int = Field(
        5000, ge=1, le=1_000_000, description="Rows deleted per transaction (short locks)."
    )
    heartbeats: HeartbeatsBudget = Field(
        default_factory=HeartbeatsBudget, description="Heartbeats (default 7 days)."
    )
    telemetry: TelemetryBudget = Field(
        default_factory=TelemetryBudget, description="Health telemetry (default 30 days)."
    )
    events: EventsBudget = Field(
        default_factory=EventsBudget, description="Device events (default 180 days)."
    )
    decisions: DecisionsBudget = Field(
        default_factory=DecisionsBudget,
        description="Decisions (default 90 days; reviewed ones 730 days).",
    )
    images: ImagesBudget = Field(
        default_factory=ImagesBudget, description="Decision thumbnails (default 90 days)."
    )
    shadow_results: QualityBudget = Field(
        default_factory=QualityBudget, description="Shadow comparisons (default 90 days)."
    )
    drift_hours: QualityBudget = Field(
        default_factory=QualityBudget, description="Drift buckets (default 90 days)."
    )
    audit_log: AuditBudget = Field(
        default_factory=AuditBudget,
        description="The audit trail (default 400 days, 1,000,000 rows).",
    )
    alerts: AlertsBudget = Field(
        default_factory=AlertsBudget,
        description="Resolved alerts and their deliveries (default 180 days, 100,000 rows).",
    )
    device_actions: DeviceActionsBudget = Field(
        default_factory=DeviceActionsBudget,
        description="Remote actions and their answers (default 30 days, 100,000 rows).",
    )
    action_chunks: ActionChunksBudget = Field(
        default_factory=ActionChunksBudget,
        description="Log lines and diagnostics archives they brought back (default 7 days, "
        "20,000 chunks of at most 32 KiB).",
    )
    quarantine: QuarantineBudget = Field(
        default_factory=QuarantineBudget,
        description="Quarantined payloads (default 30 days, 10,000 rows).",
    )
    expired: ExpiredBudget = Field(
        default_factory=ExpiredBudget,
        description="Expired sessions (1 day) and used or expired enrollment tokens (30 days).",
    )
    repository: RepositoryBudget = Field(
        default_factory=RepositoryBudget,
        description="TUF metadata versions (keep 10) and orphan target files (7 days).",
    )
