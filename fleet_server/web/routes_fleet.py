"""The fleet overview (``/ui/``), a device's page (``/ui/devices/{id}``) and the bundles
page (``/ui/bundles``); all need ``fleet:read``. A pending device (enrolled by an operator,
its token unused, so never connected) is listed apart on the overview, and its page says
so with its token's expiry."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from agent.wire.messages import EVENT_INSTALL
from fleet_server.db import store
from fleet_server.db.store import Device
from fleet_server.db.tokens import pending_devices
from fleet_server.web import queries
from fleet_server.web.bundles import Release
from fleet_server.web.charts import PALETTE, Stack, line_chart, stacked_bars
from fleet_server.web.health import LEVELS, Glance, glance
from fleet_server.web.pages import PREFIX, Console, PageError, signed_in
from fleet_server.web.routes_actions import live_rows, recent_rows
from fleet_server.web.routes_drift import drifted_lines
from fleet_server.web.series import health_charts

RANGES = {"1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}
DEFAULT_RANGE = "6h"
PENDING = "pending"
STATES = ("", "online", "offline", *LEVELS, PENDING)
DECISION_BUCKETS = 48
OUTCOME_CSS = {"pass": "o-pass", "ok": "o-pass", "reject": "o-reject", "fail": "o-reject",
               "review": "o-review"}  # fmt: skip
MAX_QUERY = 100


@dataclass
class Row:
    """A device in the overview."""

    device: Device
    glance: Glance
    release: Release | None
    """The active bundle release as published (None: not in the repository)."""

    @property
    def site(self) -> str:
        return self.device.labels.get("site", "")

    @property
    def line(self) -> str:
        return self.device.labels.get("line", "")


@dataclass
class Group:
    """The devices of one site and line, with their counts by health level."""

    site: str
    line: str
    rows: list[Row] = field(default_factory=list)

    def count(self, level: str) -> int:
        return sum(1 for r in self.rows if r.glance.level == level)

    @property
    def online(self) -> int:
        return sum(1 for r in self.rows if r.device.online)


def _release(d: Device, releases: dict[tuple[str, int], Release]) -> Release | None:
    if d.active_bundle is None or d.active_release is None:
        return None
    return releases.get((d.active_bundle, d.active_release))


def _glance(d: Device, releases: dict[tuple[str, int], Release], now: float) -> Glance:
    known = _release(d, releases)
    budget = known.budget_ms if known is not None else None
    return glance(
        online=d.online, last_seen=d.last_seen, revoked=d.revoked, health=d.health, now=now,
        budget_ms=budget,
    )  # fmt: skip


def _groups(rows: Sequence[Row]) -> list[Group]:
    groups: list[Group] = []
    for r in rows:
        if not groups or (groups[-1].site, groups[-1].line) != (r.site, r.line):
            groups.append(Group(r.site, r.line))
        groups[-1].rows.append(r)
    return groups


def _outcome_stacks(counts: dict[str, list[int]]) -> list[Stack]:
    order = sorted(counts, key=lambda o: (o not in OUTCOME_CSS, -sum(counts[o]), o))
    return [
        Stack(o, OUTCOME_CSS.get(o, f"c{(i + 3) % PALETTE}"), counts[o])
        for i, o in enumerate(order)
    ]


def fleet_router(console: Console) -> APIRouter:
    """The overview, device and bundles pages."""
    router = APIRouter(prefix=PREFIX, include_in_schema=False)
    engine = console.ctx.engine

    @router.get("/")
    def overview(
        request: Request,
        site: str = "",
        line: str = "",
        state: str = "",
        q: Annotated[str, Query(max_length=MAX_QUERY)] = "",
    ) -> HTMLResponse:
        user = signed_in(request)
        if state not in STATES:
            raise PageError(
                400, f"state {state!r} is not one of {', '.join(s for s in STATES if s)}"
            )
        online = {"online": True, "offline": False}.get(state)
        f = queries.DeviceFilter(site=site, line=line, online=online, q=q.strip())
        devices = [] if state == PENDING else queries.overview_devices(engine, f)
        pending = queries.pending(engine, f) if state in ("", PENDING) else []
        pairs = queries.sites_and_lines(engine)
        releases = console.catalog.releases()
        now = time.time()
        rows = [Row(d, _glance(d, releases, now), _release(d, releases)) for d in devices]
        if state in LEVELS:
            rows = [r for r in rows if r.glance.level == state]
        levels = {lvl: sum(1 for r in rows if r.glance.level == lvl) for lvl in LEVELS}
        values: dict[str, Any] = {
            "groups": _groups(rows),
            "total": len(rows),
            "online": sum(1 for r in rows if r.device.online),
            "levels": levels,
            "sites": sorted({s for s, _ in pairs}),
            "lines": sorted({ln for s, ln in pairs if not site or s == site}),
            "f": {"site": site, "line": line, "state": state, "q": q},
            "states": STATES,
            "drift": drifted_lines(engine),
            "pending": pending,
            # the page fetches itself again every 5 s (app.js): a device going offline
            # shows without a reload
            "live_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        return console.render(request, "overview.html", values, user=user)

    @router.get("/devices/{device_id}")
    def device_page(request: Request, device_id: str, span: str = DEFAULT_RANGE) -> HTMLResponse:
        user = signed_in(request)
        if span not in RANGES:
            raise PageError(400, f"span {span!r} is not one of {', '.join(RANGES)}", user=user)
        device = store.get_device(engine, device_id)
        if device is None:
            pending = pending_devices(engine, device_id=device_id)
            if not pending:
                raise PageError(404, f"no device {device_id!r}", user=user)
            values = {"p": pending[0], "expired": pending[0].expired(time.time())}
            return console.render(request, "device_pending.html", values, user=user)
        end = time.time()
        start = end - RANGES[span]
        releases = console.catalog.releases()
        known = _release(device, releases)
        budget = known.budget_ms if known is not None else None
        reports, capped = queries.health_reports(engine, device_id, start, end)
        charts: list[tuple[str, Markup]] = []
        for c in health_charts(reports, start, end):
            threshold = None
            if c.key == "latency" and budget is not None:
                threshold = (f"budget {budget:g} ms", budget)
            title = c.title + (f" ({c.note})" if c.note else "")
            chart = line_chart(title=title, unit=c.unit, series=c.series, start=start, end=end,
                               threshold=threshold)  # fmt: skip
            charts.append((c.key, chart))
        edges, counts = queries.decisions_by_outcome(
            engine, device_id, start, end, DECISION_BUCKETS
        )
        decisions = stacked_bars(
            title="Decisions by outcome",
            unit="decisions",
            edges=edges,
            stacks=_outcome_stacks(counts),
        )
        events = queries.recent_events(engine, device_id)
        installs = [e for e in events if e.kind == EVENT_INSTALL]
        values = {
            "device": device,
            "glance": _glance(device, releases, end),
            "budget": budget,
            "state": queries.newest_state(engine, device_id) or {},
            "last_install": installs[0] if installs else None,
            "installs": installs[:10],
            "events": events,
            "charts": charts,
            "decisions": decisions,
            "decision_total": sum(sum(v) for v in counts.values()),
            "samples": len(reports),
            "capped": capped,
            "span": span,
            "spans": list(RANGES),
            "drift": drifted_lines(engine).get(device.labels.get("line", ""), []),
        }
        actions = recent_rows(engine, device_id)
        values |= {"actions": actions, "actions_live": live_rows(actions),
                   "can_act": user.can("devices:act")}  # fmt: skip
        return console.render(request, "device.html", values, user=user)

    @router.get("/bundles")
    def bundles_page(request: Request) -> HTMLResponse:
        user = signed_in(request)
        values = {
            "repo": console.catalog.state(),
            "bundles": console.catalog.bundles(),
            "installed": queries.installations(engine),
        }
        return console.render(request, "bundles.html", values, user=user)

    return router
