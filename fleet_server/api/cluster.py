"""``GET /api/v1/cluster`` (``fleet:read``): the fleet server's replicas, which one
leads, the fencing epoch, and each one's ingest rate
(:func:`fleet_server.cluster.status.cluster_status`)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ApiModel
from fleet_server.auth.deps import require
from fleet_server.cluster.status import cluster_status

READ = [require("fleet:read")]


class ReplicaOut(ApiModel):
    """One replica's last report."""

    replica_id: str = Field(description="Its name ([cluster] replica_id, else host-pid).")
    host: str = Field(description="Host name.")
    pid: int = Field(description="Process id.")
    started_at: float = Field(description="When it started (Unix s).")
    seen_at: float = Field(description="Its last report (Unix s).")
    seen_s_ago: float = Field(description="Seconds since its last report.")
    alive: bool = Field(description="Reported within 3 x [cluster] report_s.")
    leader: bool = Field(description="It led at its last report.")
    epoch: int | None = Field(description="Its term's fencing epoch while it leads.")
    ingest_rate_per_s: float = Field(description="Records its ingest workers stored per second.")
    version: str = Field(description="Its edgefleet version.")


class ClusterOut(ApiModel):
    """The replicas and the leader."""

    leader: str | None = Field(description="The live replica that leads (None: none now).")
    epoch: int | None = Field(description="The current term's fencing epoch.")
    holder: str | None = Field(description="The replica that started the current term.")
    acquired_at: float | None = Field(description="When the current term started (Unix s).")
    replicas: list[ReplicaOut] = Field(description="Every replica that reported, by id.")


def cluster_router(ctx: ServerContext) -> APIRouter:
    """The cluster status."""
    router = APIRouter(prefix="/api/v1/cluster", tags=["cluster"])

    @router.get("", dependencies=READ)
    def cluster() -> ClusterOut:
        """The replicas as they last reported, and which one leads."""
        status = cluster_status(ctx.engine, ctx.config.cluster.report_s)
        return ClusterOut.model_validate(status.to_json())

    return router
