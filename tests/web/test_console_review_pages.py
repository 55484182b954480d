"""Decision review pages over real HTTP (tests/web/console_http_support.py): the list's
filters and keyset pages, a viewer refused the review form, and a line manager's
override shown in the decision, the accuracy table and the CSV export."""

from __future__ import annotations

import re

from tests.web.console_http_support import Console, first_decision

pytest_plugins = ["tests.fleet.db_fixtures", "tests.web.console_http_fixtures"]


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
    assert 'class="frame"' in shown.text
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
