"""Endpoints on model quality: drift per (model version, line).

``GET /api/v1/drift`` (``fleet:read``) judges every (model version, line) matching the
filters now (:func:`fleet_server.quality.drift_job.compute`) and adds the flag the drift
job holds; ``POST /api/v1/drift/check`` runs the job now (events included), and
``PUT``/``DELETE /api/v1/drift/pin`` pin or unpin a reference window (``rollouts:write``:
the operator's model-management permission).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from fleet_server.api.context import ServerContext
from fleet_server.api.models import ApiModel, error_responses
from fleet_server.auth.deps import Principal, require
from fleet_server.db.errors import StorageError
from fleet_server.quality.drift import DriftReport, DriftSettings
from fleet_server.quality.drift_job import (
    DriftStatus,
    compute,
    list_status,
    pin_reference,
    run_drift,
    unpin_reference,
)

READ = [require("fleet:read")]
WRITE = [require("rollouts:write")]


class WindowOut(ApiModel):
    """A window ``[start, end)`` of bucket starts, Unix seconds."""

    start: float = Field(description="Start (inclusive).")
    end: float = Field(description="End (exclusive).")
    n: int = Field(description="Decisions counted in it, all devices.")
    pinned: bool = Field(description="An operator pinned it (reference only).")


class HistogramOut(ApiModel):
    """One histogram compared: PSI and JS distance (null when a side has no count)."""

    psi: float | None = Field(description="Population stability index.")
    js: float | None = Field(description="Jensen-Shannon distance (base 2, 0..1).")
    reference_n: int = Field(description="Counts in the reference window.")
    current_n: int = Field(description="Counts in the current window.")
    over: bool = Field(description="PSI or JS above its threshold.")


class DriftOut(ApiModel):
    """The drift verdict of one (model version, line)."""

    model_name: str = Field(description="Bundle (model) name.")
    model_version: str = Field(description="Version.")
    line: str = Field(description="Production line.")
    reference: WindowOut = Field(description="Reference window.")
    current: WindowOut = Field(description="Current window.")
    judged: bool = Field(description="Both windows hold at least min_count decisions.")
    drifted: bool = Field(description="Judged, and a histogram is over a threshold.")
    reason: str = Field(description="Why, in words.")
    devices: int = Field(description="Devices whose buckets are in the windows.")
    histograms: dict[str, HistogramOut] = Field(description="Per histogram (when judged).")
    flagged: bool = Field(description="The drift job's held flag (the console's badge).")
    flagged_since: float | None = Field(description="When the flag last changed.")
    checked_at: float | None = Field(description="The drift job's last run on it.")


class DriftListOut(ApiModel):
    """Every (model version, line) matching the filters."""

    settings: dict[str, Any] = Field(description="The [drift] settings judged with.")
    items: list[DriftOut] = Field(description="By model, version and line.")


class CheckOut(ApiModel):
    """One run of the drift job."""

    items: list[DriftOut] = Field(description="Every (model version, line).")
    raised: list[str] = Field(description="'model version line' of each new drift event.")


class PinIn(BaseModel):
    """A reference window to pin."""

    model: str = Field(description="Bundle (model) name.")
    version: str = Field(description="Version.")
    line: str = Field(description="Production line.")
    start: float = Field(description="Window start, Unix seconds.")
    end: float = Field(description="Window end, Unix seconds (after start).")


class PinOut(ApiModel):
    """The reference window of (model version, line): pinned, or the default (nulls)."""

    model: str = Field(description="Bundle (model) name.")
    version: str = Field(description="Version.")
    line: str = Field(description="Production line.")
    start: float | None = Field(description="Pinned start (null: the default window).")
    end: float | None = Field(description="Pinned end (null: the default window).")
    pinned_by: str | None = Field(description="Who pinned it.")


def drift_out(report: DriftReport, status: DriftStatus | None) -> DriftOut:
    """The API form of a report, with the held flag."""
    return DriftOut(
        **report.to_dict(),
        flagged=status is not None and status.drifted,
        flagged_since=status.changed_at if status is not None else None,
        checked_at=status.checked_at if status is not None else None,
    )


def quality_router(ctx: ServerContext) -> APIRouter:
    """Drift per (model version, line)."""
    router = APIRouter(
        prefix="/api/v1/drift", tags=["quality"], responses=error_responses(e400="Bad window")
    )

    def settings() -> DriftSettings:
        return DriftSettings.of(ctx.config.drift)

    def outs(reports: list[DriftReport]) -> list[DriftOut]:
        held = {s.key: s for s in list_status(ctx.engine)}
        return [drift_out(r, held.get(r.key)) for r in reports]

    @router.get("", dependencies=READ)
    def drift(
        line: Annotated[str | None, Query(description="Only this line.")] = None,
        model: Annotated[str | None, Query(description="Only this model (bundle).")] = None,
        version: Annotated[str | None, Query(description="Only this version.")] = None,
    ) -> DriftListOut:
        """Drift of every (model version, line) matching the filters, judged now."""
        s = settings()
        reports = compute(ctx.engine, s, model_name=model, model_version=version, line=line)
        return DriftListOut(settings=vars(s), items=outs(reports))

    @router.post("/check", dependencies=WRITE)
    def check() -> CheckOut:
        """Run the drift job now: flags updated, an event for each new drift."""
        result = run_drift(ctx.engine, settings())
        raised = [f"{r.model_name} {r.model_version} {r.line}" for r in result.raised]
        return CheckOut(items=outs(result.reports), raised=raised)

    @router.put("/pin")
    def pin(body: PinIn, who: Annotated[Principal, require("rollouts:write")]) -> PinOut:
        """Pin the reference window of (model version, line)."""
        try:
            pin_reference(
                ctx.engine, body.model, body.version, body.line, body.start, body.end,
                by=who.name,
            )  # fmt: skip
        except StorageError as exc:
            raise HTTPException(400, exc.reason) from None
        return PinOut(model=body.model, version=body.version, line=body.line,
                      start=body.start, end=body.end, pinned_by=who.name)  # fmt: skip

    @router.delete("/pin", dependencies=WRITE)
    def unpin(
        model: Annotated[str, Query(description="Bundle (model) name.")],
        version: Annotated[str, Query(description="Version.")],
        line: Annotated[str, Query(description="Production line.")],
    ) -> PinOut:
        """Go back to the default reference window (the first hours)."""
        if not unpin_reference(ctx.engine, model, version, line):
            raise HTTPException(404, f"no pinned reference for {model} {version} line {line}")
        return PinOut(model=model, version=version, line=line, start=None, end=None,
                      pinned_by=None)  # fmt: skip

    return router
