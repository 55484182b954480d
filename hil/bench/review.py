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

    hil bench review --decisions 1000000 --devices 1000 --json out.json
    hil bench review --postgres --json out-pg.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from fleet_server.api.decisions import decisions_router
from fleet_server.auth import AuthSection, AuthService, PasswordHasher, add_user
from fleet_server.auth.deps import Gate, install
from fleet_server.db import open_database, sqlite_url
from fleet_server.db.tables import decisions
from fleet_server.errors import FleetError
from fleet_server.web.console import install_review_pages
from hil.bench.review_seed import seed
from hil.bench.review_timing import PAGES, TARGET_P95_MS, AsgiClient, measure_all, scenarios
from hil.pgcluster import PgCluster, start_cluster, stop_cluster

IMAGES = 5000
"""The newest decisions seeded with a thumbnail (see the module docstring)."""
USER = "bench-manager"
_PASSWORD_BYTES = 18


@dataclass(frozen=True)
class _Ctx:
    engine: Engine


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
    measured = asyncio.run(measure_all(client, plan, requests, limit, seeded.end, span_s, rng))
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
    cluster: PgCluster | None = None
    try:
        url = args.db_url
        if args.postgres:
            cluster = start_cluster(durable=True)
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
            stop_cluster(cluster)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``hil bench review``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="hil bench review",
        description="Seed decisions and time the decision list, the review pages and the "
        "images (p95 target < 300 ms each).",
        epilog="example: hil bench review --decisions 1000000 "
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
        help="a throw-away PostgreSQL cluster, started as the tests do (hil/pgcluster.py)",
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
