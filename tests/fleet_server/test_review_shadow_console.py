"""Shadow disagreements in the console over real HTTP on SQLite: the decision list's
Shadow filter shows only disagreeing decisions, each with the candidate's outcome; a
decision page shows both models (the comparison image, both sides' outcomes and
outputs) and, once a line manager labels it, which model was right."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path

from fleet_server.db import sqlite_url
from tests.fleet_server.test_review_shadow import seed
from tests.fleet_server.web.console_http_support import Console

pytest_plugins = ["tests.fleet_server.db_fixtures", "tests.fleet_server.web.console_http_fixtures"]


def test_the_console_lists_disagreements_and_a_label_says_which_model_was_right(
    start: Callable[[str], Console], tmp_path: Path
) -> None:
    console = start(sqlite_url(tmp_path / "fleet.db"))
    s = seed(console.engine)
    lena = console.client("lena")
    listing = lena.get("/ui/decisions?disagreement=yes")
    assert listing.status == 200, listing.text
    assert 'data-testid="disagreement-filter"' in listing.text
    assert '<option value="yes" selected>disagreements</option>' in listing.text
    ids = re.findall(r"/ui/decisions/([0-9a-f-]{36})\?", listing.text)
    assert ids == [s.labels.id, s.boxes.id]
    badges = re.findall(r'data-testid="shadow-disagrees"[^>]*>([^<]*)<', listing.text)
    assert badges == ["candidate 1.1.0: reject", "candidate 1.1.0: pass"]
    export = re.search(r'href="([^"]+)" data-testid="export"', listing.text)
    assert export is not None
    assert "disagreement=yes" in export.group(1)
    everything = lena.get("/ui/decisions")
    assert len(re.findall(r'data-testid="shadow-disagrees"', everything.text)) == 2
    assert len(set(re.findall(r"/ui/decisions/([0-9a-f-]{36})\?", everything.text))) == 4
    assert lena.get("/ui/decisions?disagreement=maybe").status == 400

    page = lena.get(f"/ui/decisions/{s.labels.id}?device=d1")
    assert page.status == 200, page.text
    section = re.search(r'<section class="card shadow" data-testid="shadow">(.*?)</section>',
                        page.text, re.S)  # fmt: skip
    assert section is not None
    text = html.unescape(re.sub(r"<[^>]+>", " ", section.group(1)))
    words = " ".join(text.split())
    assert "the models disagree" in words
    assert "live surface-check 1.0.0 pass ok 0.91 11.0 ms" in words
    assert "candidate surface-check 1.1.0 (release 7) reject scratch 0.66 14.5 ms" in words
    assert "Not labelled yet" in words
    image = f'src="/api/v1/decisions/{s.labels.id}/comparison.png?device=d1"'
    assert image in section.group(1)

    form = {"verdict": "override", "outcome": "reject", "note": "", "csrf_token": lena.csrf()}
    saved = lena.post(f"/ui/decisions/{s.labels.id}/review?device=d1", form)
    assert saved.status == 303, saved.text
    labelled = lena.get(saved.headers["location"])
    agrees = re.search(r'data-testid="label-agrees-with">(.*?)</p>', labelled.text, re.S)
    assert agrees is not None
    assert " ".join(re.sub(r"<[^>]+>", " ", agrees.group(1)).split()) == (
        "The label (reject) agrees with the candidate model (1.1.0)."
    )
    plain = lena.get(f"/ui/decisions/{s.plain.id}?device=d1")
    assert plain.status == 200
    assert 'data-testid="shadow"' not in plain.text
