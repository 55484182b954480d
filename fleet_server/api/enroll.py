"""``POST /api/v1/enroll``: a device trades a one-time token and a CSR for its certificate
(the contract is :mod:`agent.wire.enroll`).

The token is consumed, the certificate issued and the device stored in one database
transaction: a refused CSR leaves the token unused, and a used token issues nothing.
Anyone may call it, so the body goes through :func:`agent.wire.untrusted.loads_object`
(size, depth, numbers, NUL and lone surrogates) before the model sees it: 400 naming
what was wrong.

The device is given its broker shard here (:mod:`fleet_server.broker.shards`), stored
with it, and told that shard's advertised host and port.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agent.wire.enroll import ENROLL_PATH, BrokerInfo, EnrollRequest, EnrollResponse
from agent.wire.untrusted import UntrustedInputError, loads_object
from fleet_server.api.context import ServerContext
from fleet_server.api.models import error_responses
from fleet_server.audit.middleware import note
from fleet_server.broker.shards import assign_shard
from fleet_server.ca import CAError
from fleet_server.db import store
from fleet_server.repository import Repository

log = logging.getLogger(__name__)

MAX_ENROLL_BODY = 64 * 1024
"""A token and a CSR (at most 16 KiB of PEM) with room to spare."""


async def enroll_request(request: Request) -> EnrollRequest:
    """Dependency: the body as an :class:`EnrollRequest` (400 naming what was wrong)."""
    body = await request.body()
    try:
        data = loads_object(body, what="the enrollment request", max_bytes=MAX_ENROLL_BODY)
    except UntrustedInputError as exc:
        raise HTTPException(400, str(exc)) from None
    try:
        return EnrollRequest.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def trust_root(repo: Repository) -> str:
    """The repository's newest ``<N>.root.json``, as stored (JSON text).

    Raises:
        RepoError: the repository has no root metadata.
    """
    version = repo.root().signed.version
    return (repo.metadata_dir / f"{version}.root.json").read_text(encoding="utf-8")


def device_shard(ctx: ServerContext, device_id: str, labels: Mapping[str, str]) -> str:
    """The broker shard enrollment gives ``device_id`` (:func:`assign_shard` on the
    configured shards)."""
    b = ctx.config.broker
    return assign_shard(device_id, labels, [(s.name, s.sites) for s in b.shards], b.shard_label)


def enroll_router(ctx: ServerContext) -> APIRouter:
    """The enrollment endpoint (no operator token: the one-time token is the credential)."""
    router = APIRouter(tags=["enrollment"])

    @router.post(
        ENROLL_PATH,
        responses=error_responses(
            e403="Token unknown, used or expired; CSR refused",
            e503="Repository or CA not available",
        ),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EnrollRequest.model_json_schema()}},
            }
        },
    )
    def enroll(
        request: Request, req: Annotated[EnrollRequest, Depends(enroll_request)]
    ) -> EnrollResponse:
        """Consume the token, sign the CSR (CN = the token's device id), register the device."""
        root = trust_root(ctx.repository)
        days = ctx.config.enrollment.device_cert_days
        with store.write_transaction(ctx.engine) as conn:
            token = store.consume_token(conn, store.hash_token(req.token))
            note(request, actor=f"device:{token.device_id}", target=f"device:{token.device_id}")
            try:
                issued = ctx.ca.sign_device_csr(req.csr.encode(), token.device_id, valid_days=days)
            except CAError as exc:
                log.warning("enrollment of %r refused: %s", token.device_id, exc.reason)
                raise HTTPException(403, f"CSR refused: {exc.reason}") from exc
            shard = device_shard(ctx, token.device_id, token.labels)
            store.upsert_device(
                conn,
                token.device_id,
                labels=token.labels,
                profile=token.profile,
                agent_version=req.agent_version or None,
                cert_serial=issued.serial_hex,
                revoked=False,
                shard=shard,
            )
        log.info(
            "enrolled %r (certificate %s, shard %s)", token.device_id, issued.serial_hex, shard
        )
        broker = ctx.brokers.get(shard, ctx.broker)
        return EnrollResponse(
            device_id=token.device_id,
            certificate=issued.cert_pem.decode(),
            ca=ctx.ca.cert_path.read_text(encoding="utf-8"),
            broker=BrokerInfo(host=broker.advertise_host, port=broker.advertise_port),
            trust_root=root,
            labels=token.labels,
            profile=token.profile,
        )

    return router
