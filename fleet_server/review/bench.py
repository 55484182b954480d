"""The decision review at scale (``make bench``): seed 1,000,000 decisions from 1,000
devices, then time, over a bounded number of requests each, the server time of the list
endpoint (``GET /api/v1/decisions``), the console's list page (``GET /ui/decisions``), a
decision's page (``GET /ui/decisions/{id}``) and a decision's image (``GET
/api/v1/decisions/{id}/image``, which the pages' ``<img>`` fetch); the issue's target is
p95 < 300 ms for each, on SQLite and on PostgreSQL.

The requests go to the real endpoints and pages (a FastAPI app with the decision router,
the console's review pages as :func:`fleet_server.web.console.install_review_pages`
serves them, and the real sign-in gate; a line manager's session cookie), called in
this process through ASGI: the time is from the request entering the app to the last
byte of the answer, without a network or a client in it. Each scenario is a filter with
random values; each round walks a few pages along the next-page cursor (the API's
``next_cursor``, the page's "Older decisions" link), and every other round starts deep
in the history (a cursor at a random time). The list page takes the same filters, but a
time window becomes the page's own ``range`` choice (last 24 h or 7 d). Decision pages
and images are of decisions the list pages showed, half of them with an image where
there are enough.

Images: only the newest ``--images`` decisions (default 5,000) get a thumbnail (a
320 x 240 JPEG of a few KB, every outcome), the rows the first pages of every filter show
and the ones a line manager opens; a million thumbnails would add gigabytes to the
database and time to the load without changing what a page does (it looks its rows'
images up in one query by key, whatever their number). Pages deeper in the history show
rows without one, as after a device's thumbnail retention.

Example::

    python -m fleet_server.review.bench --decisions 1000000 --devices 1000 --json out.json
    python -m fleet_server.review.bench --postgres --json out-pg.json   # source checkout
"""

from __future__ import annotations

import argparse
import asyncio
import html
import importlib
import json
import random
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from fleet_server.api.decisions import decisions_router
from fleet_server.auth import AuthSection, AuthService, PasswordHasher, add_user
from fleet_server.auth.deps import COOKIE_NAME, Gate, install
from fleet_server.db import open_database, sqlite_url
from fleet_server.db.tables import decisions
from fleet_server.errors import FleetError
from fleet_server.review.filters import Cursor, encode_cursor
from fleet_server.review.images import image_url
from fleet_server.review.seed import LINES, SITES, VERSIONS, device_id, seed
from fleet_server.web.console import install_review_pages

TARGET_P95_MS = 300.0
PAGES = 4
"""Pages walked along next_cursor in each round of a scenario."""
WARMUP_ROUNDS = 1
IMAGES = 5000
"""The newest decisions seeded with a thumbnail (see the module docstring)."""
USER = "bench-manager"
_PASSWORD_BYTES = 18
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


@dataclass(frozen=True)
class _Ctx:
    engine: Engine


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


async def _measure_all(
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


def _sign_in(engine: Engine) -> tuple[AuthService, str]:
    password = secrets.token_urlsafe(_PASSWORD_BYTES)  # made here, used once, forgotten
    add_user(engine, PasswordHasher(), USER, "line-manager", password)
    service = AuthService(engine, AuthSection())
    return service, service.login(USER, password, "127.0.0.1").session_id


def _app(engine: Engine, service: AuthService) -> FastAPI:
    app = FastAPI()
    install(app, Gate(service, None))
    app.include_router(decisions_router(_Ctx(engine)))
    install_review_pages(app, engine)
    return app


def _db_size(engine: Engine) -> int:
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            return int(
                conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one()
            )
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        return int(pages) * int(size)


def run_bench(
    engine: Engine,
    decisions_n: int,
    devices_n: int,
    *,
    requests: int = 400,
    limit: int = 50,
    images: int = IMAGES,
    seed_value: int = 1,
    analyze: bool = False,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Seed the (empty, migrated) database and time the list endpoint, the list page,
    decision pages and images, ``requests`` requests each; the report as a dict.

    PostgreSQL gets ``ANALYZE`` after the load (autovacuum would run it soon after such
    a load anyway); SQLite only with ``analyze`` (a fleet database is never analysed by
    itself, so the default shows the plans without statistics).

    Raises:
        ReviewError: the database is not empty, or the arguments are out of range.
        FleetError: a request was not answered 200.
    """
    progress(f"seeding {decisions_n} decisions from {devices_n} devices ...")
    seeded = seed(
        engine, decisions_n, devices_n, seed_value=seed_value, images=min(images, decisions_n),
        progress=progress,
    )  # fmt: skip
    analyze_s = 0.0
    if engine.dialect.name == "postgresql" or analyze:
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        analyze_s = time.perf_counter() - started
    progress(f"seeded in {seeded.seconds:.0f} s; timing {requests} requests of each page ...")
    service, cookie = _sign_in(engine)
    client = AsgiClient(_app(engine, service), cookie)
    with engine.connect() as conn:
        first = float(conn.execute(sa.select(sa.func.min(decisions.c.ts))).scalar_one())
    span_s = seeded.end - first
    plan = scenarios(devices_n, seeded.end, span_s)
    rng = random.Random(seed_value)  # noqa: S311 (bench data)
    measured = asyncio.run(_measure_all(client, plan, requests, limit, seeded.end, span_s, rng))
    return {
        "bench": "decision-review",
        "backend": engine.dialect.name,
        "decisions": seeded.decisions,
        "devices": seeded.devices,
        "reviews": seeded.reviews,
        "images": seeded.images,
        "seed_s": round(seeded.seconds, 1),
        "analyzed": analyze_s > 0,
        "db_bytes": _db_size(engine),
        "limit": limit,
        "pages_per_round": PAGES,
        **measured,
        "target_p95_ms": TARGET_P95_MS,
        "meets_target": all(p["meets_target"] for p in measured["pages"].values()),
    }


def table(report: dict[str, Any]) -> str:
    """The report's figures per page as a Markdown table."""
    lines = [
        f"{report['backend']}, {report['decisions']:,} decisions, {report['devices']:,} "
        f"devices, {report['images']:,} images; server time in ms:",
        "",
        f"| page | requests | p50 | p95 | p99 | max | p95 < {report['target_p95_ms']:.0f} ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, p in report["pages"].items():
        lines.append(
            f"| {name} (`{p['path']}`) | {p['n']} | {p['p50_ms']} | {p['p95_ms']} | "
            f"{p['p99_ms']} | {p['max_ms']} | {'yes' if p['meets_target'] else 'NO'} |"
        )
    return "\n".join(lines)


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    workdir = Path(tempfile.mkdtemp(prefix="edgefleet-review-bench-"))
    cluster: Any = None
    try:
        url = args.db_url
        if args.postgres:
            pg = importlib.import_module("tests.support.pg")  # a source checkout's test helper
            cluster = pg.start_cluster(durable=True)
            url = cluster.create_database("bench")
        elif url is None:
            url = sqlite_url(workdir / "fleet.db")
        engine = open_database(url)
        try:
            yield engine
        finally:
            engine.dispose()
    finally:
        if cluster is not None:
            importlib.import_module("tests.support.pg").stop_cluster(cluster)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m fleet_server.review.bench``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m fleet_server.review.bench",
        description="Seed decisions and time the decision list, the review pages and the "
        "images (p95 target < 300 ms each).",
        epilog="example: python -m fleet_server.review.bench --decisions 1000000 "
        "--devices 1000 --json .cache/bench-review.json",
    )
    parser.add_argument("--decisions", type=int, default=1_000_000, help="decisions to seed")
    parser.add_argument("--devices", type=int, default=1000, help="devices to seed")
    parser.add_argument("--requests", type=int, default=400, help="timed requests of each page")
    parser.add_argument(
        "--images", type=int, default=IMAGES, help="newest decisions seeded with a thumbnail"
    )
    parser.add_argument("--limit", type=int, default=50, help="rows per page")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the data")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db-url", help="an empty database (default: a temporary SQLite file)")
    where.add_argument(
        "--postgres",
        action="store_true",
        help="a throw-away PostgreSQL cluster, started as the tests do (tests/support/pg.py)",
    )
    parser.add_argument(
        "--analyze", action="store_true", help="run ANALYZE on SQLite too before timing"
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)

    def progress(message: str) -> None:
        print(f"review bench: {message}", file=sys.stderr, flush=True)

    try:
        with _database(args) as engine:
            report = run_bench(
                engine,
                args.decisions,
                args.devices,
                requests=args.requests,
                limit=args.limit,
                images=args.images,
                seed_value=args.seed,
                analyze=args.analyze,
                progress=progress,
            )
    except FleetError as exc:
        print(f"review bench: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(table(report), file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
