"""Helpers for the metrics tests: scrape ``/metrics`` over HTTP, parse it with
prometheus-client's own parser, and read the metric names a Grafana dashboard's PromQL
expressions use."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

REPO_ROOT = Path(__file__).resolve().parents[3]
GRAFANA = REPO_ROOT / "packaging" / "grafana"
HTTP_TIMEOUT_S = 30.0
WAIT_S = 30.0

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}
"""The sample names a family of each type may show, after the family's name."""


@dataclass(frozen=True)
class Scrape:
    """One answer of ``GET /metrics``."""

    status: int
    content_type: str
    text: str

    def samples(self) -> list[Sample]:
        """Every sample (prometheus_client's parser)."""
        return [s for f in text_string_to_metric_families(self.text) for s in f.samples]

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample ``name`` whose labels include ``labels``; None
        when there is none.

        Raises:
            AssertionError: more than one sample matches.
        """
        found = [
            s.value
            for s in self.samples()
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(found) <= 1, f"{name}{labels}: {len(found)} samples"
        return found[0] if found else None

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples ``name`` whose labels include ``labels``."""
        return sum(
            s.value
            for s in self.samples()
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def declared(self) -> set[str]:
        """Every sample name the exposition's families declare (by their type), whether
        or not a sample is present now."""
        return declared_names(self.text)


def declared_names(text: str) -> set[str]:
    """The sample names the families of an exposition declare (see :data:`SUFFIXES`)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(s.name for s in family.samples)
    return names


def scrape(url: str, *, token: str | None = None) -> Scrape:
    """``GET <url>/metrics``; an error status is an answer, not an exception."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    req = urllib.request.Request(url + "/metrics", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310
            return Scrape(resp.status, resp.headers["Content-Type"], resp.read().decode())
    except urllib.error.HTTPError as exc:
        return Scrape(exc.code, exc.headers.get("Content-Type", ""), exc.read().decode())


T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], what: str, timeout_s: float = WAIT_S, step_s: float = 0.2
) -> T:
    """``probe()`` again until it answers something (not None), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last is not None:
            return last
        time.sleep(step_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")


# -- Grafana dashboards -----------------------------------------------------------

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABELS = re.compile(r"\{[^{}]*\}")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_RANGES = re.compile(r"\[[^\]]*\]")
_GRAFANA_VARS = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*(?::[a-z]+)?\}?")
PROMQL_WORDS = frozenset(
    """
    sum min max avg group stddev stdvar count count_values bottomk topk quantile
    by without on ignoring group_left group_right bool and or unless offset
    rate irate increase delta idelta deriv predict_linear resets changes
    histogram_quantile histogram_count histogram_sum histogram_fraction
    abs ceil floor round exp ln log2 log10 sqrt clamp clamp_min clamp_max
    label_replace label_join vector scalar time timestamp absent absent_over_time
    sum_over_time avg_over_time min_over_time max_over_time count_over_time
    last_over_time quantile_over_time stddev_over_time present_over_time sort sort_desc
    day_of_month day_of_week hour minute month year days_in_month inf nan
    """.split()  # noqa: SIM905 (a word list reads better as text)
)
"""PromQL's keywords and functions: not metric names."""


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside label
    matchers, strings, ranges and Grafana variables that are neither PromQL words,
    numbers, nor the label names of a ``by``/``without``/``on``/``ignoring`` list."""
    text = _GRAFANA_VARS.sub(" ", expr)
    text = _STRINGS.sub(" ", text)
    text = _LABELS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _NAME.finditer(text):
        word = match.group(0)
        if word.lower() in PROMQL_WORDS or word.lower() in ("e",):
            continue
        before = text[: match.start()].rstrip()
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # the tail of a number (1e3) or a duration (5m)
        names.add(word)
    return names


def panels(dashboard: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs(dashboard: Mapping[str, Any]) -> list[str]:
    """The PromQL of every panel target and of every query variable."""
    exprs = [str(t["expr"]) for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
            inner = re.search(r"label_values\((.*),\s*[A-Za-z_]+\)\s*$", text)
            exprs.append(inner.group(1) if inner else text)
    return [e for e in exprs if e.strip()]


def load_dashboard(name: str) -> dict[str, Any]:
    """``packaging/grafana/<name>`` as JSON."""
    data: dict[str, Any] = json.loads((GRAFANA / name).read_text(encoding="utf-8"))
    return data


def unknown_metrics(dashboard: Mapping[str, Any], declared: set[str]) -> dict[str, set[str]]:
    """Per PromQL expression of ``dashboard``, the metric names not in ``declared``."""
    out = {}
    for expr in dashboard_exprs(dashboard):
        missing = promql_metrics(expr) - declared
        if missing:
            out[expr] = missing
    return out
