"""Decision review's pure parts: filters and their errors, the keyset cursor, the best
score of a row's outputs, a decision's line, the review rules and CSV cells."""

from __future__ import annotations

import base64
import json

import pytest

from fleet_server.review import (
    BadQuery,
    BadReview,
    Cursor,
    DecisionFilter,
    Review,
    decode_cursor,
    encode_cursor,
    line_of,
    parse_filter,
    parse_group,
    top_result,
)
from fleet_server.review.export import csv_row
from fleet_server.review.filters import check_limit, parse_time
from fleet_server.review.reviews import check_review
from fleet_server.review.rows import DecisionSummary


def test_a_filter_takes_text_values_times_and_reviewed() -> None:
    f = parse_filter(
        {
            "site": "north",
            "line": "3",
            "device": "d1",
            "source": "cam0",
            "outcome": "reject",
            "model_version": "1.2.0",
            "since": "2025-01-01T00:00:00Z",
            "until": "1735693200.5",
            "reviewed": "No",
        }
    )
    assert f == DecisionFilter(
        site="north",
        line="3",
        device="d1",
        source="cam0",
        outcome="reject",
        model_version="1.2.0",
        since=1735689600.0,
        until=1735693200.5,
        reviewed=False,
    )
    assert parse_filter({}) == DecisionFilter()
    assert parse_filter({"reviewed": "yes"}).reviewed is True


@pytest.mark.parametrize(
    ("params", "param", "words"),
    [
        ({"site": ""}, "site", "empty"),
        ({"line": "x" * 201}, "line", "longer than 200"),
        ({"device": "a\nb"}, "device", "control character"),
        ({"since": "yesterday"}, "since", "neither Unix seconds nor an ISO 8601"),
        ({"until": "2025-01-01T00:00:00"}, "until", "no time zone"),
        ({"since": "nan"}, "since", "not a finite"),
        ({"since": "100", "until": "100"}, "until", "not after since"),
        ({"reviewed": "perhaps"}, "reviewed", "not yes or no"),
    ],
)
def test_a_bad_filter_names_its_parameter(params: dict[str, str], param: str, words: str) -> None:
    with pytest.raises(BadQuery) as caught:
        parse_filter(params)
    assert caught.value.param == param
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"{param}: ")


def test_iso_times_with_an_offset_are_the_same_instant() -> None:
    assert parse_time("since", "2025-01-01T01:00:00+01:00") == parse_time(
        "since", "2025-01-01T00:00:00z"
    )


def test_a_cursor_round_trips_and_is_opaque_url_safe_text() -> None:
    cursor = Cursor(1735689600.123456, "0194f0a2-7c3e-7abc-8def-0123456789ab")
    text = encode_cursor(cursor)
    assert decode_cursor(text) == cursor
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a cursor!",
        "x" * 600,
        _b64([2, 1.0, "id"]),  # another version
        _b64([1, "1.0", "id"]),
        _b64([1, 1.0, ""]),
        _b64([1, True, "id"]),
        _b64({"ts": 1.0}),
        _b64([1, 1.0]),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_a_bad_cursor_is_refused_naming_the_cursor(text: str) -> None:
    with pytest.raises(BadQuery) as caught:
        decode_cursor(text)
    assert caught.value.param == "cursor"


def test_limits_and_groups_are_checked() -> None:
    assert check_limit(500) == 500
    for bad in (0, 501):
        with pytest.raises(BadQuery, match="limit"):
            check_limit(bad)
    assert parse_group("line, model_version") == ["line", "model_version"]
    assert parse_group("") == []
    with pytest.raises(BadQuery, match="'site' is not one of"):
        parse_group("line,site")
    with pytest.raises(BadQuery, match="twice"):
        parse_group("line,line")


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (
            {"top_k": [{"label": "ok", "score": 0.93}, {"label": "nok", "score": 0.07}]},
            (0.93, "ok"),
        ),
        ({"score": 0.4}, (0.4, None)),
        (
            {"count": 2, "boxes": [{"box": [0, 0, 1, 1], "score": 0.8, "label": "dent"}]},
            (0.8, "dent"),
        ),
        ({"count": 0, "boxes": []}, (None, None)),
        ({"score": "high"}, (None, None)),
        ({"score": True}, (None, None)),
        ("not a dict", (None, None)),
    ],
)
def test_the_top_score_comes_from_the_first_model_s_outputs(
    outputs: object, expected: tuple[float | None, str | None]
) -> None:
    assert top_result(outputs) == expected


def test_a_decision_counts_for_its_row_s_line_else_its_device_s_label() -> None:
    assert line_of({"line": "1"}, {"line": "2"}) == "1"
    assert line_of({"line": ""}, {"line": "2"}) == "2"
    assert line_of({}, {}) == ""


def test_review_rules() -> None:
    assert check_review("reject", "confirm", None, "ok") == ("confirm", "reject", "ok")
    assert check_review("reject", "confirm", "reject", "") == ("confirm", "reject", "")
    assert check_review("reject", "override", "pass", "a\nb") == ("override", "pass", "a\nb")
    cases = [
        ("approve", None, "", "verdict"),
        ("override", None, "", "outcome"),
        ("override", "reject", "", "outcome"),
        ("confirm", "pass", "", "outcome"),
        ("override", "x" * 201, "", "outcome"),
        ("override", "pass\x07", "", "outcome"),
        ("confirm", None, "x" * 2001, "note"),
        ("confirm", None, "\x1b[31m", "note"),
    ]
    for verdict, outcome, note, field in cases:
        with pytest.raises(BadReview) as caught:
            check_review("reject", verdict, outcome, note)
        assert caught.value.field == field


def test_a_csv_row_quotes_formula_text_but_not_numbers() -> None:
    review = Review(3, "pass", "override", "=1+1", "-x", "lena", 1735689600.0)
    row = DecisionSummary(
        id="i",
        ts=-1.5,
        capture_time=None,
        device_id="@d",
        site="",
        line="1",
        source="cam0",
        outcome="pass",
        model_name="m",
        model_version="1",
        bundle_digest="",
        top_score=0.5,
        top_label=None,
        e2e_ms=None,
        review=review,
    )
    cells = csv_row(row)
    assert cells[:5] == ["i", "-1.5", "1969-12-31T23:59:58.500+00:00", "", "'@d"]
    assert cells[-3:] == ["", "", "no"]  # a free-running decision's station columns
    assert cells[12:-3] == [
        "0.5",
        "",
        "",
        "yes",
        "override",
        "'=1+1",
        "'-x",
        "lena",
        "1735689600.0",
        "2025-01-01T00:00:00.000+00:00",
    ]
