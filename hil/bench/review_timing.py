"""The timing half of the review bench (:mod:`hil.bench.review`): the filter scenarios,
an ASGI client that times each request inside the app's call, and the rounds that walk
the list endpoint and the list page along their next-page cursors, then open decision
pages and images the list pages showed.
"""

from __future__ import annotations

import html
import json
import random
import re
import statistics
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from fleet_server.auth.deps import COOKIE_NAME
from fleet_server.errors import FleetError
from fleet_server.review.filters import Cursor, encode_cursor
from fleet_server.review.images import image_url
from hil.bench.review_seed import LINES, SITES, VERSIONS, device_id

TARGET_P95_MS = 300.0
PAGES = 4
"""Pages walked along next_cursor in each round of a scenario."""
WARMUP_ROUNDS = 1
_DEEP = "ffffffff-ffff-7fff-bfff-ffffffffffff"
"""The id of a cursor at a random time: after every decision of that time."""
LIST_API, LIST_PAGE, DETAIL_PAGE, IMAGE = "list API", "list page", "decision page", "image"
PATHS = {
    LIST_API: "/api/v1/decisions",
    LIST_PAGE: "/ui/decisions",
    DETAIL_PAGE: "/ui/decisions/{id}",
    IMAGE: "/api/v1/decisions/{id}/image",
}
PAGE_RANGES = ("24h", "7d")
"""What a time window scenario becomes on the list page (its own choices)."""
_ROW = re.compile(r'href="/ui/decisions/([0-9a-f-]{36})\?')
_IMG = re.compile(r'<img src="/api/v1/decisions/([0-9a-f-]{36})/image(?:\?device=[^"]*)?"')
_NEXT = re.compile(r'href="\?([^"]*)" data-testid="next-page"')

Params = dict[str, str]


def scenarios(
    devices_n: int, end: float, span_s: float
) -> dict[str, Callable[[random.Random], Params]]:
    """Filters by name, each a function of a random source (values vary per round)."""
    day = 86_400.0

    def window(rng: random.Random) -> Params:
        start = end - span_s + rng.random() * (span_s - day)
        return {"since": f"{start:.3f}", "until": f"{start + day:.3f}"}

    return {
        "none": lambda rng: {},
        "site": lambda rng: {"site": f"site-{rng.randrange(SITES)}"},
        "line": lambda rng: {"line": f"line-{rng.randrange(LINES):02d}"},
        "device": lambda rng: {"device": device_id(rng.randrange(devices_n))},
        "source": lambda rng: {"source": f"cam{rng.randrange(2)}"},
        "outcome=pass": lambda rng: {"outcome": "pass"},
        "outcome=review": lambda rng: {"outcome": "review"},
        "model_version": lambda rng: {"model_version": rng.choice(VERSIONS)},
        "time_range": window,
        "reviewed=yes": lambda rng: {"reviewed": "yes"},
        "reviewed=no": lambda rng: {"reviewed": "no"},
        "line+outcome": lambda rng: {
            "line": f"line-{rng.randrange(LINES):02d}",
            "outcome": "reject",
        },
        "site+time_range": lambda rng: {"site": f"site-{rng.randrange(SITES)}", **window(rng)},
    }


class AsgiClient:
    """GET requests to an ASGI app in this process, timed inside the app's call."""

    def __init__(self, app: FastAPI, cookie: str) -> None:
        self.app = app
        self.headers = [(b"host", b"bench"), (b"cookie", f"{COOKIE_NAME}={cookie}".encode())]

    async def get(self, path: str, params: Params | None = None) -> tuple[int, bytes, float]:
        """(status, body, seconds)."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": urllib.parse.urlencode(params or {}).encode(),
            "root_path": "",
            "headers": self.headers,
            "client": ("127.0.0.1", 40000),
            "server": ("bench", 80),
        }
        status = 0
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        started = time.perf_counter()
        await self.app(scope, receive, send)
        took = time.perf_counter() - started
        return status, b"".join(chunks), took


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _summary(times_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(times_ms),
        "p50_ms": round(statistics.median(times_ms), 2),
        "p95_ms": round(_percentile(times_ms, 0.95), 2),
        "p99_ms": round(_percentile(times_ms, 0.99), 2),
        "max_ms": round(max(times_ms), 2),
    }


def _refused(what: str, params: Params, status: int, body: bytes) -> FleetError:
    return FleetError(f"review bench: {what} {params} answered {status}: {body[:300]!r}")


@dataclass
class Seen:
    """Decisions the list pages showed: the ones with an image and the others."""

    with_image: dict[str, None]
    without: dict[str, None]

    def add(self, page: str) -> None:
        pictured = set(_IMG.findall(page))
        for decision_id in _ROW.findall(page):
            (self.with_image if decision_id in pictured else self.without)[decision_id] = None


Walk = Callable[[AsgiClient, Params, int, list[float], list[int]], Awaitable[None]]
"""One round: walk up to N pages from the params, appending times (ms) and row counts."""


async def _api_round(
    client: AsgiClient, params: Params, pages: int, times: list[float], rows: list[int]
) -> None:
    """Walk up to ``pages`` pages of the list endpoint along next_cursor, timing each."""
    for _ in range(pages):
        status, raw, took = await client.get(PATHS[LIST_API], params)
        if status != 200:
            raise _refused(LIST_API, params, status, raw)
        body = json.loads(raw)
        times.append(took * 1000)
        rows.append(len(body["rows"]))
        if body["next_cursor"] is None:
            return
        params = {**params, "cursor": body["next_cursor"]}


def _page_round(seen: Seen) -> Walk:
    """A round of the list page: walk its "Older decisions" links; note the rows."""

    async def walk(
        client: AsgiClient, params: Params, pages: int, times: list[float], rows: list[int]
    ) -> None:
        for _ in range(pages):
            status, raw, took = await client.get(PATHS[LIST_PAGE], params)
            if status != 200:
                raise _refused(LIST_PAGE, params, status, raw)
            page = raw.decode()
            times.append(took * 1000)
            rows.append(page.count('data-testid="decision-row"'))
            seen.add(page)
            older = _NEXT.search(page)
            if older is None:
                return
            params = dict(urllib.parse.parse_qsl(html.unescape(older.group(1))))

    return walk


def page_params(params: Params, rng: random.Random) -> Params:
    """A list endpoint's filter as the list page takes it: a time window becomes one of
    the page's ranges (the page has no since/until), the page size is the page's own."""
    out = {k: v for k, v in params.items() if k not in ("since", "until", "limit")}
    if "since" in params:
        out["range"] = rng.choice(PAGE_RANGES)
    return out


async def _measure(
    client: AsgiClient,
    plan: dict[str, Callable[[random.Random], Params]],
    walk: Walk,
    requests: int,
    end: float,
    span_s: float,
    rng: random.Random,
) -> dict[str, Any]:
    """Rounds over the scenarios in turn (every other round of a scenario starting deep
    in the history) until ``requests`` requests are timed; one warm-up round each first."""
    names = list(plan)
    times: dict[str, list[float]] = {name: [] for name in names}
    rows: dict[str, list[int]] = {name: [] for name in names}
    for name in names * WARMUP_ROUNDS:
        await walk(client, plan[name](rng), PAGES, [], [])
    done = 0
    for k in range(requests):  # each round times one request at least
        name = names[k % len(names)]
        params = plan[name](rng)
        if (k // len(names)) % 2 == 1:
            at = end - span_s * rng.random()
            params["cursor"] = encode_cursor(Cursor(at, _DEEP))
        before = len(times[name])
        await walk(client, params, min(PAGES, requests - done), times[name], rows[name])
        done += len(times[name]) - before
        if done >= requests:
            break
    every = [t for ts in times.values() for t in ts]
    return {
        "requests": len(every),
        "overall": _summary(every),
        "scenarios": {
            name: {**_summary(ts), "rows": sum(rows[name])} for name, ts in times.items() if ts
        },
    }


def _pick(seen: Seen, n: int, rng: random.Random) -> list[str]:
    """``n`` decisions the list pages showed, half with an image where there are enough."""
    pictured, plain = list(seen.with_image), list(seen.without)
    if not pictured and not plain:
        raise FleetError("review bench: the list pages showed no decision to open")
    out = []
    for k in range(n):
        pool = pictured if (k % 2 == 0 and pictured) or not plain else plain
        out.append(rng.choice(pool))
    return out


async def _each(client: AsgiClient, what: str, paths: list[str]) -> list[float]:
    """GET each path (after one untimed), timing each; a non-200 answer is an error."""
    for path in [*paths[:1], *paths]:
        status, raw, _ = await client.get(path)
        if status != 200:
            raise _refused(what, {"path": path}, status, raw)
    times = []
    for path in paths:
        status, raw, took = await client.get(path)
        if status != 200:
            raise _refused(what, {"path": path}, status, raw)
        times.append(took * 1000)
    return times


async def measure_all(
    client: AsgiClient,
    plan: dict[str, Callable[[random.Random], Params]],
    requests: int,
    limit: int,
    end: float,
    span_s: float,
    rng: random.Random,
) -> dict[str, Any]:
    """The list endpoint (the report's ``overall`` and ``scenarios``), then the list
    page, decision pages and images (``pages``)."""

    def with_limit(name: str) -> Callable[[random.Random], Params]:
        return lambda r: {**plan[name](r), "limit": str(limit)}

    def as_page(name: str) -> Callable[[random.Random], Params]:
        return lambda r: page_params(plan[name](r), r)

    api_plan = {name: with_limit(name) for name in plan}
    listed = await _measure(client, api_plan, _api_round, requests, end, span_s, rng)
    seen = Seen({}, {})
    ui_plan = {name: as_page(name) for name in plan}
    paged = await _measure(client, ui_plan, _page_round(seen), requests, end, span_s, rng)
    opened = _pick(seen, requests, rng)
    detail = await _each(client, DETAIL_PAGE, [f"/ui/decisions/{d}" for d in opened])
    pictured = list(seen.with_image)
    shown = [rng.choice(pictured) for _ in range(requests)] if pictured else []
    images = await _each(client, IMAGE, [image_url(d) for d in shown])
    pages = {
        LIST_API: listed["overall"],
        LIST_PAGE: paged["overall"],
        DETAIL_PAGE: {
            **_summary(detail),
            "with_image": sum(1 for d in opened if d in seen.with_image),
        },
    }
    if images:
        pages[IMAGE] = _summary(images)
    for name, summary in pages.items():
        summary["path"] = PATHS[name]
        summary["meets_target"] = summary["p95_ms"] < TARGET_P95_MS
    return {**listed, "pages": pages, "list_page_scenarios": paged["scenarios"]}
