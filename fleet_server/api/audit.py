"""``GET /api/v1/audit`` (``audit:read``): the audit trail, newest first, by actor, action,
target, result and time, a page at a time (``before``: the last ``seq`` seen). The trail
has no route that adds, changes or deletes a row: the server writes it, retention alone
prunes it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import Field

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ApiModel
from fleet_server.audit.store import MAX_QUERY, MAX_TEXT, AuditFilter, query
from fleet_server.auth.deps import require
from fleet_server.params import MAX_INT, unix_time, whole

READ = [require("audit:read")]


class AuditEntryOut(ApiModel):
    """One change."""

    seq: int = Field(description="Its place in the trail (never reused).")
    ts: float = Field(description="When the request came (Unix s).")
    actor: str = Field(description="User name, @operator-token, device:<id>, user@host (cli).")
    role: str = Field(description="The role it acted with ('' when not signed in).")
    source: str = Field(description="The client's address, or 'cli'.")
    action: str = Field(description="What was done (rollout.pause, user.add, ...).")
    target: str = Field(description="What it was done to (rollout:<id>, device:<id>, ...).")
    result: str = Field(description="ok, refused (4xx) or failed (5xx).")
    detail: dict[str, Any] = Field(description="Status, reason of a refusal, what it named.")


class AuditOut(ApiModel):
    """Changes, newest first."""

    entries: list[AuditEntryOut] = Field(description="Newest first.")
    next_before: int | None = Field(description="`before` for the next page (None: no more).")


def audit_router(ctx: ServerContext) -> APIRouter:
    """The audit trail, read only."""
    router = APIRouter(prefix="/api/v1/audit", tags=["audit"])

    @router.get("", dependencies=READ)
    def audit(
        actor: Annotated[
            str | None, Query(description="Only this actor.", max_length=MAX_TEXT)
        ] = None,
        action: Annotated[
            str | None,
            Query(description="Only this action (rollout.* : a prefix).", max_length=MAX_TEXT),
        ] = None,
        target: Annotated[
            str | None,
            Query(description="Only this target (device:* : a prefix).", max_length=MAX_TEXT),
        ] = None,
        result: Annotated[str | None, Query(description="ok, refused or failed.")] = None,
        since: Annotated[float | None, unix_time("At or after (Unix s).")] = None,
        until: Annotated[float | None, unix_time("Before (Unix s).")] = None,
        before: Annotated[
            int | None, whole("Older than this seq (next page).", ge=1, le=MAX_INT)
        ] = None,
        limit: Annotated[int, whole("At most.", ge=1, le=MAX_QUERY)] = 100,
    ) -> AuditOut:
        """The newest changes matching the filters."""
        f = AuditFilter(actor, action, target, result, since, until, before, limit)
        try:
            rows = query(ctx.engine, f)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        entries = [AuditEntryOut(**r.to_dict()) for r in rows]
        more = len(rows) == limit
        return AuditOut(entries=entries, next_before=rows[-1].seq if more and rows else None)

    return router
