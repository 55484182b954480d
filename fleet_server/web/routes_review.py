"""The decision review pages (``/ui/decisions``): the filtered list, a page at a time by
keyset (the ``cursor`` of the previous page, never an offset), each row with a thumbnail
of its image and boxes, accuracy per line and model version from the reviews, a link to
the CSV export of the same filters, and one decision in whole with its image and boxes,
scores, latencies and the review form.

A decision's image is the thumbnail its device uploaded, served by the API
(``/api/v1/decisions/{id}/image``, same session cookie) into an ``<img>`` under an SVG of
the boxes (:mod:`fleet_server.web.frames`); a list page looks up its rows' images in one
query, never one per row.

Shadow disagreements: the ``disagreement`` filter lists the decisions a candidate in the
device's shadow slot decided otherwise (each row names the candidate's outcome), and a
decision with a shadow comparison shows both models' outputs drawn on its image
(``/api/v1/decisions/{id}/comparison.png``: live in blue, the candidate in magenta), both
sides' outcomes and outputs, and which model the current label agrees with.

The pages call :mod:`fleet_server.review`, as the JSON API does
(docs/decision-review.md). Looking needs ``fleet:read``; the review form needs
``decisions:review`` and the session's CSRF token; the export link
(``/api/v1/decisions/export.csv``) needs ``decisions:export``.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from fleet_server.audit.middleware import note
from fleet_server.auth.deps import Principal
from fleet_server.review import (
    DEFAULT_LIMIT,
    BadReview,
    DecisionFilter,
    ReviewError,
    UnknownDecision,
    accuracy,
    comparison_url,
    decode_cursor,
    encode_cursor,
    get_decision,
    image_sizes_by_device,
    image_url,
    list_decisions,
    parse_filter,
    place,
    save_review,
    shadow_outcomes,
)
from fleet_server.review.filters import TEXT_FILTERS
from fleet_server.review.overlay import CANDIDATE_HEX, LIVE_HEX, summary
from fleet_server.web import queries
from fleet_server.web.frames import THUMB, Picture, boxes_of, draw, frame_of
from fleet_server.web.pages import PREFIX, SECURITY_HEADERS, PageError, Pages, posted, safe_next
from fleet_server.web.pages import signed_in as signed_in_
from fleet_server.web.rules import policy_text

RANGES = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
OUTCOMES = ("pass", "reject", "review")
"""Offered in the filter and the override (any other outcome can be typed)."""
ACCURACY_GROUP = ["line", "model_version"]


def _params(request: Request) -> dict[str, str]:
    """The page's filter parameters as given (blank ones left out)."""
    return _params_of(request.query_params)


def _params_of(q: Any) -> dict[str, str]:
    names = (*TEXT_FILTERS, "range", "from", "to", "reviewed", "disagreement")
    return {n: q[n].strip() for n in names if q.get(n, "").strip()}


def _list_filter(back: str, now: float, user: Principal) -> DecisionFilter | None:
    """The filter of the decision list ``back`` points to (None: it is not the list, or
    its filter does not parse): the queue "save and next" walks."""
    parts = urllib.parse.urlsplit(back)
    if parts.path != f"{PREFIX}/decisions":
        return None
    query = dict(urllib.parse.parse_qsl(parts.query, max_num_fields=50))
    try:
        return _filter(_params_of(query), now, user)
    except PageError:
        return None


def _decision_url(decision_id: str, device_id: str, back: str, *, done: bool = False) -> str:
    query = {
        **({"done": "1"} if done else {}),
        **({"device": device_id} if device_id else {}),
        "back": back,
    }
    return f"{PREFIX}/decisions/{urllib.parse.quote(decision_id)}?{urllib.parse.urlencode(query)}"


def _filter(params: dict[str, str], now: float, user: Principal) -> DecisionFilter:
    given: dict[str, str | None] = {n: params.get(n) for n in TEXT_FILTERS}
    span = params.get("range")
    if span is not None:
        if span not in RANGES:
            raise PageError(400, f"range {span!r} is not one of {', '.join(RANGES)}", user=user)
        given["since"] = repr(now - RANGES[span])
    for key, end_of_day in (("from", False), ("to", True)):
        day = params.get(key)
        if day is None:
            continue
        try:  # a day in the server's local time, as the pages show times
            start = time.mktime(time.strptime(day, "%Y-%m-%d"))
        except (ValueError, OverflowError):
            raise PageError(400, f"{key} {day!r} is not a date (YYYY-MM-DD)", user=user) from None
        if end_of_day:
            given["until"] = repr(start + 86400)
        else:
            held = given.get("since")
            given["since"] = repr(max(float(held), start) if held else start)
    given["reviewed"] = params.get("reviewed")
    given["disagreement"] = params.get("disagreement")
    try:
        return parse_filter(given)
    except ReviewError as exc:
        raise PageError(400, str(exc), user=user) from None


def _export_url(f: DecisionFilter) -> str:
    query: dict[str, str] = {n: v for n in TEXT_FILTERS if (v := getattr(f, n)) is not None}
    if f.since is not None:
        query["since"] = repr(f.since)
    if f.until is not None:
        query["until"] = repr(f.until)
    if f.reviewed is not None:
        query["reviewed"] = "yes" if f.reviewed else "no"
    if f.disagreement is not None:
        query["disagreement"] = "yes" if f.disagreement else "no"
    return "/api/v1/decisions/export.csv?" + urllib.parse.urlencode(query)


def _picture(decision_id: str, device_id: str, size: tuple[int, int] | None) -> Picture | None:
    return None if size is None else Picture(image_url(decision_id, device_id), *size)


def review_router(pages: Pages, engine: Engine) -> APIRouter:
    """The decision list and decision pages over ``engine``, and the review form's post."""
    router = APIRouter(prefix=f"{PREFIX}/decisions", include_in_schema=False)

    @router.get("")
    def list_page(request: Request, cursor: str = "") -> HTMLResponse:
        user = signed_in_(request)
        params = _params(request)
        f = _filter(params, time.time(), user)
        try:
            after = decode_cursor(cursor) if cursor else None
            page = list_decisions(engine, f, after=after, limit=DEFAULT_LIMIT)
            acc_filter = DecisionFilter(
                line=f.line, model_version=f.model_version, device=f.device, site=f.site,
                since=f.since, until=f.until,
            )  # fmt: skip
            groups = accuracy(engine, ACCURACY_GROUP, acc_filter)
        except ReviewError as exc:
            raise PageError(400, str(exc), user=user) from None
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != "confirmed"]
        here = request.url.path + (f"?{urllib.parse.urlencode(kept)}" if kept else "")
        next_url = None
        if page.next_cursor is not None:
            next_url = "?" + urllib.parse.urlencode(
                params | {"cursor": encode_cursor(page.next_cursor)}
            )
        pairs = queries.sites_and_lines(engine)
        known_devices, known_versions = queries.filter_choices(engine)
        keys = [(r.device_id, r.id) for r in page.rows]
        outputs = queries.decision_outputs(engine, keys)
        images = image_sizes_by_device(engine, keys)
        shadows = shadow_outcomes(engine, keys)
        thumbs = [
            draw(
                boxes_of(outputs.get((r.device_id, r.id))),
                image=_picture(r.id, r.device_id, images.get((r.device_id, r.id))),
                frame=frame_of(outputs.get((r.device_id, r.id))),
                within=THUMB,
                label="boxes",
            )
            for r in page.rows
        ]
        values: dict[str, Any] = {
            "rows": list(zip(page.rows, thumbs, strict=True)),
            "shadows": shadows,
            "params": params,
            "first_url": "?" + urllib.parse.urlencode(params),
            "next_url": next_url,
            "paged": bool(cursor),
            "here": here,
            "export_url": _export_url(f),
            "can_export": user.can("decisions:export"),
            "groups": groups,
            "sites": sorted({s for s, _ in pairs if s}),
            "lines": sorted({ln for _, ln in pairs if ln}),
            "known_devices": known_devices,
            "known_versions": known_versions,
            "outcomes": OUTCOMES,
            "ranges": list(RANGES),
            "can_review": user.can("decisions:review"),
            "confirmed": request.query_params.get("confirmed", "")[:6],
        }
        return pages.render(request, "decisions.html", values, user=user)

    def detail(
        request: Request, user: Principal, decision_id: str, *, device: str | None = None,
        error: str = "", done: str = "", back: str = "", status: int = 200,
    ) -> HTMLResponse:  # fmt: skip
        try:
            d = get_decision(engine, decision_id, device)
        except UnknownDecision:
            raise PageError(404, f"no decision {decision_id!r}", user=user) from None
        except ReviewError as exc:  # an id several devices used, and no device named
            raise PageError(400, str(exc), user=user) from None
        device_id = d.summary.device_id
        key = (device_id, decision_id)
        outputs = d.payload.get("outputs")
        boxes = boxes_of(outputs)
        picture = _picture(decision_id, device_id, image_sizes_by_device(engine, [key]).get(key))
        frame = frame_of(outputs)
        drawing = draw(boxes, image=picture, frame=frame, label=f"decision {d.summary.id}",
                       lazy=False)  # fmt: skip
        back_url = safe_next(back) if back else f"{PREFIX}/decisions"
        listed = _list_filter(back_url, time.time(), user)
        queue = None
        if listed is not None:
            at = place(engine, listed, d.summary)
            queue = {
                "left": at.left,
                "more": at.more,
                "next_url": (
                    _decision_url(at.next.id, at.next.device_id, back_url) if at.next else None
                ),
            }
        values = {
            "d": d,
            "s": d.summary,
            "shadow": d.shadow,
            "comparison": comparison_url(decision_id, device_id) if d.shadow else None,
            "shadow_said": (
                (summary(d.shadow.live.outputs), summary(d.shadow.candidate.outputs))
                if d.shadow
                else ("", "")
            ),
            "live_colour": LIVE_HEX,
            "candidate_colour": CANDIDATE_HEX,
            "frame": drawing,
            "picture": picture,
            "frame_size": frame,
            "boxes": boxes,
            "outputs": outputs if isinstance(outputs, dict) else {},
            "outcomes": sorted(
                {*OUTCOMES, d.summary.outcome, *([d.shadow.candidate.outcome] if d.shadow else [])}
            ),
            "can_review": user.can("decisions:review"),
            "error": error,
            "done": done,
            "back": back_url,
            "queue": queue,
            "policy": policy_text(d.payload.get("thresholds")),
        }
        return pages.render(request, "decision.html", values, user=user, status=status)

    @router.post("/confirm")
    async def confirm_picked(request: Request) -> Response:
        """Confirm the decisions ticked in the list (``pick-<n>`` fields, each
        ``<device>/<decision id>``) in one go; back to the list, which says how many."""
        user, fields = await posted(request, "decisions:review")
        picked = [v.split("/", 1) for k, v in sorted(fields.items()) if k.startswith("pick-")]
        back = safe_next(fields.get("back", "")) if fields.get("back") else f"{PREFIX}/decisions"
        keys = [(p[0], p[1]) for p in picked if len(p) == 2 and p[0] and p[1]]
        if not keys:
            raise PageError(400, "tick at least one decision to confirm", user=user)
        note(request, confirmed=len(keys))

        def confirm_all() -> int:
            for device_id, decision_id in keys:
                save_review(engine, decision_id, device_id=device_id, verdict="confirm",
                            outcome=None, note="", reviewer=user.name)  # fmt: skip
            return len(keys)

        try:
            done = await run_in_threadpool(confirm_all)
        except (UnknownDecision, ReviewError) as exc:
            raise PageError(400, f"not all confirmed: {exc}", user=user) from None
        joiner = "&" if "?" in back else "?"
        return RedirectResponse(
            f"{back}{joiner}confirmed={done}", status_code=303, headers=SECURITY_HEADERS
        )

    @router.get("/{decision_id}")
    def show(
        request: Request, decision_id: str, device: str | None = None, done: str = "",
        back: str = "",
    ) -> HTMLResponse:  # fmt: skip
        user = signed_in_(request)
        return detail(
            request, user, decision_id, device=device, done="reviewed" if done else "", back=back
        )

    @router.post("/{decision_id}/review")
    async def review(request: Request, decision_id: str, device: str | None = None) -> Response:
        user, fields = await posted(request, "decisions:review")
        verdict = fields.get("verdict", "")
        outcome = fields.get("outcome", "").strip() or None
        if verdict == "confirm":
            outcome = None  # the form's outcome choice is for overrides
        back = fields.get("back", "")
        try:
            await run_in_threadpool(
                lambda: save_review(engine, decision_id, device_id=device, verdict=verdict,
                                    outcome=outcome, note=fields.get("note", ""),
                                    reviewer=user.name)
            )  # fmt: skip
        except UnknownDecision:
            raise PageError(404, f"no decision {decision_id!r}", user=user) from None
        except BadReview as exc:
            why = str(exc)
            return await run_in_threadpool(
                lambda: detail(
                    request, user, decision_id, device=device, error=why, back=back, status=400
                )
            )
        except ReviewError as exc:
            raise PageError(400, str(exc), user=user) from None
        back_url = safe_next(back) if back else f"{PREFIX}/decisions"
        target = _decision_url(decision_id, device or "", back_url, done=True)
        if fields.get("then") == "next":  # save and next: the next one of the same filter
            target = await run_in_threadpool(_after, user, decision_id, device, back_url)
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    def _after(user: Principal, decision_id: str, device: str | None, back_url: str) -> str:
        """Where "save and next" goes: the filter's next decision to review, or the list
        when none is left."""
        listed = _list_filter(back_url, time.time(), user)
        if listed is None:
            return back_url
        following = place(engine, listed, get_decision(engine, decision_id, device).summary).next
        if following is None:
            return back_url
        return _decision_url(following.id, following.device_id, back_url, done=True)

    return router
