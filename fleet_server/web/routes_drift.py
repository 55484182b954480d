"""The drift page (``/ui/drift``, ``fleet:read``): per (model version, line) the verdict
judged now, its windows and per-histogram PSI / JS, and per model version a chart of the
largest PSI against the reference over time, one line per production line.

:func:`drifted_lines` gives the lines the drift job has flagged, for the badges on the
fleet overview's line groups and on a device's page.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy.engine import Engine

from fleet_server.quality.drift import HOUR_S, DriftReport, DriftSettings, merge, trend
from fleet_server.quality.drift_job import DriftStatus, compute, list_status
from fleet_server.quality.store import list_drift_hours
from fleet_server.web.charts import Series, line_chart
from fleet_server.web.pages import PREFIX, Console, signed_in

MAX_QUERY = 100
CHART_POINTS = 120


@dataclass
class VersionView:
    """One model version: its lines' verdicts and the chart."""

    model_name: str
    model_version: str
    items: list[tuple[DriftReport, DriftStatus | None]] = field(default_factory=list)
    chart: Markup = field(default_factory=Markup)

    @property
    def drifted(self) -> bool:
        return any(r.drifted or (s is not None and s.drifted) for r, s in self.items)


def drifted_lines(engine: Engine) -> dict[str, list[DriftStatus]]:
    """Line -> the (model version) flags the drift job holds as drifted on it."""
    lines: dict[str, list[DriftStatus]] = {}
    for status in list_status(engine, drifted=True):
        lines.setdefault(status.line, []).append(status)
    return lines


def _chart(engine: Engine, view: VersionView, settings: DriftSettings, now: float) -> Markup:
    series = []
    start, end = now, now
    for i, (report, _) in enumerate(view.items):
        reference = report.reference
        start = min(start, reference.start)
        rows = list_drift_hours(
            engine,
            model_name=report.model_name,
            model_version=report.model_version,
            line=report.line,
            since=math.ceil(reference.start),
        )
        buckets = merge(rows).get(report.key, {})
        points = [(t, v) for t, v, _ in trend(buckets, reference, settings,
                                               points=CHART_POINTS) if v is not None]  # fmt: skip
        series.append(Series(f"line {report.line}", points, color=i))
        end = max([end, *(t for t, _ in points)])  # a bucket still open ends after now
    return line_chart(
        title=f"{view.model_name} {view.model_version}: largest PSI against the reference",
        unit="PSI",
        series=series,
        start=start,
        end=max(end, start + settings.window_hours * HOUR_S),
        threshold=(f"threshold {settings.psi_threshold:g}", settings.psi_threshold),
    )


def drift_router(console: Console) -> APIRouter:
    """The drift page."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    engine = console.ctx.engine

    @router.get("/drift")
    def drift_page(
        request: Request,
        model: Annotated[str, Query(max_length=MAX_QUERY)] = "",
        line: Annotated[str, Query(max_length=MAX_QUERY)] = "",
    ) -> HTMLResponse:
        user = signed_in(request)
        settings = DriftSettings.of(console.ctx.config.drift)
        now = time.time()
        reports = compute(engine, settings, now, model_name=model or None, line=line or None)
        held = {s.key: s for s in list_status(engine)}
        views: dict[tuple[str, str], VersionView] = {}
        for r in reports:
            view = views.setdefault(
                (r.model_name, r.model_version), VersionView(r.model_name, r.model_version)
            )
            view.items.append((r, held.get(r.key)))
        for view in views.values():
            view.chart = _chart(engine, view, settings, now)
        values = {
            "views": list(views.values()),
            "settings": settings,
            "f": {"model": model, "line": line},
            "histogram_names": ("score", "detections", "box_area", "brightness", "contrast",
                                "sharpness", "outcomes", "top_class"),
        }  # fmt: skip
        return console.render(request, "drift.html", values, user=user)

    return router
