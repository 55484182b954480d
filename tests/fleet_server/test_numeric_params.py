"""Every numeric query parameter of the fleet server, of the API and of the console, is
bounded in one place (fleet_server/params.py): the test walks every route the server
serves, checks that each numeric query parameter it finds carries both bounds (finite,
within a database integer), then sends each one hostile numbers over real HTTP (beyond
64 bits, beyond a double, NaN, infinities, 5,000 digits) and expects a 400 naming the
parameter, never a 500. Numbers inside text parameters (a time as Unix seconds, the
time inside a page cursor) get the same."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic.fields import FieldInfo

from fleet_server.api.app import create_app
from fleet_server.db import sqlite_url
from fleet_server.params import MAX_INT
from tests.fleet_server.fleet_api_support import OPERATOR_TOKEN, http
from tests.fleet_server.web.console_http_support import Console

pytest_plugins = ["tests.fleet_server.web.console_http_fixtures"]

HOSTILE = [
    str(2**64),
    str(-(2**64)),
    str(10**30),
    "9" * 5000,
    "1e999",
    "-1e999",
    "nan",
    "inf",
    "1e308",
    "-1",
    "0x10",
    "12abc",
]
"""Values no numeric parameter of the server takes (each has a lower bound >= -1 < 0 or
above, and an upper bound far below 1e308)."""

KNOWN = {
    ("/api/v1/devices/{device_id}/telemetry", "limit"),
    ("/api/v1/decisions", "limit"),
    ("/api/v1/accuracy", "confidence"),
    ("/api/v1/decisions/accuracy", "confidence"),
    ("/api/v1/decisions/export.csv", "limit"),
    ("/api/v1/labels", "since"),
    ("/api/v1/labels", "limit"),
    ("/api/v1/events", "since"),
    ("/api/v1/events", "limit"),
}
"""The numeric query parameters there are today (the walk must find at least these)."""


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    for r in routes:
        inner = getattr(r, "original_router", None)  # an included router (FastAPI >= 0.120)
        if inner is not None:
            yield from _routes(inner.routes)
        elif isinstance(r, APIRoute):
            yield r


def _query_params(dependant: Any) -> Iterator[Any]:
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_params(sub)


def _numeric(info: FieldInfo) -> type | None:
    kinds = {int, float}
    annotation = info.annotation
    found = [k for k in kinds if annotation is k or k in getattr(annotation, "__args__", ())]
    return found[0] if found else None


def numeric_params(console: Console) -> list[tuple[APIRoute, str, type, FieldInfo]]:
    out = []
    for route in _routes(create_app(console.server.context).routes):
        for q in _query_params(route.dependant):
            kind = _numeric(q.field_info)
            if kind is not None:
                out.append((route, q.alias, kind, q.field_info))
    return out


def _bounds(info: FieldInfo) -> tuple[float | None, float | None, bool | None]:
    lo = hi = allow = None
    for m in info.metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
        allow = getattr(m, "allow_inf_nan", allow)
    return lo, hi, allow


@pytest.fixture
def lite(start: Callable[[str], Console], tmp_path: Path) -> Console:
    return start(sqlite_url(tmp_path / "fleet.db"))


def test_every_numeric_query_parameter_is_declared_with_both_bounds(lite: Console) -> None:
    found = numeric_params(lite)
    named = {(r.path, name) for r, name, _, _ in found}
    print("numeric query parameters:", sorted(named))  # shown when a check fails
    assert named >= KNOWN
    for route, name, kind, info in found:
        lo, hi, allow = _bounds(info)
        where = f"{route.path} {name}"
        assert lo is not None, f"{where}: declared without a lower bound"
        assert hi is not None, f"{where}: declared without an upper bound"
        assert -MAX_INT - 1 <= lo <= hi <= MAX_INT, f"{where}: {lo}..{hi}"
        if kind is float:
            assert allow is False, f"{where}: takes NaN and infinities"


def test_a_hostile_number_in_any_numeric_query_parameter_is_a_400_naming_it(
    lite: Console,
) -> None:
    tried = 0
    for route, name, _, _ in numeric_params(lite):
        path = route.path.replace("{device_id}", "dev-1").replace("{decision_id}", "x")
        for value in HOSTILE:
            query = urllib.parse.urlencode({name: value})
            answer = http("GET", f"{lite.url}{path}?{query}", token=OPERATOR_TOKEN)
            assert answer.status == 400, (path, name, value[:40], answer.status, answer.body)
            assert name in answer.body["detail"], (path, value[:40], answer.body)
            tried += 1
    print(f"{tried} hostile numbers sent, each a 400 naming its parameter")
    assert tried >= len(KNOWN) * len(HOSTILE)


def test_the_labels_feed_takes_a_cursor_up_to_a_database_integer(lite: Console) -> None:
    for since in (0, 5, MAX_INT):
        answer = http("GET", f"{lite.url}/api/v1/labels?since={since}", token=OPERATOR_TOKEN)
        assert answer.status == 200, answer.body
        assert answer.body["labels"] == []
    over = http("GET", f"{lite.url}/api/v1/labels?since={MAX_INT + 1}", token=OPERATOR_TOKEN)
    assert over.status == 400
    assert "since" in over.body["detail"]


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "path", ["/api/v1/decisions", "/api/v1/accuracy", "/api/v1/decisions/export.csv"]
)
def test_a_time_beyond_the_calendar_is_a_400_naming_it(lite: Console, path: str) -> None:
    for name in ("since", "until"):
        for value in ("1e300", str(2**70), "-5", "1e999", "nan", "99999-01-01T00:00:00Z"):
            query = urllib.parse.urlencode({name: value})
            answer = http("GET", f"{lite.url}{path}?{query}", token=OPERATOR_TOKEN)
            assert answer.status == 400, (path, name, value, answer.body)
            assert answer.body["detail"].startswith(f"{name}: "), answer.body
    if not path.endswith(".csv"):  # (the helper reads JSON answers)
        ok = http("GET", f"{lite.url}{path}?since=0&until=253402300799", token=OPERATOR_TOKEN)
        assert ok.status == 200, ok.body


def test_a_cursor_holding_a_number_beyond_a_double_is_a_400_on_the_api_and_the_console(
    lite: Console,
) -> None:
    olga = lite.client("olga")
    for ts in (10**400, -(10**400), 2**1024):
        cursor = _cursor([1, ts, "0194f0a2-7c3e-7abc-8def-0123456789ab"])
        api = http("GET", f"{lite.url}/api/v1/decisions?cursor={cursor}", token=OPERATOR_TOKEN)
        assert api.status == 400, api.body
        assert api.body["detail"].startswith("cursor: ")
        page = olga.get(f"/ui/decisions?cursor={cursor}")
        assert page.status == 400, page.text[:300]
        assert "cursor" in page.text
    fine = _cursor([1, 1735689600.5, "0194f0a2-7c3e-7abc-8def-0123456789ab"])
    assert olga.get(f"/ui/decisions?cursor={fine}").status == 200
