"""Remote actions on a device (docs/device-logs-and-actions.md): ask for one
(``devices:act``), list and show them (``fleet:read``), and read what came back: the log
lines, or the diagnostics archive (``devices:act``: what a device logs is for those who
may act on it)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from agent.wire.actions import ACTION_DIAGNOSTICS, ACTIONS, DEFAULT_EXPIRES_S, MAX_EXPIRES_S
from fleet_server.actions import store
from fleet_server.actions.errors import ActionError
from fleet_server.actions.store import ActionRecord
from fleet_server.api.context import ServerContext
from fleet_server.api.models import error_responses
from fleet_server.audit.middleware import note
from fleet_server.auth.deps import Principal, require
from fleet_server.params import whole

READ = [require("fleet:read")]
ACT = [require("devices:act")]
MAX_LIST = 200
NEXT_SEQ = "X-Edgefleet-Next-Seq"
"""Header of a logs answer: the ``after`` to ask with next (``--follow``)."""
STATUS = "X-Edgefleet-Action-Status"


class ActionIn(BaseModel):
    """A remote action to ask of a device."""

    model_config = ConfigDict(extra="forbid")

    action: str = Field(description=f"One of {', '.join(ACTIONS)}.")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="logs: since_s, lines, grep, follow_s; diagnostics: lines; "
        "restart and reload: none (docs/device-logs-and-actions.md).",
    )
    expires_s: int = Field(
        DEFAULT_EXPIRES_S,
        ge=1,
        le=MAX_EXPIRES_S,
        description="Seconds the device may still carry it out (it waits retained for an "
        "offline device that long).",
    )


class ActionOut(BaseModel):
    """A request and the device's newest answer."""

    request_id: str
    device_id: str
    action: str
    params: dict[str, Any]
    counter: int
    requested_by: str
    requested_at: float
    expires_at: float
    state: str = Field(
        description="pending, accepted, running, ok, refused, failed, superseded, expired"
    )
    reason: str
    detail: dict[str, Any]
    answered_at: float | None
    chunks: int = Field(description="Chunks the device said it sent (its final answer).")
    bytes: int = Field(description="Bytes the device said it sent.")
    sha256: str
    received_chunks: int
    received_bytes: int
    complete: bool = Field(description="Done, and every chunk it sent is here.")


def action_out(
    engine: Any, record: ActionRecord, now: float | None = None, got: Any = None
) -> ActionOut:
    """The API form of a request, with what the fleet holds of its chunks (``got``:
    :class:`fleet_server.actions.store.Received`, read when not given)."""
    got = got or store.received(engine, record.request_id)
    st = store.state(record, time.time() if now is None else now)
    complete = st == "ok" and got.chunks == record.chunks and got.bytes == record.bytes
    return ActionOut(
        request_id=record.request_id, device_id=record.device_id, action=record.action,
        params=record.params, counter=record.counter, requested_by=record.requested_by,
        requested_at=record.requested_at, expires_at=record.expires_at, state=st,
        reason=record.reason, detail=record.detail, answered_at=record.answered_at,
        chunks=record.chunks, bytes=record.bytes, sha256=record.sha256,
        received_chunks=got.chunks, received_bytes=got.bytes, complete=complete,
    )  # fmt: skip


def actions_router(ctx: ServerContext) -> APIRouter:
    """Ask, list, show, and read logs and archives."""
    router = APIRouter(prefix="/api/v1/devices/{device_id}/actions", tags=["actions"])

    def record_of(device_id: str, request_id: str) -> ActionRecord:
        record = store.get(ctx.engine, request_id)
        if record is None or record.device_id != device_id:
            raise HTTPException(404, f"no action {request_id!r} on device {device_id!r}")
        return record

    @router.post(
        "",
        status_code=201,
        responses=error_responses(
            e404="No such device", e409="The device is revoked", e503="Not signed or not sent"
        ),
    )
    def ask(
        request: Request,
        device_id: str,
        body: ActionIn,
        principal: Annotated[Principal, require("devices:act")],
    ) -> ActionOut:
        """Sign a request for the device and send it (retained until it expires: an
        offline device gets it when it connects); kept with who asked."""
        note(request, kind=body.action[:40])  # the audit entry says which action
        service = ctx.actions
        if service is None:
            raise HTTPException(503, "the remote actions service is not running")
        try:
            record = service.request(
                device_id, body.action, body.params, expires_s=body.expires_s, by=principal.name
            )
        except ActionError as exc:
            raise HTTPException(exc.status, exc.reason) from exc
        note(request, request_id=record.request_id)
        return action_out(ctx.engine, record)

    @router.get("", dependencies=READ)
    def list_actions(
        device_id: str, limit: Annotated[int, whole("Requests", ge=1, le=MAX_LIST)] = 20
    ) -> list[ActionOut]:
        """The device's requests, newest first."""
        now = time.time()
        return [
            action_out(ctx.engine, r, now, got)
            for r, got in store.list_with_received(ctx.engine, device_id, limit=limit)
        ]

    @router.get("/{request_id}", dependencies=READ, responses=error_responses(e404="No such"))
    def show(device_id: str, request_id: str) -> ActionOut:
        """One request: its state, the device's reason and what came back."""
        return action_out(ctx.engine, record_of(device_id, request_id))

    @router.get(
        "/{request_id}/logs",
        dependencies=ACT,
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **error_responses(e404="No such")},
    )
    def logs(
        device_id: str,
        request_id: str,
        after: Annotated[
            int | None, whole("Chunks after this seq (none: from the first).", ge=0, le=1_000_000)
        ] = None,
    ) -> Response:
        """The log lines a logs request brought back so far (after chunk ``after``), as
        text; ``X-Edgefleet-Next-Seq`` is the ``after`` of the next call (to follow) and
        ``X-Edgefleet-Action-Status`` the request's state."""
        record = record_of(device_id, request_id)
        if record.action == ACTION_DIAGNOSTICS:
            raise HTTPException(409, f"{request_id} is a diagnostics request: get its archive")
        start = -1 if after is None else after
        parts = store.read_chunks(ctx.engine, request_id, after=start)
        text = b"".join(data for _, data in parts)
        last = parts[-1][0] if parts else start
        headers = {NEXT_SEQ: str(last), STATUS: store.state(record, time.time())}
        return Response(text, media_type="text/plain; charset=utf-8", headers=headers)

    @router.get(
        "/{request_id}/archive",
        dependencies=ACT,
        response_class=Response,
        responses={
            200: {"content": {"application/gzip": {}}},
            **error_responses(e404="No such", e409="Not finished", e410="Pruned or lost"),
        },
    )
    def archive(device_id: str, request_id: str) -> Response:
        """The diagnostics archive (``.tar.gz``), once every chunk the device said it sent
        is here and its sha256 matches."""
        record = record_of(device_id, request_id)
        if record.action != ACTION_DIAGNOSTICS:
            raise HTTPException(409, f"{request_id} is a {record.action} request, no archive")
        st = store.state(record, time.time())
        if st != "ok":
            raise HTTPException(409, f"{request_id} is {st}: {record.reason or 'no archive yet'}")
        data = store.read_all(ctx.engine, record)
        if data is None:
            got = store.received(ctx.engine, request_id)
            raise HTTPException(
                410,
                f"{request_id}: {got.chunks} of {record.chunks} chunks are here (pruned by "
                "retention, or lost on the way); ask for diagnostics again",
            )
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record.answered_at or time.time()))
        name = f"diagnostics-{device_id}-{stamp}.tar.gz"
        return Response(
            data,
            media_type="application/gzip",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    return router
