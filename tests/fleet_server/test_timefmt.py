"""fleet_server/timefmt.py never raises, whatever a device's clock said, and shows an
instant no calendar holds as ``invalid time (<value>)``; the chart axes built from such
times stay bounded."""

from __future__ import annotations

import math
import time
from datetime import timezone

import pytest

from fleet_server import timefmt
from fleet_server.review.export import _utc
from fleet_server.web.charts import Series, line_chart, time_ticks
from fleet_server.web.health import glance

ABSURD = [1e300, -1e300, 253402300800, 253402300800.0, 1e18, -62135596801.0,
          math.nan, math.inf, -math.inf, 10**400, "1700000000", True, [1]]  # fmt: skip


@pytest.mark.parametrize("ts", ABSURD, ids=repr)
def test_an_absurd_time_is_shown_as_invalid_by_every_formatter(ts: object) -> None:
    assert timefmt.as_datetime(ts) is None
    assert timefmt.epoch(ts) is None
    for text in (
        timefmt.iso(ts),
        timefmt.iso(ts, ms=True),
        timefmt.stamp(ts, "%H:%M", tz=None),
        timefmt.ago(ts, time.time()),
    ):
        assert text.startswith("invalid time ("), text
        assert len(text) < 60, text


def test_real_times_are_formatted_and_the_edges_of_the_calendar_hold() -> None:
    assert timefmt.iso(0) == "1970-01-01T00:00:00Z"
    assert timefmt.iso(-1.0) == "1969-12-31T23:59:59Z"
    assert timefmt.iso(1700000000.25, ms=True) == "2023-11-14T22:13:20.250Z"
    assert timefmt.iso(253402300799.0) == "9999-12-31T23:59:59Z"
    assert timefmt.iso(None) == "—"
    assert timefmt.stamp(0, "%Y", tz=timezone.utc) == "1970"
    assert timefmt.ago(1000.0, 1420.0) == "7 min"
    assert timefmt.ago(2000.0, 1000.0).startswith("in the future (1970-01-01T00:33:20Z")
    assert timefmt.duration(math.nan) == "?"
    assert timefmt.duration(1e300) == "1.16e+295 d"
    assert timefmt.invalid(253402300800) == "invalid time (253402300800)"
    assert _utc(1e300) == "invalid time (1e+300)"
    assert _utc(0.0) == "1970-01-01T00:00:00.000+00:00"


def test_views_built_on_absurd_times_stay_bounded() -> None:
    now = time.time()
    assert time_ticks(0.0, 1e300) == []
    assert time_ticks(math.nan, now) == []
    assert len(time_ticks(now - 86400 * 3650, now)) <= 14
    seen = glance(online=False, last_seen=1e300, revoked=False, health=None, now=now)
    assert seen.text == "offline, last seen at invalid time (1e+300)"
    online = glance(online=True, last_seen=1e18, revoked=False, health={"cpu_percent": 1}, now=now)
    assert online.text == "last seen at invalid time (1e+18)"
    points = [(1e300, 5.0), (now - 60, 7.0), (math.nan, 1.0)]
    chart = line_chart(title="CPU", unit="%", start=now - 3600, end=now,
                       series=[Series("cpu", points)])  # fmt: skip
    assert "1e+300" not in chart
    assert "cpu: 7 %" in chart
