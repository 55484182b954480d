"""The retention job in ``fleet-server serve`` (runs on the leader only)."""

from __future__ import annotations

from fleet_server.api.context import ServerContext


class RetentionRunner:
    """Applies the ``[retention]`` budgets every ``interval_s`` while this replica leads."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        """Start the job's thread."""

    def stop(self) -> None:
        """Stop it."""
