"""Decision review pages over real HTTP (tests/fleet_server/web/console_http_support.py): the list's
filters and keyset pages, a viewer refused the review form, a line manager's override
shown in the decision, the accuracy table and the CSV export, the decisions' images
(thumbnails in the list looked up in one query, the image under the boxes in a decision,
the empty frame without one), and a part's decisions with their station and a missed
deadline."""

from __future__ import annotations

import html
import random
import re
import time
import urllib.parse
from typing import Any

import sqlalchemy as sa

from agent.wire.messages import DecisionRow
from fleet_server.db import store
from fleet_server.db.store import DecisionRecord
from fleet_server.ingest.sqlsink import SqlSink
from tests.fleet_server.web.console_http_support import Client, Console, first_decision
from tests.fleet_server.web.console_seed import FEATURED, decision_payload, image_record

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]


def test_decisions_filter_page_by_keyset_and_a_review_is_refused_to_a_viewer(
    console: Console,
) -> None:
    vic = console.client("vic")
    rejects = vic.get("/ui/decisions?outcome=reject&reviewed=no&range=24h")
    assert rejects.status == 200, rejects.text
    outcomes = re.findall(r'<span class="badge out-(\w+)">', rejects.text)
    assert outcomes
    assert set(outcomes) == {"reject"}
    assert 'data-testid="export"' not in rejects.text  # a viewer may not export
    first = vic.get("/ui/decisions")
    older = re.search(r'href="\?([^"]*cursor=[^"]+)" data-testid="next-page"', first.text)
    assert older is not None
    second = vic.get("/ui/decisions?" + older.group(1).replace("&amp;", "&"))
    ids_1 = set(re.findall(r"/ui/decisions/([0-9a-f-]{36})\?", first.text))
    ids_2 = set(re.findall(r"/ui/decisions/([0-9a-f-]{36})\?", second.text))
    assert len(ids_1) == len(ids_2) == 50
    assert not ids_1 & ids_2
    assert vic.get("/ui/decisions?cursor=bogus").status == 400
    assert vic.get("/ui/decisions?range=forever").status == 400
    decision = first_decision(rejects)
    shown = vic.get(f"/ui/decisions/{decision}")
    assert re.search(
        rf'<img src="/api/v1/decisions/{decision}/image\?device=[\w.-]+" width="640" height="480"',
        shown.text,
    )
    assert 'class="frame over"' in shown.text
    assert "save-review" not in shown.text
    refused = vic.post(f"/ui/decisions/{decision}/review",
                       {"csrf_token": vic.csrf(), "verdict": "confirm"})  # fmt: skip
    assert refused.status == 403
    assert "no current review" not in shown.text
    assert vic.get("/ui/decisions/no-such-decision").status == 404


def test_a_line_manager_overrides_a_decision_and_the_export_and_accuracy_show_it(
    console: Console,
) -> None:
    lena = console.client("lena")
    listing = lena.get("/ui/decisions?outcome=reject&reviewed=no")
    decision = first_decision(listing)
    form = {"verdict": "override", "outcome": "pass", "note": "a shadow, not a scratch"}
    assert lena.post(f"/ui/decisions/{decision}/review", form).status == 403  # no CSRF token
    bad = lena.post(f"/ui/decisions/{decision}/review",
                    form | {"outcome": "reject", "csrf_token": lena.csrf()})  # fmt: skip
    assert bad.status == 400
    assert "use verdict &#39;confirm&#39;" in bad.text
    saved = lena.post(f"/ui/decisions/{decision}/review", form | {"csrf_token": lena.csrf()})
    assert saved.status == 303
    detail = lena.get(saved.headers["location"])
    assert "Review saved." in detail.text
    assert "overridden from reject" in detail.text
    assert "a shadow, not a scratch" in detail.text
    rejects = lena.get("/ui/decisions?outcome=reject").text
    export_url = re.search(r'href="([^"]+)" data-testid="export"', rejects)
    assert export_url is not None
    csv_page = lena.get(export_url.group(1).replace("&amp;", "&"))
    assert csv_page.status == 200
    [row] = [ln for ln in csv_page.text.splitlines() if ln.startswith(decision)]
    assert ",override,pass,a shadow, not a scratch," in row.replace('"', "")
    assert ",lena," in row
    accuracy = lena.get("/ui/decisions").text
    assert "reject → pass: 1" in accuracy


def _image_queries(c: Console, client: Client, path: str) -> tuple[int, str]:
    """How many statements the page sent that read decision_images, and the page."""
    seen: list[str] = []

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    sa.event.listen(c.engine, "before_cursor_execute", on_execute)
    try:
        page = client.get(path)
    finally:
        sa.event.remove(c.engine, "before_cursor_execute", on_execute)
    assert page.status == 200, page.text
    return sum("decision_images" in s for s in seen), page.text


def test_the_list_shows_each_row_s_thumbnail_looked_up_in_one_query(console: Console) -> None:
    lena = console.client("lena")
    queries, rejects = _image_queries(console, lena, "/ui/decisions?outcome=reject")
    rows = re.findall(r'<tr data-testid="decision-row">(.*?)</tr>', rejects, re.S)
    assert len(rows) == 50  # every reject has an image (thumbnails = "non-pass")
    for row in rows:
        [decision] = re.findall(r'href="/ui/decisions/([0-9a-f-]{36})\?', row)
        assert re.search(
            rf'<img src="/api/v1/decisions/{decision}/image\?device=[\w.-]+" '
            'width="112" height="84"',
            row,
        )
        assert 'loading="lazy"' in row
    assert queries == 1
    queries, passes = _image_queries(console, lena, "/ui/decisions?outcome=pass")
    assert passes.count('data-testid="decision-row"') == 50
    assert "<img src=" not in passes
    assert passes.count("no image uploaded") >= 50
    assert queries == 1


def test_a_decision_without_an_image_or_a_frame_size_says_so(console: Console) -> None:
    vic = console.client("vic")
    passes = vic.get("/ui/decisions?outcome=pass")
    bare = vic.get(f"/ui/decisions/{first_decision(passes)}").text
    assert "<img src=" not in bare
    assert 'class="frame"' in bare
    assert ">no image uploaded</text>" in bare
    assert "No image uploaded" in bare
    # An older agent: no frame size in the outputs; the image's own size stands for it.
    ts = time.time() - 30
    payload = decision_payload(FEATURED, ts, 1, "reject", random.Random(3))
    outputs = payload["outputs"]
    assert isinstance(outputs, dict)
    old = dict(payload, outputs={k: v for k, v in outputs.items() if k != "frame"})
    decision_id = str(old["id"])
    record = DecisionRecord(decision_id, FEATURED, ts, "cam0", "reject", "detector", "1.4.0", old)
    store.insert_decisions(console.engine, [record])
    store.insert_images(console.engine, [image_record(decision_id, FEATURED, ts, payload, seed=9)])
    shown = vic.get(f"/ui/decisions/{decision_id}").text
    assert f'<img src="/api/v1/decisions/{decision_id}/image?device={FEATURED}"' in shown
    assert "Frame size unknown" in shown
    assert "frame size unknown" in shown  # in the drawing's description


def test_a_parts_decisions_show_station_part_id_and_a_missed_deadline(console: Console) -> None:
    """Stored through the ingest sink as an agent at a station uploads them: the part id
    filter lists the part's decisions with their station, a late one badged, and the
    decision's page says the PLC got the fail-safe result; a part id is text, escaped."""
    ts = time.time() - 20
    rng = random.Random(11)
    part = "P-0042 <b>&"
    rows = [
        DecisionRow.model_validate(
            decision_payload(FEATURED, ts + n, n, outcome, rng)
            | {"station": "st-3", "part_id": part, "deadline_missed": late}
        )
        for n, (outcome, late) in enumerate((("pass", False), ("reject", True)))
    ]
    assert SqlSink(console.engine).store_decisions(rows) == 2
    vic = console.client("vic")
    everything = vic.get("/ui/decisions")
    assert re.search(
        r'<input name="part_id" value="" [^>]*data-testid="part-id-filter"', everything.text
    )
    listing = vic.get("/ui/decisions?" + urllib.parse.urlencode({"part_id": part}))
    assert listing.status == 200, listing.text
    found = re.findall(r'<tr data-testid="decision-row">(.*?)</tr>', listing.text, re.S)
    assert len(found) == 2
    escaped = "P-0042 &lt;b&gt;&amp;"
    assert part not in listing.text
    assert f'name="part_id" value="{escaped}"' in listing.text  # the filter as given
    late_row, on_time_row = found  # newest first
    for row in found:
        assert re.search(
            rf'data-testid="station-part">st-3 · <a href="[^"]+"[^>]*>{escaped}</a>', row
        )
    assert "deadline missed</span>" in late_row
    assert 'data-testid="deadline-missed"' in late_row
    assert "deadline missed" not in on_time_row
    assert rows[1].id in late_row
    shown = vic.get(f"/ui/decisions/{rows[1].id}?device={FEATURED}")
    assert shown.status == 200, shown.text
    assert 'data-testid="deadline-missed">deadline missed</span>' in shown.text
    assert re.search(rf'data-testid="part-id"><a href="[^"]+"[^>]*>{escaped}</a>', shown.text)
    assert 'data-testid="station">st-3<' in shown.text
    assert "the PLC got the station's fail-safe result, not reject" in shown.text
    calm = vic.get(f"/ui/decisions/{rows[0].id}?device={FEATURED}").text
    assert "deadline missed" not in calm
    reviews = vic.get("/ui/decisions?outcome=review")  # the seeded, free-running ones
    free = vic.get(f"/ui/decisions/{first_decision(reviews)}").text
    assert "free-running, no PLC trigger" in free


def test_save_and_next_walks_the_filter_s_queue_and_says_what_is_left(console: Console) -> None:
    """Three unreviewed decisions of one station: the list's filter goes with each review
    (the back link keeps it), "save and next" opens the next one of the same filter with
    one fewer left, the last one leads back to the filtered list, and the page names its
    keys."""
    ts = time.time() - 30
    rng = random.Random(12)
    rows = [
        DecisionRow.model_validate(
            decision_payload(FEATURED, ts + n, n, "reject", rng) | {"station": "st-queue"}
        )
        for n in range(3)
    ]
    assert SqlSink(console.engine).store_decisions(rows) == 3
    lena = console.client("lena")
    listing = lena.get("/ui/decisions?station=st-queue&reviewed=no")
    assert listing.status == 200, listing.text
    m = re.search(r'href="(/ui/decisions/[0-9a-f-]{36}\?back=[^"]+)"', listing.text)
    assert m is not None, listing.text
    page = lena.get(m.group(1).replace("&amp;", "&"))
    seen = []
    for left in (3, 2, 1):
        assert page.status == 200, page.text
        crumbs = re.search(r'<p class="crumbs">.*?</p>', page.text, re.S)
        assert crumbs is not None
        assert f'data-testid="queue-left">{left} left' in crumbs.group(0), crumbs.group(0)
        assert f'data-testid="queue-left">{left} left to review in this filter' in page.text
        assert "<kbd>c</kbd> confirm and next" in page.text
        latencies = re.search(r'data-testid="latencies">(.*?)</dd>', page.text)
        assert latencies is not None
        assert re.fullmatch(r"(\w+ \d+\.\d ms( · )?)+", latencies.group(1)), latencies.group(1)
        assert 'data-testid="policy">reject_above 0.8; review_above 0.6' in page.text
        decision = re.search(r'action="/ui/decisions/([0-9a-f-]{36})/review', page.text)
        assert decision is not None
        seen.append(decision.group(1))
        back = html.unescape(page.field("back"))
        assert back == "/ui/decisions?station=st-queue&reviewed=no"
        saved = lena.post(
            f"/ui/decisions/{decision.group(1)}/review?device={FEATURED}",
            {"verdict": "confirm", "then": "next", "back": back, "csrf_token": lena.csrf()},
        )
        assert saved.status == 303
        location = saved.headers["location"]
        if left > 1:
            assert location.startswith("/ui/decisions/")
            assert "done=1" in location
            page = lena.get(location)
            assert "Review saved." in page.text
        else:
            assert location == back  # nothing left: back to the filtered list
    assert sorted(seen) == sorted(r.id for r in rows)  # each once, newest first
    assert seen == [r.id for r in reversed(rows)]
    done = lena.get("/ui/decisions?station=st-queue&reviewed=no")
    assert "No decision matches." in done.text
    shown = lena.get(f"/ui/decisions/{rows[0].id}?device={FEATURED}&back=" + urllib.parse.quote(
        "/ui/decisions?station=st-queue"))  # fmt: skip
    assert 'data-testid="queue-left">nothing left to review in this filter' in shown.text


def test_ticked_decisions_are_confirmed_in_one_go_and_the_list_keeps_its_filter(
    console: Console,
) -> None:
    ts = time.time() - 40
    rng = random.Random(13)
    rows = [
        DecisionRow.model_validate(
            decision_payload(FEATURED, ts + n, n, "review", rng) | {"station": "st-bulk"}
        )
        for n in range(4)
    ]
    assert SqlSink(console.engine).store_decisions(rows) == 4
    vic = console.client("vic")
    assert 'data-testid="pick"' not in vic.get("/ui/decisions?station=st-bulk").text
    lena = console.client("lena")
    listing = lena.get("/ui/decisions?station=st-bulk&reviewed=no")
    ticks = re.findall(r'name="(pick-\d+)" value="([^"]+)"', listing.text)
    assert len(ticks) == 4
    back = "/ui/decisions?station=st-bulk&reviewed=no"
    form = dict(ticks[:3]) | {"back": back}
    assert lena.post("/ui/decisions/confirm", form).status == 403  # no CSRF token
    done = lena.post("/ui/decisions/confirm", form | {"csrf_token": lena.csrf()})
    assert done.status == 303
    assert done.headers["location"] == back + "&confirmed=3"
    after = lena.get(done.headers["location"])
    assert 'data-testid="confirmed">3 decisions confirmed.' in after.text
    left = re.findall(r'name="pick-\d+" value="([^"]+)"', after.text)
    assert left == [ticks[3][1]]  # only the one not ticked is still to review
    confirmed = {v.split("/", 1)[1] for _, v in ticks[:3]}
    for decision_id in confirmed:
        page = lena.get(f"/ui/decisions/{decision_id}?device={FEATURED}")
        assert "Current label: <strong>review</strong> (confirmed) by lena" in page.text
    refused = vic.post("/ui/decisions/confirm", {"pick-0": ticks[3][1], "csrf_token": vic.csrf()})
    assert refused.status == 403  # a viewer may not review
    assert (
        lena.post("/ui/decisions/confirm", {"back": back, "csrf_token": lena.csrf()}).status == 400
    )


def test_filters_offer_the_fleet_s_devices_and_versions_and_a_date_range(
    console: Console,
) -> None:
    vic = console.client("vic")
    page = vic.get("/ui/decisions")
    devices = re.search(r'<datalist id="devices">(.*?)</datalist>', page.text, re.S)
    assert devices is not None
    assert f'<option value="{FEATURED}">' in devices.group(1)
    assert '<input name="device" list="devices"' in page.text
    assert '<input name="model_version" list="versions"' in page.text
    today = time.strftime("%Y-%m-%d")
    tomorrow = time.strftime("%Y-%m-%d", time.localtime(time.time() + 86400))
    day = vic.get(f"/ui/decisions?from={today}&to={today}&device={FEATURED}")
    assert day.status == 200
    assert 'name="from" value="' + today in day.text  # kept in the form
    yesterday = time.strftime("%Y-%m-%d", time.localtime(time.time() - 86400))
    both = vic.get(f"/ui/decisions?from={yesterday}&to={today}&device={FEATURED}")
    assert 'data-testid="decision-row"' in both.text  # the seeded hours lie in these days
    later = vic.get(f"/ui/decisions?from={tomorrow}&device={FEATURED}")
    assert "No decision matches." in later.text
    assert vic.get("/ui/decisions?from=yesterday").status == 400
