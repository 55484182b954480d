"""Endpoints on rollouts; they call the :class:`RolloutOps` attached to the context.
Reading needs ``fleet:read``; creating, acting on a rollout and resolving a stuck device
``rollouts:write`` (the principal's name is kept with each action)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ActionIn, RolloutCreateIn, RolloutOut, error_responses
from fleet_server.api.ports import Action, RolloutOps
from fleet_server.auth.deps import Principal, require
from fleet_server.db import store
from fleet_server.rollout.service import RolloutOverlap


class ResolveIn(BaseModel):
    """How an operator resolves a stuck (or still reverting) device of a rollout that is
    rolling back."""

    model_config = ConfigDict(extra="forbid")

    how: Literal["retry", "assign", "accept"] = Field(
        description="retry: send its revert again; assign: send it to `release` of the "
        "rollout's bundle; accept: keep what it runs."
    )
    release: int | None = Field(
        None, ge=0, le=2**53, description="For assign: the release to send it to."
    )
    reason: str = Field("", max_length=500, description="Why (kept in the rollout's events).")


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
        """Plan a rollout of a bundle release to the selected devices, in waves (409
        naming the other rollout when an active one holds any of them)."""
        service = ops()
        try:
            rollout_id = service.create(body.model_dump(exclude_none=True))
        except RolloutOverlap as exc:
            raise HTTPException(409, str(exc)) from exc
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

    @router.post("/{rollout_id}/devices/{device_id}/resolve")
    def resolve(
        rollout_id: str,
        device_id: str,
        body: ResolveIn,
        principal: Annotated[Principal, require("rollouts:write")],
    ) -> RolloutOut:
        """Resolve a stuck device of a rollout that is rolling back: retry its revert,
        assign it a named release, or accept it as it is (kept with who did it)."""
        service = ops()
        known(rollout_id)
        view = service.resolve(
            rollout_id, device_id, body.how, release=body.release, reason=body.reason,
            by=principal.name,
        )  # fmt: skip
        return RolloutOut.model_validate(view)

    @router.post("/{rollout_id}/{action}")
    def act(
        rollout_id: str,
        action: Action,
        principal: Annotated[Principal, require("rollouts:write")],
        body: ActionIn | None = None,
    ) -> RolloutOut:
        """pause, resume, approve (the next wave), cancel, or rollback a rollout."""
        service = ops()
        known(rollout_id)
        reason = body.reason if body is not None else ""
        view = service.act(rollout_id, action, reason, by=principal.name)
        return RolloutOut.model_validate(view)

    return router
