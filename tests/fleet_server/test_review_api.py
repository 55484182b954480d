"""The decision review endpoints over real HTTP: a FleetServer in this process on SQLite
and on PostgreSQL, users with real argon2id hashes, the session cookie and CSRF token
kept as the console's pages will (tests/fleet_server/auth_client.py)."""

from __future__ import annotations

import csv
import io
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from fleet_server.auth import add_user
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.db.tables import decision_review_log
from fleet_server.review import COLUMNS, encode_cursor, parse_filter
from fleet_server.review.filters import Cursor
from fleet_server.serve import FleetServer
from tests.fleet_server.auth_client import PASSWORD, Browser
from tests.fleet_server.fleet_api_support import (
    HTTP_TIMEOUT_S,
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    LocalRolloutOps,
    RunningApi,
    api_config,
    make_repository,
)
from tests.fleet_server.review_data import T0, Fleet, decision, mixed_fleet, store_rows
from tests.fleet_server.users_support import USERS_HASHER

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("review-repo"))


@pytest.fixture
def api(
    tmp_path: Path,
    repository: tuple[Path, Path],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[RunningApi]:
    """On SQLite and on PostgreSQL, with users olga (operator), lena (line-manager) and
    vic (viewer)."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    server = FleetServer(
        api_config(tmp_path / "state", *repository, db_url=db_url), services=[LocalRolloutOps]
    )
    server.start()
    try:
        for name, role in (("olga", "operator"), ("lena", "line-manager"), ("vic", "viewer")):
            add_user(server.context.engine, USERS_HASHER, name, role, PASSWORD)
        yield RunningApi(server)
    finally:
        server.stop()


def signed_in(api: RunningApi, username: str) -> Browser:
    browser = Browser(api.url)
    reply = browser.login(username)
    assert reply.status == 200, reply.body
    return browser


def get_text(browser: Browser, path: str) -> tuple[int, str, dict[str, str]]:
    """A GET whose answer is text (the CSV export), with the browser's cookie."""
    head = {"Cookie": f"{COOKIE_NAME}={browser.session}"}
    req = urllib.request.Request(browser.base + path, headers=head)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            return (
                resp.status,
                resp.read().decode(),
                {k.lower(): v for k, v in resp.headers.items()},
            )
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), {}


def q(**params: str) -> str:
    return "?" + urllib.parse.urlencode(params) if params else ""


def log_count(api: RunningApi) -> int:
    with api.ctx.engine.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(decision_review_log)).scalar_one()
        )


def test_a_viewer_lists_filters_and_pages_through_decisions(api: RunningApi) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    vic = signed_in(api, "vic")
    seen: list[str] = []
    path = "/api/v1/decisions" + q(line="2", outcome="pass", limit="4")
    for _ in range(50):
        page = vic.call("GET", path)
        assert page.status == 200, page.body
        assert page.headers["server-timing"].startswith("list;dur=")
        seen += [r["id"] for r in page.body["rows"]]
        if page.body["next_cursor"] is None:
            break
        path = "/api/v1/decisions" + q(
            line="2", outcome="pass", limit="4", cursor=page.body["next_cursor"]
        )
    f_ids = [
        r.id
        for r in sorted(fleet.rows, key=lambda r: (r.decision_time, r.id), reverse=True)
        if fleet.line(r) == "2" and r.outcome == "pass"
    ]
    assert seen == f_ids
    row = vic.call("GET", "/api/v1/decisions" + q(device="d-b2", limit="1")).body["rows"][0]
    assert set(row) >= {
        "id", "ts", "device_id", "site", "line", "source", "outcome", "model_name",
        "model_version", "top_score", "reviewed", "reviewed_outcome",
    }  # fmt: skip
    assert (row["site"], row["line"], row["reviewed"], row["top_score"]) == (
        "south",
        "2",
        False,
        0.9,
    )


def test_decisions_of_one_part_or_station_are_listed_with_their_station_fields(
    api: RunningApi,
) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    vic = signed_in(api, "vic")
    answer = vic.call("GET", "/api/v1/decisions" + q(part_id="P-0000"))
    assert answer.status == 200, answer.body
    rows = answer.body["rows"]
    assert [r["id"] for r in rows] == fleet.expected(parse_filter({"part_id": "P-0000"}))
    assert [(r["station"], r["part_id"]) for r in rows] == [
        ("st-b", "P-0000"), ("st-b", "P-0000"), ("st-a", "P-0000"), ("st-a", "P-0000"),
    ]  # fmt: skip
    late = next(r for r in fleet.rows if r.deadline_missed)
    (shown,) = [r for r in rows if r["id"] == late.id]  # n = 1: the first late one
    assert shown["deadline_missed"] is True
    assert sum(r["deadline_missed"] for r in rows) == 1
    st_b = vic.call("GET", "/api/v1/decisions" + q(station="st-b", outcome="reject", limit="500"))
    assert [r["id"] for r in st_b.body["rows"]] == fleet.expected(
        parse_filter({"station": "st-b", "outcome": "reject"})
    )
    assert st_b.body["rows"]
    free = vic.call("GET", "/api/v1/decisions" + q(device="d-x9", limit="1")).body["rows"][0]
    assert (free["station"], free["part_id"], free["deadline_missed"]) == ("", "", False)
    detail = vic.call("GET", f"/api/v1/decisions/{late.id}").body
    assert (detail["station"], detail["part_id"], detail["deadline_missed"]) == (
        late.station,
        late.part_id,
        True,
    )
    lena = signed_in(api, "lena")
    status, text, _ = get_text(lena, "/api/v1/decisions/export.csv" + q(part_id="P-0000"))
    assert status == 200
    exported = list(csv.DictReader(io.StringIO(text)))
    assert [(r["id"], r["deadline_missed"]) for r in exported] == [
        (r["id"], "yes" if r["deadline_missed"] else "no") for r in rows
    ]
    assert {r["part_id"] for r in exported} == {"P-0000"}


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"cursor": "garbage"}, "cursor"),
        ({"cursor": encode_cursor(Cursor(1.0, "x"))[:-3]}, "cursor"),
        ({"since": "last tuesday"}, "since"),
        ({"until": "2025-01-01T00:00:00"}, "until"),
        ({"reviewed": "sometimes"}, "reviewed"),
        ({"outcome": ""}, "outcome"),
        ({"part_id": ""}, "part_id"),
        ({"part_id": "P-\x07"}, "part_id"),
        ({"station": "s" * 201}, "station"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"lines": "2"}, "lines"),
    ],
)
def test_a_bad_cursor_or_filter_is_a_400_naming_the_parameter(
    api: RunningApi, query: dict[str, str], param: str
) -> None:
    lena = signed_in(api, "lena")
    answer = lena.call("GET", "/api/v1/decisions" + q(**query))
    assert answer.status == 400, answer.body
    assert param in answer.body["detail"].split(":")[0], answer.body
    if query != {"limit": "501"}:  # an export may hold more rows than a page
        assert get_text(lena, "/api/v1/decisions/export.csv" + q(**query))[0] == 400


def test_a_repeated_filter_is_refused(api: RunningApi) -> None:
    answer = signed_in(api, "vic").call("GET", "/api/v1/decisions?line=1&line=2")
    assert answer.status == 400
    assert answer.body["detail"].startswith("line: given more than once")


def test_detail_has_outputs_boxes_thresholds_latencies_and_says_there_is_no_image(
    api: RunningApi,
) -> None:
    fleet = Fleet()
    fleet.add_device(api.ctx.engine, "d1", site="north", line="4")
    row = decision(
        "d1",
        T0,
        outcome="reject",
        outputs={"count": 1, "boxes": [{"box": [10, 20, 30, 40], "score": 0.81, "label": "dent"}]},
        thumbnail="/var/lib/edgefleet/thumbs/x.jpg",
    )
    store_rows(api.ctx.engine, fleet, [row])
    shown = signed_in(api, "vic").call("GET", f"/api/v1/decisions/{row.id}")
    assert shown.status == 200, shown.body
    body = shown.body
    assert body["boxes"] == [
        {"box": [10.0, 20.0, 30.0, 40.0], "score": 0.81, "label": "dent", "kind": "detection"}
    ]
    assert body["thresholds"] == {"reject_below": 0.6}
    assert body["latencies_ms"] == {"inference": 10.0, "e2e": 12.5}
    assert (body["bundle_digest"], body["model_version"]) == ("sha256:1.0.0", "1.0.0")
    assert (body["top_score"], body["top_label"]) == (0.81, "dent")
    assert body["image"] is None
    assert body["image_note"].startswith("No image uploaded")
    assert (body["image_width"], body["image_height"]) == (None, None)
    assert body["thumbnail_on_device"] == "/var/lib/edgefleet/thumbs/x.jpg"
    assert body["device_labels"] == {"site": "north", "line": "4"}
    assert body["review"] is None
    assert body["history"] == []
    assert body["payload"]["input_digest"] == row.input_digest
    missing = signed_in(api, "vic").call("GET", "/api/v1/decisions/nope")
    assert missing.status == 404
    assert "no such decision" in missing.body["detail"]


def test_a_line_manager_s_review_is_stored_with_user_and_time_and_shows_everywhere(
    api: RunningApi,
) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    row = fleet.rows[1]
    assert row.outcome == "reject"
    lena = signed_in(api, "lena")
    saved = lena.call(
        "POST",
        f"/api/v1/decisions/{row.id}/review",
        {"verdict": "override", "outcome": "pass", "note": "dust on the lens"},
    )
    assert saved.status == 200, saved.body
    assert (saved.body["reviewer"], saved.body["decided"], saved.body["outcome"]) == (
        "lena",
        "reject",
        "pass",
    )
    assert abs(saved.body["reviewed_at"] - time.time()) < 600
    detail = lena.call("GET", f"/api/v1/decisions/{row.id}").body
    assert detail["review"] == saved.body
    assert detail["history"] == [saved.body]
    assert (detail["reviewed"], detail["reviewed_outcome"]) == (True, "pass")
    listed = lena.call("GET", "/api/v1/decisions" + q(reviewed="yes")).body["rows"]
    assert [(r["id"], r["reviewed_outcome"]) for r in listed] == [(row.id, "pass")]
    status, text, headers = get_text(lena, "/api/v1/decisions/export.csv" + q(reviewed="yes"))
    assert status == 200
    assert headers["content-type"].startswith("text/csv")
    assert "attachment" in headers["content-disposition"]
    (exported,) = list(csv.DictReader(io.StringIO(text)))
    assert (exported["id"], exported["reviewed"], exported["reviewed_outcome"]) == (
        row.id,
        "yes",
        "pass",
    )
    assert (exported["reviewer"], exported["review_note"], exported["outcome"]) == (
        "lena",
        "dust on the lens",
        "reject",
    )
    labels = lena.call("GET", "/api/v1/labels?since=0").body
    assert [(x["decision_id"], x["label"]) for x in labels["labels"]] == [(row.id, "pass")]
    assert labels["next_since"] == saved.body["seq"]
    assert lena.call("GET", f"/api/v1/labels?since={labels['next_since']}").body["labels"] == []


def test_a_viewer_can_neither_review_nor_export_and_nothing_is_stored(api: RunningApi) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    vic = signed_in(api, "vic")
    refused = vic.call(
        "POST", f"/api/v1/decisions/{fleet.rows[0].id}/review", {"verdict": "confirm"}
    )
    assert refused.status == 403
    assert refused.body["detail"] == "'vic' (viewer) may not decisions:review"
    assert log_count(api) == 0
    assert vic.call("GET", f"/api/v1/decisions/{fleet.rows[0].id}").body["review"] is None
    status, text, _ = get_text(vic, "/api/v1/decisions/export.csv")
    assert status == 403
    assert "decisions:export" in text
    assert vic.call("GET", "/api/v1/labels").status == 403


def test_a_review_without_the_csrf_token_is_refused_and_nothing_is_stored(
    api: RunningApi,
) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    lena = signed_in(api, "lena")
    path = f"/api/v1/decisions/{fleet.rows[0].id}/review"
    missing = lena.call("POST", path, {"verdict": "confirm"}, csrf=False)
    wrong = lena.call("POST", path, {"verdict": "confirm"}, csrf="not-the-token")
    assert (missing.status, wrong.status) == (403, 403)
    assert "CSRF token missing" in missing.body["detail"]
    assert log_count(api) == 0
    bearer = api.call("POST", path, {"verdict": "confirm", "note": "by script"})
    assert bearer.status == 200
    assert bearer.body["reviewer"] == "@operator-token"


def test_bad_reviews_are_400s_naming_the_field(api: RunningApi) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    lena = signed_in(api, "lena")
    path = f"/api/v1/decisions/{fleet.rows[1].id}/review"  # decided 'reject'
    for body, field in (
        ({"verdict": "override"}, "outcome"),
        ({"verdict": "override", "outcome": "reject"}, "outcome"),
        ({"verdict": "confirm", "outcome": "pass"}, "outcome"),
        ({"verdict": "approve"}, "verdict"),
        ({"verdict": "confirm", "colour": "red"}, "colour"),
    ):
        answer = lena.call("POST", path, body)
        assert answer.status == 400, (body, answer.body)
        assert field in answer.body["detail"], (body, answer.body)
    assert log_count(api) == 0
    unknown = lena.call("POST", "/api/v1/decisions/nope/review", {"verdict": "confirm"})
    assert unknown.status == 404


def test_accuracy_per_line_and_model_version_over_http(api: RunningApi) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    lena = signed_in(api, "lena")
    line_1 = [r for r in fleet.rows if fleet.line(r) == "1" and r.model_version == "1.0.0"][:4]
    for row in line_1[:3]:
        assert (
            lena.call("POST", f"/api/v1/decisions/{row.id}/review", {"verdict": "confirm"}).status
            == 200
        )
    other = "pass" if line_1[3].outcome != "pass" else "reject"
    lena.call(
        "POST",
        f"/api/v1/decisions/{line_1[3].id}/review",
        {"verdict": "override", "outcome": other},
    )
    vic = signed_in(api, "vic")
    answer = vic.call("GET", "/api/v1/decisions/accuracy?group=line,model_version")
    assert answer.status == 200, answer.body
    (group,) = answer.body["groups"]
    assert group["key"] == {"line": "1", "model_version": "1.0.0"}
    assert (group["reviewed"], group["confirmed"], group["overridden"]) == (4, 3, 1)
    assert group["accuracy"] == pytest.approx(0.75)
    assert answer.body["total"]["reviewed"] == 4
    bad = vic.call("GET", "/api/v1/decisions/accuracy?group=colour")
    assert bad.status == 400
    assert bad.body["detail"].startswith("group:")
    assert vic.call("GET", "/api/v1/decisions/accuracy?outcome=pass").status == 400


def test_export_has_every_column_of_the_filtered_view_and_refuses_too_many(
    api: RunningApi,
) -> None:
    fleet = mixed_fleet(api.ctx.engine)
    lena = signed_in(api, "lena")
    status, text, _ = get_text(lena, "/api/v1/decisions/export.csv" + q(site="south"))
    assert status == 200
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    rows = list(reader)
    expected = [
        r.id
        for r in sorted(fleet.rows, key=lambda r: (r.decision_time, r.id), reverse=True)
        if fleet.labels[r.device_id].get("site") == "south"
    ]
    assert [r["id"] for r in rows] == expected
    assert {r["site"] for r in rows} == {"south"}
    status, text, _ = get_text(lena, "/api/v1/decisions/export.csv?limit=10")
    assert status == 400
    assert "limit" in text
