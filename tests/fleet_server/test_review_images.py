"""A decision's image over real HTTP (``GET /api/v1/decisions/{id}/image``): a
FleetServer in this process on SQLite and on PostgreSQL, thumbnails stored the way ingest
stores them (wire ``ThumbnailUpload`` -> :class:`fleet_server.ingest.sqlsink.SqlSink`),
users of each role signed in with the session cookie the console's ``<img>`` sends."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.wire.messages import ThumbnailUpload
from fleet_server.auth import add_user
from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.ingest.sqlsink import SqlSink
from fleet_server.serve import FleetServer
from hil.bench.seed_images import thumbnail
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
from tests.fleet_server.review_data import T0, Fleet, decision, store_rows
from tests.fleet_server.users_support import USERS_HASHER

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db_url (SQLite and PostgreSQL), pg_cluster

USERS = {"olga": "operator", "lena": "line-manager", "vic": "viewer"}
BOX = {"box": [200.0, 150.0, 300.0, 230.0], "score": 0.91, "label": "scratch"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_repository(tmp_path_factory.mktemp("image-repo"))


@pytest.fixture
def api(
    tmp_path: Path,
    repository: tuple[Path, Path],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[RunningApi]:
    """On SQLite and on PostgreSQL, with a user of each role."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
    monkeypatch.setenv(TOKEN_ENV, OPERATOR_TOKEN)
    server = FleetServer(
        api_config(tmp_path / "state", *repository, db_url=db_url), services=[LocalRolloutOps]
    )
    server.start()
    try:
        for name, role in USERS.items():
            add_user(server.context.engine, USERS_HASHER, name, role, PASSWORD)
        yield RunningApi(server)
    finally:
        server.stop()


def fetch(url: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    """A GET whose answer may be binary: (status, body, headers with lower-case names)."""
    req = urllib.request.Request(url, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def session_of(api: RunningApi, name: str) -> dict[str, str]:
    browser = Browser(api.url)
    assert browser.login(name).status == 200
    return {"Cookie": f"{COOKIE_NAME}={browser.session}"}


def upload(api: RunningApi, device_id: str, decision_id: str, jpeg: bytes) -> None:
    """Store a thumbnail as ingest does when ``device_id`` publishes it."""
    message = ThumbnailUpload.of(device_id, decision_id, T0, jpeg)
    assert SqlSink(api.ctx.engine).store_thumbnails([message]) == 1


def test_each_role_gets_the_stored_jpeg_with_cache_headers_and_the_api_links_it(
    api: RunningApi,
) -> None:
    fleet = Fleet()
    fleet.add_device(api.ctx.engine, "d1", site="north", line="4")
    outputs = {"count": 1, "boxes": [BOX], "frame": {"width": 640, "height": 480}}
    row, plain = decision("d1", T0, outcome="reject", outputs=outputs), decision("d1", T0 + 1)
    store_rows(api.ctx.engine, fleet, [row, plain])
    jpeg = thumbnail([BOX["box"]], (640, 480), seed=1)
    upload(api, "d1", row.id, jpeg)
    path = f"/api/v1/decisions/{row.id}/image"
    tags = set()
    bearer = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    for who, head in [*((n, session_of(api, n)) for n in USERS), ("token", bearer)]:
        status, body, headers = fetch(api.url + path, head)
        assert status == 200, (who, body[:200])
        assert body == jpeg, who
        assert headers["content-type"] == "image/jpeg"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "private, max-age=86400"
        tags.add(headers["etag"])
    [tag] = tags  # the same bytes, the same tag, whoever asks
    again = fetch(api.url + path, {**bearer, "If-None-Match": tag})
    assert (again[0], again[1]) == (304, b"")
    changed = fetch(api.url + path, {**bearer, "If-None-Match": '"not-it"'})
    assert (changed[0], changed[1]) == (200, jpeg)
    shown = api.call("GET", f"/api/v1/decisions/{row.id}").body
    assert shown["image"] == path + "?device=d1"  # an id is the device's: the link names it
    assert (shown["image_width"], shown["image_height"]) == (320, 240)
    listed = {r["id"]: r["image"] for r in api.call("GET", "/api/v1/decisions").body["rows"]}
    assert listed == {row.id: path + "?device=d1", plain.id: None}


def test_an_unknown_decision_or_one_without_an_image_is_a_404_naming_it(
    api: RunningApi,
) -> None:
    fleet = Fleet()
    fleet.add_device(api.ctx.engine, "d1")
    row = decision("d1", T0)
    store_rows(api.ctx.engine, fleet, [row])
    bearer = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    missing = api.call("GET", "/api/v1/decisions/no-such-id/image")
    assert missing.status == 404
    assert missing.body["detail"] == "decision 'no-such-id': no such decision"
    bare = api.call("GET", f"/api/v1/decisions/{row.id}/image")
    assert bare.status == 404
    assert bare.body["detail"] == f"decision {row.id!r}: no image uploaded"
    assert fetch(api.url + f"/api/v1/decisions/{row.id}/image", bearer)[0] == 404
    stranger = fetch(api.url + f"/api/v1/decisions/{row.id}/image", {})
    assert stranger[0] == 401


def test_an_image_uploaded_by_another_device_is_not_served_with_the_decision(
    api: RunningApi,
) -> None:
    fleet = Fleet()
    fleet.add_device(api.ctx.engine, "d1")
    fleet.add_device(api.ctx.engine, "d2")
    row = decision("d1", T0, outcome="reject", outputs={"count": 1, "boxes": [BOX]})
    store_rows(api.ctx.engine, fleet, [row])
    upload(api, "d2", row.id, thumbnail([BOX["box"]], (640, 480), seed=2))  # d2 claims it
    served = api.call("GET", f"/api/v1/decisions/{row.id}/image")
    assert served.status == 404
    assert served.body["detail"] == f"decision {row.id!r}: no image uploaded"
    shown = api.call("GET", f"/api/v1/decisions/{row.id}").body
    assert (shown["image"], shown["image_width"]) == (None, None)
    assert [r["image"] for r in api.call("GET", "/api/v1/decisions").body["rows"]] == [None]


def test_two_devices_with_the_same_decision_id_each_get_their_own_row_review_and_image(
    api: RunningApi,
) -> None:
    fleet = Fleet()
    fleet.add_device(api.ctx.engine, "d1")
    fleet.add_device(api.ctx.engine, "d2")
    mine = decision("d1", T0, outcome="reject", outputs={"count": 1, "boxes": [BOX]})
    theirs = mine.model_copy(update={"device_id": "d2", "outcome": "pass"})  # the same id
    store_rows(api.ctx.engine, fleet, [mine])
    store_rows(api.ctx.engine, fleet, [theirs])  # stored too: ids are per device
    upload(api, "d1", mine.id, thumbnail([BOX["box"]], (640, 480), seed=1))
    rows = api.call("GET", "/api/v1/decisions").body["rows"]
    assert sorted((r["device_id"], r["outcome"], r["image"] is not None) for r in rows) == [
        ("d1", "reject", True),
        ("d2", "pass", False),
    ]
    path = f"/api/v1/decisions/{mine.id}"
    for device_id, outcome in (("d1", "reject"), ("d2", "pass")):
        shown = api.call("GET", f"{path}?device={device_id}").body
        assert (shown["device_id"], shown["outcome"]) == (device_id, outcome)
        assert shown["path"] == f"{path}?device={device_id}"
    ambiguous = api.call("GET", path)
    assert ambiguous.status == 400
    assert ambiguous.body["detail"].startswith("device: decision id")
    assert "d1, d2" in ambiguous.body["detail"]
    assert api.call("GET", f"{path}?device=d3").status == 404
    assert fetch(api.url + path + "/image?device=d1", BEARER)[0] == 200
    assert api.call("GET", f"{path}/image?device=d2").status == 404  # d1's is not d2's

    reviewed = api.call(
        "POST", f"{path}/review?device=d2", {"verdict": "override", "outcome": "reject"}
    )
    assert reviewed.status == 200, reviewed.body
    assert api.call("GET", f"{path}?device=d1").body["review"] is None
    assert api.call("GET", f"{path}?device=d2").body["review"]["outcome"] == "reject"
    labels = api.call("GET", "/api/v1/labels").body["labels"]
    assert [(lb["device_id"], lb["label"]) for lb in labels] == [("d2", "reject")]


BEARER = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
