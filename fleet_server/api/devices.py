"""Endpoints on devices and bundles: list, show, telemetry, published bundles
(``fleet:read``); enrollment tokens and revocation (``devices:write``)."""

from __future__ import annotations

import dataclasses
import logging
import secrets
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from agent.wire.base import slug
from fleet_server.api.context import ServerContext
from fleet_server.api.models import (
    BundleOut,
    DeviceOut,
    RecordOut,
    RevokeOut,
    TelemetryOut,
    TokenIn,
    TokenOut,
    error_responses,
)
from fleet_server.auth.deps import require
from fleet_server.ca import NameRefused, check_name
from fleet_server.db import store
from fleet_server.db.store import Device, Record
from fleet_server.db.tokens import PendingDevice, pending_devices
from fleet_server.params import whole
from fleet_server.rollout import parse_selector

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
MAX_RECENT = 500
NOT_FOUND = error_responses(e404="No such device")
READ = [require("fleet:read")]
WRITE = [require("devices:write")]


def device_out(device: Device) -> DeviceOut:
    """The API form of a registry row."""
    return DeviceOut(**{**dataclasses.asdict(device), "shard": device.shard or "main"})


def pending_out(p: PendingDevice) -> DeviceOut:
    """The API form of a pending device (enrolled, never connected)."""
    return DeviceOut(
        device_id=p.device_id, labels=p.labels, profile=p.profile,
        enrolled_at=p.token_created_at, agent_version=None, last_seen=None, online=False,
        active_bundle=None, active_release=None, previous_bundle=None, previous_release=None,
        health=None, cert_serial=None, revoked=False, shard=None, pending=True,
        token_expires_at=p.token_expires_at,
    )  # fmt: skip


def _record(r: Record) -> RecordOut:
    return RecordOut(record_id=r.record_id, ts=r.ts, payload=r.payload)


def _selector(text: str | None) -> dict[str, str]:
    if text is None or not text.strip():
        return {}
    try:
        return parse_selector(text)
    except ValueError as exc:
        raise HTTPException(400, f"selector: {exc}") from None


def _labels(labels: dict[str, str], profile: str) -> None:
    if labels:
        _selector(",".join(f"{k}={v}" for k, v in labels.items()))
    if profile:
        try:
            slug(profile, "profile name")
        except ValueError as exc:
            raise HTTPException(400, f"profile: {exc}") from None


def devices_router(ctx: ServerContext) -> APIRouter:
    """Device registry and bundle endpoints."""
    router = APIRouter(prefix="/api/v1", tags=["devices"])

    def get_or_404(device_id: str) -> Device:
        device = store.get_device(ctx.engine, device_id)
        if device is None:
            pending = pending_devices(ctx.engine, device_id=device_id)
            if pending:
                raise HTTPException(
                    404, f"device {device_id!r} is enrolled but never connected (pending)"
                )
            raise HTTPException(404, f"no device {device_id!r}")
        return device

    @router.get("/devices", dependencies=READ)
    def list_devices(
        selector: Annotated[
            str | None, Query(description="'line=3,profile=x86-gateway' or '*'")
        ] = None,
    ) -> list[DeviceOut]:
        """Devices matching every key=value of the selector, by id: registered ones and
        pending ones (``pending``: enrolled, never connected, with ``token_expires_at``)."""
        wanted = _selector(selector)
        out = [device_out(d) for d in store.list_devices(ctx.engine, wanted)]
        out += [pending_out(p) for p in pending_devices(ctx.engine, wanted)]
        return sorted(out, key=lambda d: d.device_id)

    @router.get("/devices/{device_id}", responses=NOT_FOUND, dependencies=READ)
    def show_device(device_id: str) -> DeviceOut:
        """One device: last seen, online, agent version, active and previous bundle, health;
        a pending one (enrolled, never connected) with its token's expiry."""
        device = store.get_device(ctx.engine, device_id)
        if device is not None:
            return device_out(device)
        pending = pending_devices(ctx.engine, device_id=device_id)
        if not pending:
            raise HTTPException(404, f"no device {device_id!r}")
        return pending_out(pending[0])

    @router.get("/devices/{device_id}/telemetry", responses=NOT_FOUND, dependencies=READ)
    def telemetry(
        device_id: str,
        limit: Annotated[int, whole("Records of each kind", ge=1, le=MAX_RECENT)] = 20,
    ) -> TelemetryOut:
        """The device's latest health, recent heartbeats and samples (newest first)."""
        d = get_or_404(device_id)
        return TelemetryOut(
            device_id=d.device_id,
            last_seen=d.last_seen,
            online=d.online,
            agent_version=d.agent_version,
            health=d.health,
            heartbeats=[
                _record(r) for r in store.list_heartbeats(ctx.engine, device_id, limit=limit)
            ],
            samples=[_record(r) for r in store.list_telemetry(ctx.engine, device_id, limit=limit)],
        )

    @router.post("/devices/{device_id}/tokens", status_code=201, dependencies=WRITE)
    def create_token(device_id: str, body: TokenIn) -> TokenOut:
        """A one-time enrollment token for the device; shown once, only its hash is kept."""
        try:
            check_name(device_id)
        except NameRefused as exc:
            raise HTTPException(400, f"device id: {exc.reason}") from None
        _labels(body.labels, body.profile)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        stored = store.create_token(
            ctx.engine,
            store.hash_token(token),
            device_id,
            labels=body.labels,
            profile=body.profile,
            ttl_s=body.ttl_s or ctx.config.enrollment.token_ttl_s,
        )
        log.info("enrollment token for %r, expires at %.0f", device_id, stored.expires_at)
        return TokenOut(
            device_id=device_id,
            token=token,
            expires_at=stored.expires_at,
            labels=stored.labels,
            profile=stored.profile,
        )

    @router.post("/devices/{device_id}/revoke", responses=NOT_FOUND, dependencies=WRITE)
    def revoke(device_id: str) -> RevokeOut:
        """Revoke every certificate of the device and reload the broker's CRL."""
        get_or_404(device_id)
        serials = ctx.ca.revoke_device(device_id)
        store.upsert_device(ctx.engine, device_id, revoked=True)
        reloaded = ctx.reload_broker()
        log.info("revoked %r: %d certificate(s)", device_id, len(serials))
        return RevokeOut(
            device_id=device_id,
            revoked_serials=[f"{s:X}" for s in serials],
            broker_reloaded=reloaded,
        )

    @router.get("/bundles", tags=["bundles"], dependencies=READ)
    def bundles() -> list[BundleOut]:
        """Published bundle releases, by name and release."""
        return [BundleOut.model_validate(b.to_dict()) for b in ctx.repository.bundles()]

    return router
