"""Decision review's library on SQLite and on PostgreSQL (db_fixtures): filters against
a plain-Python oracle, keyset pages, reviews and their history, labels, accuracy and
the CSV export. The decisions are stored through the ingest sink, as devices' uploads
are."""

from __future__ import annotations

import csv
import io

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from fleet_server.db.tables import decision_review_log, decision_reviews
from fleet_server.review import (
    COLUMNS,
    BadQuery,
    BadReview,
    DecisionFilter,
    UnknownDecision,
    accuracy,
    check_export_size,
    export_csv,
    get_decision,
    labels_since,
    list_decisions,
    parse_filter,
    save_review,
)
from fleet_server.review.query import SPLIT_DEVICES
from tests.fleet_server.review_data import T0, Fleet, decision, mixed_fleet, store_rows

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db (SQLite and PostgreSQL), pg_cluster

MAX_PAGES = 200


def walk(db: Engine, f: DecisionFilter, limit: int) -> list[list[str]]:
    """Every page of the filter, following the cursor (bounded)."""
    pages: list[list[str]] = []
    after = None
    for _ in range(MAX_PAGES):
        page = list_decisions(db, f, after=after, limit=limit)
        pages.append([r.id for r in page.rows])
        if page.next_cursor is None:
            return pages
        after = page.next_cursor
    raise AssertionError(f"more than {MAX_PAGES} pages")


def review_some(db: Engine, fleet: Fleet) -> None:
    """Review every seventh decision: every third of those overridden."""
    for k, row in enumerate(fleet.rows[::7]):
        if k % 3 == 0:
            label = "reject" if row.outcome != "reject" else "pass"
            save_review(db, row.id, verdict="override", outcome=label, note="", reviewer="lena")
        else:
            label = row.outcome
            save_review(db, row.id, verdict="confirm", outcome=None, note="", reviewer="lena")
        fleet.reviewed[row.id] = label


FILTERS = [
    {},
    {"site": "north"},
    {"site": "south"},
    {"site": "nowhere"},
    {"line": "1"},
    {"line": "2"},
    {"line": "3"},
    {"device": "d-b2"},
    {"device": "d-x9"},
    {"source": "cam1"},
    {"outcome": "review"},
    {"outcome": "pass"},
    {"model_version": "1.1.0"},
    {"since": str(T0 + 100), "until": str(T0 + 200)},
    {"reviewed": "yes"},
    {"reviewed": "no"},
    {"site": "south", "line": "1"},
    {"site": "north", "device": "d-b2"},
    {"line": "2", "outcome": "pass", "reviewed": "no"},
    {"line": "1", "model_version": "1.0.0", "source": "cam0"},
    {"reviewed": "yes", "line": "2", "outcome": "reject"},
    {"device": "d-c1", "line": "1", "since": str(T0 + 50)},
    {"part_id": "P-0003"},
    {"part_id": "P-0404"},
    {"station": "st-b"},
    {"station": "st-a", "outcome": "reject"},
    {"part_id": "P-0003", "line": "2"},  # d-b1 writes line 2, d-b2 none (its label: 2)
    {"part_id": "P-0007", "site": "north"},
    {"part_id": "P-0007", "device": "d-b2"},
    {"part_id": "P-0007", "reviewed": "yes"},
    {"part_id": "P-0008", "station": "st-b", "model_version": "1.0.0"},
    {"station": "st-b", "line": "2", "since": str(T0 + 100)},
]


@pytest.mark.parametrize(
    "params", FILTERS, ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()) or "none"
)
def test_each_filter_lists_exactly_the_matching_decisions_newest_first(
    db: Engine, params: dict[str, str]
) -> None:
    fleet = mixed_fleet(db)
    review_some(db, fleet)
    f = parse_filter(params)
    pages = walk(db, f, limit=7)
    assert [i for page in pages for i in page] == fleet.expected(f)


def test_keyset_pages_neither_repeat_nor_skip_rows_sharing_a_timestamp(db: Engine) -> None:
    fleet = mixed_fleet(db)
    ties = [r.decision_time for r in fleet.rows]
    assert len(set(ties)) * 4 == len(ties)  # every timestamp four times
    for limit in (1, 3, 4, 5, 50):
        pages = walk(db, DecisionFilter(), limit)
        flat = [i for page in pages for i in page]
        assert flat == fleet.expected(DecisionFilter())
        assert len(flat) == len(set(flat)) == 120
        assert all(len(p) == limit for p in pages[:-1])


def test_a_site_with_more_devices_than_split_reads_the_same_rows(db: Engine) -> None:
    fleet = mixed_fleet(db, big_site=SPLIT_DEVICES + 8)
    for params in ({"site": "big"}, {"line": "9"}, {"site": "big", "line": "9"}):
        f = parse_filter(params)
        expected = fleet.expected(f)
        assert len(expected) > SPLIT_DEVICES
        assert [i for page in walk(db, f, limit=6) for i in page] == expected


def test_a_new_decision_newer_than_the_cursor_does_not_shift_the_pages(db: Engine) -> None:
    fleet = mixed_fleet(db)
    first = list_decisions(db, DecisionFilter(), limit=10)
    store_rows(db, fleet, [decision("d-a1", T0 + 10_000)])
    second = list_decisions(db, DecisionFilter(), after=first.next_cursor, limit=10)
    assert [r.id for r in second.rows] == fleet.expected(DecisionFilter())[11:21]


def test_list_rows_carry_the_table_fields_and_the_review(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", site="north", line="4")
    det = decision(
        "d1",
        T0,
        outcome="reject",
        model_version="2.0.0",
        outputs={"count": 1, "boxes": [{"box": [1, 2, 3, 4], "score": 0.77, "label": "dent"}]},
    )
    store_rows(db, fleet, [det])
    save_review(db, det.id, verdict="override", outcome="pass", note="dust", reviewer="lena")
    (row,) = list_decisions(db, DecisionFilter()).rows
    assert (row.id, row.ts, row.device_id, row.site, row.line) == (det.id, T0, "d1", "north", "4")
    assert (row.source, row.outcome, row.model_name, row.model_version) == (
        "cam0",
        "reject",
        "surface-check",
        "2.0.0",
    )
    assert (row.top_score, row.top_label) == (0.77, "dent")
    assert row.review is not None
    assert (row.review.verdict, row.review.outcome, row.review.reviewer) == (
        "override",
        "pass",
        "lena",
    )
    assert (row.station, row.part_id, row.deadline_missed) == ("", "", False)


def test_a_station_decision_lists_with_its_station_fields_and_whole(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", site="north", line="4")
    late = decision("d1", T0, station="st-4", part_id="P-77 Ä", deadline_missed=True)
    store_rows(db, fleet, [late, decision("d1", T0 + 1, station="st-4", part_id="P-78")])
    (row,) = list_decisions(db, DecisionFilter(part_id="P-77 Ä")).rows
    assert (row.id, row.station, row.part_id, row.deadline_missed) == (
        late.id,
        "st-4",
        "P-77 Ä",
        True,
    )
    whole = get_decision(db, late.id).summary
    assert (whole.station, whole.part_id, whole.deadline_missed) == ("st-4", "P-77 Ä", True)


def test_a_review_is_stored_with_user_and_time_and_keeps_the_history(db: Engine) -> None:
    fleet = mixed_fleet(db)
    row = fleet.rows[1]  # outcome reject
    first = save_review(
        db, row.id, verdict="override", outcome="pass", note="dust", reviewer="lena", now=T0 + 5
    )
    second = save_review(
        db, row.id, verdict="confirm", outcome=None, note="no, real", reviewer="olga", now=T0 + 9
    )
    assert second.seq > first.seq
    detail = get_decision(db, row.id)
    assert detail.summary.review == second
    assert (second.decided, second.outcome, second.reviewer, second.reviewed_at) == (
        "reject",
        "reject",
        "olga",
        T0 + 9,
    )
    assert detail.history == [second, first]
    with db.connect() as conn:
        current = conn.execute(sa.select(decision_reviews)).all()
        log = conn.execute(sa.select(decision_review_log)).all()
    assert len(current) == 1
    assert len(log) == 2


@pytest.mark.parametrize(
    ("verdict", "outcome", "field"),
    [
        ("maybe", None, "verdict"),
        ("override", None, "outcome"),
        ("override", "reject", "outcome"),  # the device's own outcome
        ("confirm", "pass", "outcome"),  # a confirmation that changes it
        ("override", "  ", "outcome"),
    ],
)
def test_a_bad_review_is_refused_naming_the_field_and_nothing_is_stored(
    db: Engine, verdict: str, outcome: str | None, field: str
) -> None:
    fleet = mixed_fleet(db)
    row = fleet.rows[1]
    assert row.outcome == "reject"
    with pytest.raises(BadReview) as caught:
        save_review(db, row.id, verdict=verdict, outcome=outcome, note="", reviewer="lena")
    assert caught.value.field == field
    with pytest.raises(BadReview, match="note"):
        save_review(db, row.id, verdict="confirm", outcome=None, note="x\x00", reviewer="lena")
    with db.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(decision_review_log)).scalar() == 0
        )
    assert get_decision(db, row.id).summary.review is None


def test_reviewing_an_unknown_decision_is_refused(db: Engine) -> None:
    mixed_fleet(db)
    with pytest.raises(UnknownDecision):
        save_review(db, "no-such-id", verdict="confirm", outcome=None, note="", reviewer="lena")
    with pytest.raises(UnknownDecision):
        get_decision(db, "no-such-id")


def test_labels_come_in_review_order_each_decision_once_with_its_newest_label(
    db: Engine,
) -> None:
    fleet = mixed_fleet(db)
    a, b, c = fleet.rows[0], fleet.rows[1], fleet.rows[2]
    save_review(db, a.id, verdict="confirm", outcome=None, note="", reviewer="lena")
    save_review(db, b.id, verdict="override", outcome="pass", note="", reviewer="lena")
    first = labels_since(db, 0)
    assert [(x.decision_id, x.label) for x in first] == [(a.id, "pass"), (b.id, "pass")]
    cursor = first[-1].seq
    assert labels_since(db, cursor) == []
    save_review(db, c.id, verdict="confirm", outcome=None, note="", reviewer="olga")
    save_review(db, a.id, verdict="override", outcome="review", note="unsure", reviewer="olga")
    later = labels_since(db, cursor)
    assert [(x.decision_id, x.label, x.reviewer) for x in later] == [
        (c.id, "pass", "olga"),
        (a.id, "review", "olga"),
    ]
    assert later[1].input_digest == a.input_digest
    assert later[1].line == "1"
    assert [x.decision_id for x in labels_since(db, 0)] == [b.id, c.id, a.id]
    assert [x.decision_id for x in labels_since(db, 0, limit=1)] == [b.id]
    with pytest.raises(BadQuery, match="since"):
        labels_since(db, -1)


def test_accuracy_per_line_and_model_version_from_known_reviews(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", line="1")
    fleet.add_device(db, "d2", line="2")
    rows = [
        decision("d1", T0 + n, model_version="1.0.0", outcome="pass" if n % 2 else "reject")
        for n in range(6)
    ] + [decision("d2", T0 + n, line="2", model_version="1.1.0") for n in range(4)]
    store_rows(db, fleet, rows)
    # line 1 / 1.0.0: 4 confirmed, 2 overridden; line 2 / 1.1.0: 1 confirmed, 1 overridden
    for row in rows[:4] + rows[6:7]:
        save_review(db, row.id, verdict="confirm", outcome=None, note="", reviewer="lena")
    for row in rows[4:6] + rows[7:8]:
        label = "pass" if row.outcome == "reject" else "reject"
        save_review(db, row.id, verdict="override", outcome=label, note="", reviewer="lena")
    groups = accuracy(db, ["line", "model_version"], DecisionFilter())
    assert [(g.key, g.reviewed, g.confirmed, g.overridden) for g in groups] == [
        ({"line": "1", "model_version": "1.0.0"}, 6, 4, 2),
        ({"line": "2", "model_version": "1.1.0"}, 2, 1, 1),
    ]
    assert groups[0].accuracy == pytest.approx(4 / 6)
    assert groups[0].confusion == {
        ("pass", "pass"): 2,
        ("reject", "reject"): 2,
        ("pass", "reject"): 1,
        ("reject", "pass"): 1,
    }
    (total,) = accuracy(db, [], DecisionFilter())
    assert (total.key, total.reviewed, total.confirmed) == ({}, 8, 5)
    (only,) = accuracy(db, ["line"], DecisionFilter(line="2"))
    assert (only.key, only.reviewed) == ({"line": "2"}, 2)
    assert accuracy(db, ["line"], DecisionFilter(since=T0 + 100)) == []
    with pytest.raises(BadQuery, match="group"):
        accuracy(db, ["colour"], DecisionFilter())
    with pytest.raises(BadQuery, match="outcome"):
        accuracy(db, ["line"], DecisionFilter(outcome="pass"))


def _csv(db: Engine, f: DecisionFilter, **kw: int) -> list[dict[str, str]]:
    text = "".join(export_csv(db, f, **kw))
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    return list(reader)


def test_csv_export_holds_the_filtered_view_with_the_review_columns(db: Engine) -> None:
    fleet = mixed_fleet(db)
    review_some(db, fleet)
    f = parse_filter({"line": "2"})
    rows = _csv(db, f, batch=7)
    assert [r["id"] for r in rows] == fleet.expected(f)
    by_id = {r.id: r for r in fleet.rows}
    for out in rows:
        src = by_id[out["id"]]
        assert float(out["decision_time"]) == src.decision_time
        assert (out["device_id"], out["line"], out["outcome"]) == (
            src.device_id,
            "2",
            src.outcome,
        )
        assert out["reviewed"] == ("yes" if src.id in fleet.reviewed else "no")
        assert out["reviewed_outcome"] == fleet.reviewed.get(src.id, "")
        assert out["reviewer"] == ("lena" if src.id in fleet.reviewed else "")
        assert (out["station"], out["part_id"], out["deadline_missed"]) == (
            src.station,
            src.part_id,
            "yes" if src.deadline_missed else "no",
        )
    assert {r["deadline_missed"] for r in rows} == {"yes", "no"}
    assert len(_csv(db, DecisionFilter(), max_rows=120, batch=50)) == 120
    part = _csv(db, parse_filter({"part_id": "P-0001"}))
    assert [(r["station"], r["part_id"]) for r in part] == [
        ("st-b", "P-0001"),
        ("st-b", "P-0001"),
        ("st-a", "P-0001"),
        ("st-a", "P-0001"),
    ]
    assert COLUMNS[-3:] == ("station", "part_id", "deadline_missed")


def test_export_is_refused_before_it_starts_when_more_rows_match_than_allowed(
    db: Engine,
) -> None:
    mixed_fleet(db)
    assert check_export_size(db, DecisionFilter(), 120) == 120
    assert check_export_size(db, DecisionFilter(site="nowhere"), 1) == 0
    with pytest.raises(BadQuery, match="more than 119"):
        check_export_size(db, DecisionFilter(), 119)


def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_quoted(db: Engine) -> None:
    fleet = Fleet()
    fleet.add_device(db, "d1", site="=HYPERLINK(1)")
    row = decision("d1", T0, outcome="-2+3", station="st-1", part_id="=1+2")
    store_rows(db, fleet, [row])
    save_review(db, row.id, verdict="override", outcome="@SUM(A1)", note="+1", reviewer="lena")
    (out,) = _csv(db, DecisionFilter())
    assert (out["site"], out["outcome"], out["reviewed_outcome"], out["review_note"]) == (
        "'=HYPERLINK(1)",
        "'-2+3",
        "'@SUM(A1)",
        "'+1",
    )
    assert out["part_id"] == "'=1+2"


def test_a_deleted_decision_takes_its_reviews_and_their_seqs_are_not_reused(
    db: Engine,
) -> None:
    fleet = mixed_fleet(db)
    old, kept = fleet.rows[0], fleet.rows[1]
    save_review(db, kept.id, verdict="confirm", outcome=None, note="", reviewer="lena")
    gone = save_review(db, old.id, verdict="confirm", outcome=None, note="", reviewer="lena")
    with db.begin() as conn:  # retention deleting the newest-reviewed decision
        conn.execute(sa.text("DELETE FROM decisions WHERE id = :id"), {"id": old.id})
    assert [x.decision_id for x in labels_since(db, 0)] == [kept.id]
    with db.connect() as conn:
        left = conn.execute(sa.select(decision_review_log.c.decision_id)).scalars().all()
    assert left == [kept.id]
    again = save_review(db, kept.id, verdict="override", outcome="pass", note="", reviewer="o")
    assert again.seq > gone.seq
