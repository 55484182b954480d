"""The decision list at scale (``make bench``): seed 1,000,000 decisions from 1,000
devices, then time the list endpoint's server time over a bounded number of requests
with varied filters and pages; the issue's target is p95 < 300 ms on SQLite and on
PostgreSQL.

The requests go to the real endpoint (FastAPI app with the decision router and the
real sign-in gate; a line manager's session cookie), called in this process through
ASGI: the time is from the request entering the app to the last byte of the answer,
without a network or a client in it. Each scenario is a filter with random values;
each round walks a few pages along ``next_cursor``, and some start deep in the history
(a cursor at a random time).

Example::

    python -m fleet_server.review.bench --decisions 1000000 --devices 1000 --json out.json
    python -m fleet_server.review.bench --postgres --json out-pg.json   # source checkout
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, MutableMapping
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
from fleet_server.review.seed import LINES, SITES, VERSIONS, device_id, seed

TARGET_P95_MS = 300.0
PAGES = 4
"""Pages walked along next_cursor in each round of a scenario."""
WARMUP_ROUNDS = 1
USER = "bench-manager"
_PASSWORD_BYTES = 18

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

    async def get(self, path: str, params: Params) -> tuple[int, Any, float]:
        """(status, JSON body, seconds)."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": urllib.parse.urlencode(params).encode(),
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
        return status, json.loads(b"".join(chunks) or b"null"), took


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


async def _round(
    client: AsgiClient, params: Params, pages: int, times: list[float], rows: list[int]
) -> None:
    """Walk up to ``pages`` pages from ``params`` along next_cursor, timing each."""
    for _ in range(pages):
        status, body, took = await client.get("/api/v1/decisions", params)
        if status != 200:
            raise FleetError(f"review bench: {params} answered {status}: {body}")
        times.append(took * 1000)
        rows.append(len(body["rows"]))
        if body["next_cursor"] is None:
            return
        params = {**params, "cursor": body["next_cursor"]}


async def _measure(
    client: AsgiClient,
    plan: dict[str, Callable[[random.Random], Params]],
    requests: int,
    limit: int,
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
        await _round(client, {**plan[name](rng), "limit": str(limit)}, PAGES, [], [])
    done = 0
    for k in range(requests):  # each round times one request at least
        name = names[k % len(names)]
        params = {**plan[name](rng), "limit": str(limit)}
        if (k // len(names)) % 2 == 1:
            at = end - span_s * rng.random()
            params["cursor"] = encode_cursor(Cursor(at, "ffffffff-ffff-7fff-bfff-ffffffffffff"))
        before = len(times[name])
        await _round(client, params, min(PAGES, requests - done), times[name], rows[name])
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


def _sign_in(engine: Engine) -> tuple[AuthService, str]:
    password = secrets.token_urlsafe(_PASSWORD_BYTES)  # made here, used once, forgotten
    add_user(engine, PasswordHasher(), USER, "line-manager", password)
    service = AuthService(engine, AuthSection())
    return service, service.login(USER, password, "127.0.0.1").session_id


def _app(engine: Engine, service: AuthService) -> FastAPI:
    app = FastAPI()
    install(app, Gate(service, None))
    app.include_router(decisions_router(_Ctx(engine)))
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
    seed_value: int = 1,
    analyze: bool = False,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Seed the (empty, migrated) database and time the list; the report as a dict.

    PostgreSQL gets ``ANALYZE`` after the load (autovacuum would run it soon after such
    a load anyway); SQLite only with ``analyze`` (a fleet database is never analysed by
    itself, so the default shows the plans without statistics).

    Raises:
        ReviewError: the database is not empty, or the arguments are out of range.
        FleetError: a request was not answered 200.
    """
    progress(f"seeding {decisions_n} decisions from {devices_n} devices ...")
    seeded = seed(engine, decisions_n, devices_n, seed_value=seed_value, progress=progress)
    analyze_s = 0.0
    if engine.dialect.name == "postgresql" or analyze:
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        analyze_s = time.perf_counter() - started
    progress(f"seeded in {seeded.seconds:.0f} s; timing {requests} requests ...")
    service, cookie = _sign_in(engine)
    client = AsgiClient(_app(engine, service), cookie)
    with engine.connect() as conn:
        first = float(conn.execute(sa.select(sa.func.min(decisions.c.ts))).scalar_one())
    span_s = seeded.end - first
    plan = scenarios(devices_n, seeded.end, span_s)
    rng = random.Random(seed_value)  # noqa: S311 (bench data)
    measured = asyncio.run(_measure(client, plan, requests, limit, seeded.end, span_s, rng))
    overall = measured["overall"]
    return {
        "bench": "decision-review-list",
        "backend": engine.dialect.name,
        "decisions": seeded.decisions,
        "devices": seeded.devices,
        "reviews": seeded.reviews,
        "seed_s": round(seeded.seconds, 1),
        "analyzed": analyze_s > 0,
        "db_bytes": _db_size(engine),
        "limit": limit,
        "pages_per_round": PAGES,
        **measured,
        "target_p95_ms": TARGET_P95_MS,
        "meets_target": overall["p95_ms"] < TARGET_P95_MS,
    }


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Engine]:
    workdir = Path(tempfile.mkdtemp(prefix="edgefleet-review-bench-"))
    cluster: Any = None
    try:
        url = args.db_url
        if args.postgres:
            pg = importlib.import_module("tests.fleet.pg")  # a source checkout's test helper
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
            importlib.import_module("tests.fleet.pg").stop_cluster(cluster)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m fleet_server.review.bench``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m fleet_server.review.bench",
        description="Seed decisions and time the decision list (p95 target < 300 ms).",
        epilog="example: python -m fleet_server.review.bench --decisions 1000000 "
        "--devices 1000 --json .cache/bench-review.json",
    )
    parser.add_argument("--decisions", type=int, default=1_000_000, help="decisions to seed")
    parser.add_argument("--devices", type=int, default=1000, help="devices to seed")
    parser.add_argument("--requests", type=int, default=400, help="timed requests")
    parser.add_argument("--limit", type=int, default=50, help="rows per page")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the data")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db-url", help="an empty database (default: a temporary SQLite file)")
    where.add_argument(
        "--postgres",
        action="store_true",
        help="a throw-away PostgreSQL cluster, started as the tests do (tests/fleet/pg.py)",
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
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
