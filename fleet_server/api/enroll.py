"""``POST /api/v1/enroll``: a device trades a one-time token and a CSR for its certificate
(the contract is :mod:`agent.wire.enroll`).

The token is consumed, the certificate issued and the device stored in one database
transaction: a refused CSR leaves the token unused, and a used token issues nothing.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException

from agent.wire.enroll import ENROLL_PATH, BrokerInfo, EnrollRequest, EnrollResponse
from fleet_server.api.context import ServerContext
from fleet_server.api.models import error_responses
from fleet_server.ca import CAError
from fleet_server.db import store
from fleet_server.repository import Repository

log = logging.getLogger(__name__)


def trust_root(repo: Repository) -> str:
    """The repository's newest ``<N>.root.json``, as stored (JSON text).

    Raises:
        RepoError: the repository has no root metadata.
    """
    version = repo.root().signed.version
    return (repo.metadata_dir / f"{version}.root.json").read_text(encoding="utf-8")


def enroll_router(ctx: ServerContext) -> APIRouter:
    """The enrollment endpoint (no operator token: the one-time token is the credential)."""
    router = APIRouter(tags=["enrollment"])

    @router.post(
        ENROLL_PATH,
        responses=error_responses(
            e403="Token unknown, used or expired; CSR refused",
            e503="Repository or CA not available",
        ),
    )
    def enroll(req: EnrollRequest) -> EnrollResponse:
        """Consume the token, sign the CSR (CN = the token's device id), register the device."""
        root = trust_root(ctx.repository)
        days = ctx.config.enrollment.device_cert_days
        with store.write_transaction(ctx.engine) as conn:
            token = store.consume_token(conn, store.hash_token(req.token))
            try:
                issued = ctx.ca.sign_device_csr(req.csr.encode(), token.device_id, valid_days=days)
            except CAError as exc:
                log.warning("enrollment of %r refused: %s", token.device_id, exc.reason)
                raise HTTPException(403, f"CSR refused: {exc.reason}") from exc
            store.upsert_device(
                conn,
                token.device_id,
                labels=token.labels,
                profile=token.profile,
                agent_version=req.agent_version or None,
                cert_serial=issued.serial_hex,
                revoked=False,
            )
        log.info("enrolled %r (certificate %s)", token.device_id, issued.serial_hex)
        return EnrollResponse(
            device_id=token.device_id,
            certificate=issued.cert_pem.decode(),
            ca=ctx.ca.cert_path.read_text(encoding="utf-8"),
            broker=BrokerInfo(host=ctx.broker.advertise_host, port=ctx.broker.advertise_port),
            trust_root=root,
            labels=token.labels,
            profile=token.profile,
        )

    return router
