"""The ``[retention]`` section of the fleet server's configuration."""

from __future__ import annotations

from pydantic import Field

from agent.kernel.configbase import Section


class RetentionSection(Section):
    """Retention budgets per table, applied by the leader every ``interval_s``."""

    interval_s: float = Field(
        3600.0, gt=0, le=86_400, description="Seconds between two retention runs."
    )
    batch_rows: int = Field(
        5000, ge=1, le=1_000_000, description="Rows deleted per transaction (short locks)."
    )
