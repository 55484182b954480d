"""``GET /api/v1/events`` (``fleet:read``): the fleet's events, newest first, by kind,
device (or pseudo device: a rollout's id, ``line:<line>`` for drift) and time."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import Field

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ApiModel
from fleet_server.auth.deps import require
from fleet_server.db import store
from fleet_server.params import unix_time, whole

READ = [require("fleet:read")]
MAX_EVENTS = 1000


class EventOut(ApiModel):
    """One event."""

    device_id: str = Field(description="Device, or pseudo device (rollout id, line:<line>).")
    event_id: str = Field(description="Id, unique per device_id.")
    ts: float = Field(description="When it happened.")
    kind: str = Field(description="Kind (install, state, rollout, drift, ...).")
    payload: dict[str, Any] = Field(description="What it says.")
    received_at: float | None = Field(description="When the server stored it.")


class EventsOut(ApiModel):
    """Events, newest first."""

    events: list[EventOut] = Field(description="Newest first.")


def events_router(ctx: ServerContext) -> APIRouter:
    """The events list."""
    router = APIRouter(prefix="/api/v1/events", tags=["events"])

    @router.get("", dependencies=READ)
    def events(
        kind: Annotated[str | None, Query(description="Only this kind.")] = None,
        device_id: Annotated[str | None, Query(description="Only this (pseudo) device.")] = None,
        since: Annotated[float | None, unix_time("At or after (Unix s).")] = None,
        limit: Annotated[int, whole("At most.", ge=1, le=MAX_EVENTS)] = 100,
    ) -> EventsOut:
        """The newest events matching the filters."""
        rows = store.list_events(ctx.engine, device_id, kind=kind, since=since, limit=limit)
        return EventsOut(events=[EventOut(**vars(r)) for r in rows])

    return router
