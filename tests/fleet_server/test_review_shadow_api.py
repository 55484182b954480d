"""Shadow disagreements over the decision review API, real HTTP on SQLite and on
PostgreSQL: ``?disagreement=1`` lists only the disagreeing decisions, a decision's JSON
carries its shadow comparison and which model its label agrees with, and
``comparison.png`` is a PNG with the candidate's box in the candidate's colour."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from fleet_server.auth import PasswordHasher, add_user
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.review.overlay import CANDIDATE_BGR, LEGEND_H, LIVE_BGR, MIN_WIDTH
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
from tests.fleet_server.test_review_shadow import CANDIDATE_BOX, FRAME, LIVE_BOX, SCALE, seed

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("shadow-review-repo"))


@pytest.fixture
def api(
    tmp_path: Path, repository: tuple[Path, Path], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningApi]:
    """On SQLite and on PostgreSQL, with a line manager lena."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    server = FleetServer(
        api_config(tmp_path / "state", *repository, db_url=db_url), services=[LocalRolloutOps]
    )
    server.start()
    try:
        add_user(server.context.engine, PasswordHasher(), "lena", "line-manager", PASSWORD)
        yield RunningApi(server)
    finally:
        server.stop()


def fetch(url: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def test_disagreements_are_listed_detailed_and_drawn_over_http(api: RunningApi) -> None:
    s = seed(api.ctx.engine)
    lena = Browser(api.url)
    assert lena.login("lena").status == 200
    page = lena.call("GET", "/api/v1/decisions?disagreement=1")
    assert page.status == 200, page.body
    assert [(r["device_id"], r["id"]) for r in page.body["rows"]] == [
        ("d1", s.labels.id),
        ("d1", s.boxes.id),
    ]
    others = lena.call("GET", "/api/v1/decisions?disagreement=no")
    assert {r["id"] for r in others.body["rows"]} == {s.agreeing.id, s.plain.id, s.twin.id}
    bad = lena.call("GET", "/api/v1/decisions?disagreement=maybe")
    assert bad.status == 400
    assert bad.body["detail"].startswith("disagreement:")

    detail = lena.call("GET", f"/api/v1/decisions/{s.boxes.id}?device=d1")
    assert detail.status == 200, detail.body
    shadow = detail.body["shadow"]
    assert shadow["agree"] is False
    assert shadow["live"]["model_version"] == "1.0.0"
    assert shadow["live"]["outcome"] == "reject"
    candidate = shadow["candidate"]
    assert (candidate["model_name"], candidate["model_version"]) == ("surface-check", "1.1.0")
    assert (candidate["release"], candidate["outcome"]) == (7, "pass")
    assert candidate["outputs"]["boxes"] == [{"box": CANDIDATE_BOX, "label": "dent", "score": 0.77}]
    assert (shadow["unmatched_live"], shadow["unmatched_candidate"]) == (1, 1)
    assert detail.body["label_agrees_with"] is None
    assert detail.body["outcome"] == "reject"  # the live decision is untouched
    review = lena.call("POST", f"/api/v1/decisions/{s.boxes.id}/review?device=d1",
                       {"verdict": "override", "outcome": "pass"})  # fmt: skip
    assert review.status == 200, review.body
    after = lena.call("GET", f"/api/v1/decisions/{s.boxes.id}?device=d1")
    assert after.body["label_agrees_with"] == "candidate"
    plain = lena.call("GET", f"/api/v1/decisions/{s.plain.id}")
    assert plain.body["shadow"] is None
    assert plain.body["label_agrees_with"] is None

    cookie = {"Cookie": f"{COOKIE_NAME}={lena.session}"}
    status, png, headers = fetch(api.url + shadow["image"], cookie)
    assert status == 200, png[:200]
    assert headers["content-type"] == "image/png"
    pixels = cv2.imdecode(np.frombuffer(png, dtype=np.uint8), cv2.IMREAD_COLOR)
    assert pixels.shape == (round(FRAME["height"] * SCALE) + LEGEND_H, MIN_WIDTH, 3)
    x1, y1, x2, _ = CANDIDATE_BOX
    top = pixels[round(y1 * SCALE), round((x1 + x2) / 2 * SCALE)]
    assert tuple(int(v) for v in top) == CANDIDATE_BGR
    lx1, ly1, lx2, _ = LIVE_BOX
    live_top = pixels[round(ly1 * SCALE), round((lx1 + lx2) / 2 * SCALE)]
    assert tuple(int(v) for v in live_top) == LIVE_BGR
    again, body, _ = fetch(api.url + shadow["image"], cookie | {"If-None-Match": headers["etag"]})
    assert (again, body) == (304, b"")

    missing, text, _ = fetch(
        api.url + f"/api/v1/decisions/{s.plain.id}/comparison.png?device=d1", cookie
    )
    assert missing == 404
    assert b"no shadow comparison" in text
    unsigned, _, _ = fetch(api.url + shadow["image"], {})
    assert unsigned == 401
