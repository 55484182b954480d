"""Decision review endpoints (docs/decision-review.md).

``GET /api/v1/decisions`` (a filtered page, keyset cursor), ``GET
/api/v1/decisions/{id}`` (one in whole), ``GET /api/v1/decisions/{id}/image`` (the JPEG
its device uploaded) and ``GET /api/v1/decisions/accuracy`` need ``fleet:read``; ``POST
/api/v1/decisions/{id}/review`` needs ``decisions:review`` (and, with the session
cookie, the CSRF token); ``GET /api/v1/decisions/export.csv`` and
``GET /api/v1/labels`` need ``decisions:export``. A malformed or unknown query
parameter is a 400 naming it.

A decision is (device, id): two devices may have used the same id. The endpoints of
one decision take ``?device=``; without it the id must name one decision, and an id
several devices used is a 400 naming ``device`` and listing them (never another
device's row). Each list row carries its ``path`` with the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine

from fleet_server.api.decision_models import (
    AccuracyOut,
    DecisionDetailOut,
    DecisionPageOut,
    LabelsOut,
    ReviewIn,
    ReviewOut,
    accuracy_out,
    detail_out,
    labels_out,
    page_out,
    review_out,
)
from fleet_server.api.models import error_responses
from fleet_server.auth.deps import Principal, require
from fleet_server.params import MAX_INT, number, whole
from fleet_server.review import (
    DEFAULT_CONFIDENCE,
    DEFAULT_LIMIT,
    FILTER_PARAMS,
    MAX_EXPORT_ROWS,
    MAX_LABELS,
    MAX_LIMIT,
    DecisionFilter,
    NoImage,
    NoShadow,
    ReviewError,
    UnknownDecision,
    accuracy,
    check_export_size,
    comparison_image,
    decision_image,
    decode_cursor,
    etag,
    export_csv,
    get_decision,
    labels_since,
    list_decisions,
    parse_filter,
    parse_group,
    save_review,
)
from fleet_server.review.images import image_sizes_by_device
from fleet_server.review.scores import MAX_CONFIDENCE, MIN_CONFIDENCE

READ = [require("fleet:read")]
MAX_PARAM = 1000
TIME_HELP = "Unix seconds or ISO 8601 with a zone"
NOT_FOUND = error_responses(e404="No such decision")
NO_IMAGE = error_responses(e404="No such decision, or no image of it uploaded")
IMAGE_CACHE = "private, max-age=86400"
"""A stored image never changes: the browser keeps it a day (private: it needs a sign-in)."""
DEFAULT_GROUP = "line,model_version"
ACCURACY_PARAMS = (
    "group", "line", "model_version", "device", "site", "since", "until", "confidence",
)  # fmt: skip


@contextmanager
def answering() -> Iterator[None]:
    """Turn review errors into HTTP answers: 404 for an unknown decision or a missing
    image, else 400 naming the parameter or field."""
    try:
        yield
    except (UnknownDecision, NoImage, NoShadow) as exc:
        raise HTTPException(404, str(exc)) from None
    except ReviewError as exc:
        raise HTTPException(400, str(exc)) from None


def known_params(*allowed: str) -> Callable[[Request], None]:
    """Dependency: a 400 naming any query parameter not in ``allowed``, or one given
    twice (a typo must not quietly widen a filter)."""

    def check(request: Request) -> None:
        params = request.query_params
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise HTTPException(
                400, f"{unknown[0]}: unknown parameter (known: {', '.join(allowed)})"
            )
        for name in allowed:
            if len(params.getlist(name)) > 1:
                raise HTTPException(400, f"{name}: given more than once")

    return check


def decision_filter(
    site: Annotated[str | None, Query(max_length=MAX_PARAM, description="Site label")] = None,
    line: Annotated[
        str | None, Query(max_length=MAX_PARAM, description="The row's line, else the label")
    ] = None,
    device: Annotated[str | None, Query(max_length=MAX_PARAM, description="Device id")] = None,
    source: Annotated[str | None, Query(max_length=MAX_PARAM, description="Camera/sensor")] = None,
    outcome: Annotated[str | None, Query(max_length=MAX_PARAM, description="Decided")] = None,
    model_version: Annotated[str | None, Query(max_length=MAX_PARAM)] = None,
    station: Annotated[
        str | None, Query(max_length=MAX_PARAM, description="Station (PLC trigger)")
    ] = None,
    part_id: Annotated[
        str | None, Query(max_length=MAX_PARAM, description="Part id the PLC passed (exact)")
    ] = None,
    since: Annotated[str | None, Query(description=TIME_HELP + " (at or after)")] = None,
    until: Annotated[str | None, Query(description=TIME_HELP + " (before)")] = None,
    reviewed: Annotated[str | None, Query(description="yes or no")] = None,
    disagreement: Annotated[
        str | None,
        Query(
            description="yes (1): only decisions a shadow candidate decided otherwise; "
            "no (0): only the others"
        ),
    ] = None,
) -> DecisionFilter:
    """Dependency: the filter of the list and the export (400 naming a bad parameter)."""
    given = {
        "site": site,
        "line": line,
        "device": device,
        "source": source,
        "outcome": outcome,
        "model_version": model_version,
        "station": station,
        "part_id": part_id,
        "since": since,
        "until": until,
        "reviewed": reviewed,
        "disagreement": disagreement,
    }
    with answering():
        return parse_filter(given)


def accuracy_filter(
    line: Annotated[str | None, Query(max_length=MAX_PARAM, description="Line reviewed")] = None,
    model_version: Annotated[str | None, Query(max_length=MAX_PARAM)] = None,
    device: Annotated[str | None, Query(max_length=MAX_PARAM, description="Device id")] = None,
    site: Annotated[str | None, Query(max_length=MAX_PARAM, description="Site label")] = None,
    since: Annotated[str | None, Query(description=TIME_HELP + " (decided at or after)")] = None,
    until: Annotated[str | None, Query(description=TIME_HELP + " (decided before)")] = None,
) -> DecisionFilter:
    """Dependency: the filter accuracy takes."""
    given = {
        "line": line,
        "model_version": model_version,
        "device": device,
        "site": site,
        "since": since,
        "until": until,
    }
    with answering():
        return parse_filter(given)


Filter = Annotated[DecisionFilter, Depends(decision_filter)]
Device = Annotated[
    str | None,
    Query(
        max_length=MAX_PARAM,
        description="The deciding device (needed when several devices used the id)",
    ),
]


def _matches(if_none_match: str, tag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``tag`` (or is ``*``); weak
    comparison, as RFC 9110 says for GET."""
    given = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in given or tag in given


class HasEngine(Protocol):
    """What the endpoints need of the server: its database (a
    :class:`~fleet_server.api.context.ServerContext` has it; so has the bench's stand-in)."""

    @property
    def engine(self) -> Engine: ...


def decisions_router(ctx: HasEngine) -> APIRouter:
    """The decision review endpoints, on ``ctx.engine``."""
    router = APIRouter(prefix="/api/v1", tags=["decisions"])
    list_params = Depends(known_params(*FILTER_PARAMS, "cursor", "limit"))
    export_params = Depends(known_params(*FILTER_PARAMS, "limit"))
    accuracy_params = Depends(known_params(*ACCURACY_PARAMS))

    @router.get("/decisions", dependencies=[*READ, list_params])
    def list_page(
        f: Filter,
        response: Response,
        cursor: Annotated[
            str | None, Query(max_length=MAX_PARAM, description="next_cursor of the last page")
        ] = None,
        limit: Annotated[int, whole("Rows", ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    ) -> DecisionPageOut:
        """Decisions matching every filter given, newest first, a page at a time. The
        ``Server-Timing`` header says how long the server took."""
        started = time.perf_counter()
        with answering():
            after = None if cursor is None else decode_cursor(cursor)
            page = list_decisions(ctx.engine, f, after=after, limit=limit)
        keys = [(r.device_id, r.id) for r in page.rows]
        out = page_out(page, limit, image_sizes_by_device(ctx.engine, keys))
        took_ms = (time.perf_counter() - started) * 1000
        response.headers["Server-Timing"] = f"list;dur={took_ms:.1f}"
        return out

    @router.get("/decisions/accuracy", dependencies=[*READ, accuracy_params])
    @router.get("/accuracy", dependencies=[*READ, accuracy_params])
    def accuracy_by_group(
        f: Annotated[DecisionFilter, Depends(accuracy_filter)],
        group: Annotated[
            str,
            Query(
                max_length=200,
                description="Comma-separated keys of line, model_name, model_version, "
                "device, decided ('' for one total)",
            ),
        ] = DEFAULT_GROUP,
        confidence: Annotated[
            float,
            number(
                "Confidence of the Wilson intervals (0.95: 95 %)",
                ge=MIN_CONFIDENCE,
                le=MAX_CONFIDENCE,
            ),
        ] = DEFAULT_CONFIDENCE,
    ) -> AccuracyOut:
        """Accuracy (confirmed / reviewed) per group, from the reviews, with its Wilson
        interval (accuracy_lower, accuracy_upper), and precision and recall of each
        outcome with theirs. Also at ``/api/v1/accuracy``."""
        with answering():
            keys = parse_group(group)
            groups = accuracy(ctx.engine, keys, f, confidence=confidence)
            return accuracy_out(keys, groups, confidence)

    @router.get(
        "/decisions/export.csv",
        dependencies=[require("decisions:export"), export_params],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/csv": {}}, "description": "The decisions as CSV."}},
    )
    def export(
        f: Filter,
        limit: Annotated[
            int, whole("Refuse more rows than this", ge=1, le=MAX_EXPORT_ROWS)
        ] = MAX_EXPORT_ROWS,
    ) -> StreamingResponse:
        """The filtered decisions (the list's filters) as CSV with the review columns,
        newest first, streamed; a 400 before anything is sent when more than ``limit``
        match."""
        with answering():
            check_export_size(ctx.engine, f, limit)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return StreamingResponse(
            export_csv(ctx.engine, f, max_rows=limit),
            media_type="text/csv; charset=utf-8",
            headers={
                "Content-Disposition": f'attachment; filename="decisions-{stamp}.csv"',
                "Cache-Control": "no-store",
            },
        )

    @router.get(
        "/decisions/{decision_id}",
        responses=NOT_FOUND,
        dependencies=[*READ, Depends(known_params("device"))],
    )
    def show(decision_id: str, device: Device = None) -> DecisionDetailOut:
        """One decision in whole: outputs, boxes, thresholds, latencies, model and
        bundle, the device's labels, the current review and the review history."""
        with answering():
            detail = get_decision(ctx.engine, decision_id, device)
        key = (detail.summary.device_id, decision_id)
        return detail_out(detail, image_sizes_by_device(ctx.engine, [key]).get(key))

    @router.get(
        "/decisions/{decision_id}/image",
        dependencies=[*READ, Depends(known_params("device"))],
        response_class=Response,
        responses={
            200: {"content": {"image/jpeg": {}}, "description": "The JPEG."},
            304: {"description": "Not modified (If-None-Match named its ETag)."},
            **NO_IMAGE,
        },
    )
    def image(
        decision_id: str,
        device: Device = None,
        if_none_match: Annotated[str | None, Header(max_length=MAX_PARAM)] = None,
    ) -> Response:
        """The thumbnail the decision's device kept of its frame and uploaded (the whole
        frame scaled down; the decision's boxes are in frame pixels, ``outputs.frame``
        gives the frame's size). A 404 names the decision when it is unknown or no image
        of it (by its own device) is stored. It never changes: cached a day, with an
        ETag."""
        with answering():
            record = decision_image(ctx.engine, decision_id, device)
        tag = etag(record.data)
        headers = {
            "ETag": tag,
            "Cache-Control": IMAGE_CACHE,
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
        }
        if if_none_match is not None and _matches(if_none_match, tag):
            return Response(status_code=304, headers=headers)
        return Response(record.data, media_type=record.content_type, headers=headers)

    @router.get(
        "/decisions/{decision_id}/comparison.png",
        dependencies=[*READ, Depends(known_params("device"))],
        response_class=Response,
        responses={
            200: {"content": {"image/png": {}}, "description": "The PNG."},
            304: {"description": "Not modified (If-None-Match named its ETag)."},
            **error_responses(e404="No such decision, or no shadow comparison of it"),
        },
    )
    def comparison(
        decision_id: str,
        device: Device = None,
        if_none_match: Annotated[str | None, Header(max_length=MAX_PARAM)] = None,
    ) -> Response:
        """Both models' outputs on the decision's image, for a decision a candidate in
        the device's shadow slot also decided: the live model's boxes and labels in
        blue, the candidate's in magenta, and a legend naming both versions with their
        outcomes (a classifier's top label and score as text). On a grey frame when
        the device uploaded no image. A 404 names the decision when it is unknown or
        has no shadow comparison. It may change once (the image can arrive after the
        comparison): revalidated by its ETag."""
        with answering():
            data = comparison_image(ctx.engine, decision_id, device)
        tag = etag(data)
        headers = {
            "ETag": tag,
            "Cache-Control": "private, no-cache",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
        }
        if if_none_match is not None and _matches(if_none_match, tag):
            return Response(status_code=304, headers=headers)
        return Response(data, media_type="image/png", headers=headers)

    @router.post(
        "/decisions/{decision_id}/review",
        responses=NOT_FOUND,
        dependencies=[Depends(known_params("device"))],
    )
    def review(
        decision_id: str,
        body: ReviewIn,
        principal: Annotated[Principal, require("decisions:review")],
        device: Device = None,
    ) -> ReviewOut:
        """Confirm or override the device's outcome, with a note; stored with the user
        and the time as the decision's ground-truth label (the history keeps every
        review)."""
        with answering():
            saved = save_review(
                ctx.engine,
                decision_id,
                device_id=device,
                verdict=body.verdict,
                outcome=body.outcome,
                note=body.note,
                reviewer=principal.name,
            )
        return review_out(saved)

    @router.get(
        "/labels",
        dependencies=[require("decisions:export"), Depends(known_params("since", "limit"))],
    )
    def labels(
        since: Annotated[int, whole("The last seq you stored (0: all)", ge=0, le=MAX_INT)] = 0,
        limit: Annotated[int, whole("Labels", ge=1, le=MAX_LABELS)] = 1000,
    ) -> LabelsOut:
        """Ground-truth labels set or changed after ``since``, in the order they were
        given; each decision once, with its newest label."""
        with answering():
            return labels_out(labels_since(ctx.engine, since, limit=limit), since)

    return router
