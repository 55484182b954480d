"""Shadow disagreements in decision review, on SQLite and on PostgreSQL (db_fixtures):
the ``disagreement`` filter lists exactly the decisions whose shadow record (same device
and decision id) disagrees; a decision's detail carries the candidate's side and which
model its label agrees with; the drawing of both models' outputs has the candidate's
boxes in the candidate's colour and differs from a live-only drawing (pixels decoded
with OpenCV). Decisions, thumbnails and shadow records are stored the way ingest stores
them."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import pytest
from sqlalchemy.engine import Engine

from agent.wire.messages import DecisionRow, ThumbnailUpload
from agent.wire.quality import ShadowRecord, ShadowSide
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.quality.store import insert_shadow_records
from fleet_server.review import (
    BadQuery,
    DecisionFilter,
    NoShadow,
    accuracy,
    comparison_image,
    get_decision,
    list_decisions,
    parse_filter,
    save_review,
)
from fleet_server.review.overlay import (
    CANDIDATE_BGR,
    LEGEND_H,
    LINE_H,
    LIVE_BGR,
    MIN_WIDTH,
    SWATCH,
    Side,
    draw_comparison,
    legend_lines,
)
from hil.bench.seed_images import thumbnail
from tests.fleet_server.review_data import T0, Fleet, decision, store_rows

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db (SQLite and PostgreSQL), pg_cluster

FRAME = {"width": 640, "height": 480}
LIVE_BOX = [400.0, 200.0, 600.0, 400.0]
CANDIDATE_BOX = [100.0, 100.0, 300.0, 250.0]
SCALE = MIN_WIDTH / FRAME["width"]
"""The 320-pixel thumbnail of the 640-pixel frame is drawn at MIN_WIDTH: frame pixels x 0.75."""


def detections(box: list[float], label: str, score: float) -> dict[str, object]:
    return {"count": 1, "boxes": [{"box": box, "label": label, "score": score}], "frame": FRAME}


def classified(label: str, score: float) -> dict[str, object]:
    return {"top_k": [{"label": label, "score": score}]}


def record(
    row: DecisionRow, candidate: str, outputs: dict[str, object], *, ts: float
) -> ShadowRecord:
    """The shadow record of ``row``: the candidate 1.1.0 decided ``candidate``."""
    return ShadowRecord(
        decision_id=row.id,
        ts=ts,
        source=row.source,
        line=row.line,
        live=ShadowSide(
            model_name=row.model_name,
            model_version=row.model_version,
            outcome=row.outcome,
            latency_ms=11.0,
            outputs=dict(row.outputs),
        ),
        shadow=ShadowSide(
            model_name=row.model_name,
            model_version="1.1.0",
            release=7,
            outcome=candidate,
            latency_ms=14.5,
            outputs=outputs,
        ),
        agree=candidate == row.outcome,
        unmatched_live=1 if "boxes" in outputs else 0,
        unmatched_shadow=1 if "boxes" in outputs else 0,
        thumbnail="shadow-thumbnails/x.jpg" if candidate != row.outcome else None,
    )


@dataclass
class Seeded:
    fleet: Fleet
    boxes: DecisionRow
    """d1: live reject (a box), the candidate pass (another box); thumbnail stored."""
    agreeing: DecisionRow
    """d1: both pass."""
    labels: DecisionRow
    """d1: a classifier, live pass (ok), the candidate reject (scratch); no image."""
    plain: DecisionRow
    """d1: no shadow record."""
    twin: DecisionRow
    """d2: the same id as ``boxes``, no shadow record of its own."""


def seed(db: Engine) -> Seeded:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    fleet.add_device(db, "d2", line="2")
    boxes = decision("d1", T0 + 10, line="1", outcome="reject",
                     outputs=detections(LIVE_BOX, "scratch", 0.91))  # fmt: skip
    agreeing = decision("d1", T0 + 20, line="1", outcome="pass")
    labels = decision("d1", T0 + 30, line="1", outcome="pass", outputs=classified("ok", 0.91))
    plain = decision("d1", T0 + 40, line="1", outcome="reject")
    twin = boxes.model_copy(update={"device_id": "d2", "line": "2"})
    store_rows(db, fleet, [boxes, agreeing, labels, plain, twin])
    jpeg = thumbnail([LIVE_BOX], (640, 480), seed=3)
    assert SqlSink(db).store_thumbnails([ThumbnailUpload.of("d1", boxes.id, T0, jpeg)]) == 1
    mine = [
        record(boxes, "pass", detections(CANDIDATE_BOX, "dent", 0.77), ts=T0 + 10.2),
        record(agreeing, "pass", classified("ok", 0.95), ts=T0 + 20.2),
        record(labels, "reject", classified("scratch", 0.66), ts=T0 + 30.2),
    ]
    assert insert_shadow_records(db, "d1", mine) == 3
    # d2 disagrees on an id only d1 decided: no decision of d2 to list
    stray = record(agreeing, "reject", classified("scratch", 0.5), ts=T0 + 20.3)
    assert insert_shadow_records(db, "d2", [stray]) == 1
    return Seeded(fleet, boxes, agreeing, labels, plain, twin)


def listed(db: Engine, params: dict[str, str], limit: int = 50) -> list[tuple[str, str]]:
    """(device, id) of every row of the filter, page by page."""
    f = parse_filter(params)
    out: list[tuple[str, str]] = []
    after = None
    for _ in range(20):
        page = list_decisions(db, f, after=after, limit=limit)
        out += [(r.device_id, r.id) for r in page.rows]
        if page.next_cursor is None:
            return out
        after = page.next_cursor
    raise AssertionError("too many pages")


def test_the_disagreement_filter_lists_only_decisions_whose_own_shadow_disagrees(
    db: Engine,
) -> None:
    s = seed(db)
    newest_first = [("d1", s.labels.id), ("d1", s.boxes.id)]
    assert listed(db, {"disagreement": "1"}) == newest_first
    assert listed(db, {"disagreement": "yes"}, limit=1) == newest_first
    others = {("d1", s.agreeing.id), ("d1", s.plain.id), ("d2", s.twin.id)}
    assert set(listed(db, {"disagreement": "no"})) == others
    assert listed(db, {"disagreement": "1", "line": "2"}) == []
    assert listed(db, {"disagreement": "1", "outcome": "reject"}) == [("d1", s.boxes.id)]
    assert listed(db, {"disagreement": "1", "device": "d2"}) == []
    assert listed(db, {"disagreement": "1", "reviewed": "yes"}) == []
    save_review(db, s.boxes.id, device_id="d1", verdict="override", outcome="pass", note="",
                reviewer="lena")  # fmt: skip
    assert listed(db, {"disagreement": "1", "reviewed": "yes"}) == [("d1", s.boxes.id)]
    assert listed(db, {"disagreement": "1", "reviewed": "no"}) == [("d1", s.labels.id)]
    with pytest.raises(BadQuery, match=r"^disagreement:"):
        parse_filter({"disagreement": "maybe"})
    with pytest.raises(BadQuery, match=r"^disagreement:"):
        accuracy(db, [], DecisionFilter(disagreement=True))


def test_the_detail_carries_the_candidate_and_which_model_the_label_agrees_with(
    db: Engine,
) -> None:
    s = seed(db)
    detail = get_decision(db, s.labels.id)
    shadow = detail.shadow
    assert shadow is not None
    assert not shadow.agree
    assert (shadow.live.model_version, shadow.live.outcome) == ("1.0.0", "pass")
    cand = shadow.candidate
    assert (cand.model_name, cand.model_version, cand.release) == ("surface-check", "1.1.0", 7)
    assert cand.outcome == "reject"
    assert cand.outputs == classified("scratch", 0.66)
    assert cand.latency_ms == 14.5
    assert detail.label_agrees_with is None  # not labelled yet
    steps = [
        ("confirm", None, "live"),
        ("override", "reject", "candidate"),
        ("override", "review", "neither"),
    ]
    for verdict, outcome, right in steps:
        save_review(db, s.labels.id, verdict=verdict, outcome=outcome, note="", reviewer="lena")
        assert get_decision(db, s.labels.id).label_agrees_with == right
    save_review(db, s.agreeing.id, verdict="confirm", outcome=None, note="", reviewer="lena")
    both = get_decision(db, s.agreeing.id)
    assert both.shadow is not None
    assert both.shadow.agree
    assert both.label_agrees_with == "both"
    plain = get_decision(db, s.plain.id)
    assert plain.shadow is None
    assert plain.label_agrees_with is None
    twin = get_decision(db, s.twin.id, "d2")  # d1's shadow record is not d2's
    assert twin.shadow is None


def decoded(png: bytes) -> np.ndarray:
    assert png.startswith(b"\x89PNG"), png[:8]
    pixels = cv2.imdecode(np.frombuffer(png, dtype=np.uint8), cv2.IMREAD_COLOR)
    assert pixels is not None
    return pixels


def at(pixels: np.ndarray, x: float, y: float) -> tuple[int, int, int]:
    """The BGR pixel at frame pixel (x, y), as drawn."""
    b, g, r = pixels[round(y * SCALE), round(x * SCALE)]
    return int(b), int(g), int(r)


def test_the_comparison_draws_the_candidate_s_box_in_its_colour_beside_the_live_box(
    db: Engine,
) -> None:
    s = seed(db)
    pixels = decoded(comparison_image(db, s.boxes.id, "d1"))
    height = round(FRAME["height"] * SCALE)
    assert pixels.shape == (height + LEGEND_H, MIN_WIDTH, 3)
    x1, y1, x2, y2 = CANDIDATE_BOX
    mid_x, mid_y = (x1 + x2) / 2, (y1 + y2) / 2
    for x, y in ((mid_x, y1), (x1, mid_y), (x2, mid_y)):
        assert at(pixels, x, y) == CANDIDATE_BGR, (x, y)
    lx1, ly1, lx2, ly2 = LIVE_BOX
    for x, y in (((lx1 + lx2) / 2, ly1), (lx1, (ly1 + ly2) / 2), ((lx1 + lx2) / 2, ly2)):
        assert at(pixels, x, y) == LIVE_BGR, (x, y)
    assert at(pixels, mid_x, mid_y) not in (CANDIDATE_BGR, LIVE_BGR)  # inside: the image
    # the legend: a swatch of each colour under the image
    (sx1, sy1), (sx2, sy2) = SWATCH
    sx, sy = (sx1 + sx2) // 2, height + (sy1 + sy2) // 2
    assert tuple(int(v) for v in pixels[sy, sx]) == LIVE_BGR
    assert tuple(int(v) for v in pixels[sy + LINE_H, sx]) == CANDIDATE_BGR

    # the same image drawn with the live model alone: no candidate box, and it differs
    live = Side("live surface-check 1.0.0", "reject", s.boxes.outputs)
    alone = Side("candidate surface-check 1.1.0", "pass", {})
    thumb = thumbnail([LIVE_BOX], (640, 480), seed=3)
    image = cv2.imdecode(np.frombuffer(thumb, dtype=np.uint8), cv2.IMREAD_COLOR)
    live_only = draw_comparison(image, live, alone)
    assert live_only.shape == pixels.shape
    assert not np.array_equal(live_only, pixels)
    assert at(live_only, mid_x, y1) != CANDIDATE_BGR
    assert at(live_only, (lx1 + lx2) / 2, ly1) == LIVE_BGR
    differs = np.any(live_only != pixels, axis=2)
    top = round(y1 * SCALE)
    assert differs[top, round(x1 * SCALE) : round(x2 * SCALE)].all()  # the candidate's top edge


def test_without_an_image_a_classifier_s_comparison_is_drawn_on_a_grey_frame(
    db: Engine,
) -> None:
    s = seed(db)
    pixels = decoded(comparison_image(db, s.labels.id))
    assert pixels.shape[0] > LEGEND_H
    assert tuple(int(v) for v in pixels[5, 5]) == (96, 96, 96)
    with pytest.raises(NoShadow, match="no shadow comparison"):
        comparison_image(db, s.plain.id)
    with pytest.raises(NoShadow):
        comparison_image(db, s.twin.id, "d2")


def test_the_legend_names_both_versions_and_a_classifier_s_labels_and_scores() -> None:
    lines = legend_lines(
        Side("live surface-check 1.0.0", "pass", classified("ok", 0.91)),
        Side("candidate surface-check 1.1.0", "reject", classified("scratch", 0.66)),
    )
    assert lines == [
        "live surface-check 1.0.0: pass (ok 0.91)",
        "candidate surface-check 1.1.0: reject (scratch 0.66)",
    ]
    boxes = legend_lines(
        Side("live m 1", "reject", detections(LIVE_BOX, "scratch", 0.9)),
        Side("candidate m 2", "pass", {"boxes": [], "frame": FRAME}),
    )
    assert boxes == ["live m 1: reject (1 box)", "candidate m 2: pass (0 boxes)"]
    odd = legend_lines(Side("live m é", "x" * 80, {}), Side("c", "y", {"score": 0.25}))
    assert odd[0].startswith("live m ?: xxx")
    assert odd[0].endswith("...")
    assert len(odd[0]) == 60
    assert odd[1] == "c: y (score 0.25)"
