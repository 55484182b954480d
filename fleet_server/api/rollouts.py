"""Endpoints on rollouts; they call the :class:`RolloutOps` attached to the context.
Reading needs ``fleet:read``; creating and acting on a rollout ``rollouts:write``."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ActionIn, RolloutCreateIn, RolloutOut, error_responses
from fleet_server.api.ports import Action, RolloutOps
from fleet_server.auth.deps import require
from fleet_server.db import store

RESPONSES = error_responses(
    e404="No such rollout",
    e409="Not in this phase, or changed meanwhile",
    e503="The rollout service is not running",
)
READ = [require("fleet:read")]
WRITE = [require("rollouts:write")]


def rollouts_router(ctx: ServerContext) -> APIRouter:
    """Create, list, show and act on rollouts."""
    router = APIRouter(prefix="/api/v1/rollouts", tags=["rollouts"], responses=RESPONSES)

    def ops() -> RolloutOps:
        if ctx.rollouts is None:
            raise HTTPException(503, "the rollout service is not running")
        return ctx.rollouts

    def known(rollout_id: str) -> None:
        if store.load_rollout(ctx.engine, rollout_id) is None:
            raise HTTPException(404, f"no rollout {rollout_id!r}")

    @router.post("", status_code=201, dependencies=WRITE)
    def create(body: RolloutCreateIn) -> RolloutOut:
        """Plan a rollout of a bundle release to the selected devices, in waves."""
        service = ops()
        rollout_id = service.create(body.model_dump(exclude_none=True))
        return RolloutOut.model_validate(service.get(rollout_id))

    @router.get("", dependencies=READ)
    def list_rollouts() -> list[RolloutOut]:
        """Every rollout, oldest first."""
        return [RolloutOut.model_validate(r) for r in ops().list()]

    @router.get("/{rollout_id}", dependencies=READ)
    def show(rollout_id: str) -> RolloutOut:
        """One rollout with its devices."""
        service = ops()
        known(rollout_id)
        return RolloutOut.model_validate(service.get(rollout_id))

    @router.post("/{rollout_id}/{action}", dependencies=WRITE)
    def act(rollout_id: str, action: Action, body: ActionIn | None = None) -> RolloutOut:
        """pause, resume, approve (the next wave), cancel, or rollback a rollout."""
        service = ops()
        known(rollout_id)
        reason = body.reason if body is not None else ""
        return RolloutOut.model_validate(service.act(rollout_id, action, reason))

    return router
