"""Rollout specs: selector, waves, soak and policy parse from their command-line and stored
forms, and every malformed value is refused with an error naming the field."""

from __future__ import annotations

import itertools
import random
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from fleet_server.errors import FleetError
from fleet_server.rollout import (
    RolloutError,
    RolloutSpec,
    parse_duration,
    parse_selector,
    parse_spec,
    parse_waves,
    resolve_waves,
)
from fleet_server.rollout.spec import matches, parse_bundle
from fleet_server.rollout.windows import in_ranges, parse_range


def _cli(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "bundle": "detector@1.4.0",
        "selector": "line=3,profile=jetson-orin",
        "waves": "1,10%,50%,100%",
        "soak_s": "10m",
    }
    base.update(over)
    return base


def test_selector_text_becomes_a_label_dict() -> None:
    assert parse_selector("line=3,profile=jetson-orin") == {"line": "3", "profile": "jetson-orin"}
    assert parse_selector(" line = 3 ") == {"line": "3"}
    assert parse_selector("*") == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "'*'"),
        ("line", "key=value"),
        ("line=3,line=4", "twice"),
        ("Line=3", "selector key"),
        ("line=", "selector value"),
        ("line=a b", "selector value"),
    ],
)
def test_malformed_selector_is_refused_with_the_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_selector(text)


def test_selector_matches_only_devices_with_every_label_equal() -> None:
    sel = parse_selector("line=3,profile=jetson-orin")
    assert matches(sel, {"line": "3", "profile": "jetson-orin", "site": "x"})
    assert not matches(sel, {"line": "3"})
    assert not matches(sel, {"line": "4", "profile": "jetson-orin"})
    assert matches({}, {})


def test_waves_parse_to_canonical_steps() -> None:
    assert parse_waves("1,10%,50%,100%") == ["1", "10%", "50%", "100%"]
    assert parse_waves(["1", "5", "2.5%", "100.0%"]) == ["1", "5", "2.5%", "100%"]
    assert parse_waves("100%") == ["100%"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no waves"),
        ("1,10%,50%", "must be 100%"),
        ("10%,5%,100%", "not above"),
        ("5,5,100%", "not above"),
        ("10%,5,100%", "count after a percentage"),
        ("0,100%", "neither"),
        ("0%,100%", "above 0%"),
        ("1,150%", "at most 100%"),
        ("1,x%,100%", "percentage"),
        ("-1,100%", "neither"),
    ],
)
def test_malformed_waves_are_refused_with_the_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_waves(text)


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (100, [1, 10, 50, 100]),
        (20, [1, 2, 10, 20]),
        (7, [1, 2, 4, 7]),
        (3, [1, 2, 3]),
        (2, [1, 2]),
        (1, [1]),
        (0, []),
    ],
)
def test_waves_resolve_to_cumulative_counts_each_adding_a_device(
    total: int, expected: list[int]
) -> None:
    assert resolve_waves(["1", "10%", "50%", "100%"], total) == expected


def test_counts_above_the_fleet_size_are_capped() -> None:
    assert resolve_waves(["5", "50", "100%"], 3) == [3]
    assert resolve_waves(["2", "50", "100%"], 10) == [2, 10]


def test_random_wave_lists_resolve_strictly_increasing_to_every_device() -> None:
    rng = random.Random(7)
    for _ in range(500):
        counts = sorted(rng.sample(range(1, 40), rng.randint(0, 3)))
        pcts = sorted(rng.sample(range(1, 100), rng.randint(0, 4)))
        steps = parse_waves([str(c) for c in counts] + [f"{p}%" for p in pcts] + ["100%"])
        total = rng.randint(0, 300)
        out = resolve_waves(steps, total)
        assert len(out) <= len(steps)
        if total == 0:
            assert out == []
            continue
        assert out[-1] == total
        assert all(b > a for a, b in itertools.pairwise(out))
        assert out[0] >= 1
        # each wave reaches at least what it asked for (capped at the total)
        for step, got in zip(steps, out, strict=False):
            want = float(step[:-1]) * total / 100 if step.endswith("%") else int(step)
            assert got >= min(total, want) - 1e-9


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("90s", 90), ("1h", 3600), ("1h30m", 5400), ("2d", 172800), ("45", 45)],
)
def test_durations_parse_to_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_numeric_durations_are_whole_seconds() -> None:
    assert parse_duration(30) == 30
    assert parse_duration(30.0) == 30
    for bad in (1.5, -1, float("nan"), True):
        with pytest.raises(ValueError, match="whole number"):
            parse_duration(bad)


@pytest.mark.parametrize("text", ["", "abc", "10x", "-5", "m10", "1.5h", "10 m"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_bundle_name_at_version_splits() -> None:
    assert parse_bundle("detector@1.4.0") == ("detector", "1.4.0")
    for bad in ("detector", "detector@1.4", "Detector@1.4.0", "@1.0.0"):
        with pytest.raises(ValueError, match=r"NAME@VERSION|bundle name"):
            parse_bundle(bad)


def test_spec_from_command_line_forms() -> None:
    spec = parse_spec(_cli())
    assert (spec.bundle, spec.version) == ("detector", "1.4.0")
    assert spec.selector == {"line": "3", "profile": "jetson-orin"}
    assert spec.waves == ["1", "10%", "50%", "100%"]
    assert spec.soak_s == 600
    policy = spec.policy
    assert policy.rollback_done_waves_on_failure is True
    assert policy.approval_between_waves is False
    assert policy.gates.max_install_failures == 0
    assert policy.gates.max_outcome_tvd == 0.1


def test_spec_round_trips_through_its_json_form() -> None:
    spec = parse_spec(
        _cli(
            policy={
                "approval_between_waves": True,
                "timezone": "Europe/Berlin",
                "shifts": {"3": ["6:00-14:00", "22:00 - 06:00"], "*": ["12:00-12:30"]},
                "gates": {"max_install_failure_fraction": 0.05, "max_p99_ratio": None},
                "timeouts": {"assigning_s": 600},
            }
        )
    )
    assert spec.policy.shifts == {"3": ["06:00-14:00", "22:00-06:00"], "*": ["12:00-12:30"]}
    again = RolloutSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert again.policy.gates.max_p99_ratio is None


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"waves": "1,10%"}, "waves", "100%"),
        ({"soak_s": "ten minutes"}, "soak_s", "duration"),
        ({"soak_s": "30d"}, "soak_s", "longer than"),
        ({"selector": "line"}, "selector", "key=value"),
        ({"bundle": "detector@1.4"}, "bundle", "NAME@VERSION"),
        ({"policy": {"timezone": "Mars/Base"}}, "policy.timezone", "time zone"),
        ({"policy": {"shifts": {"3": ["25:00-26:00"]}}}, "policy.shifts", "hours"),
        ({"policy": {"shifts": {"3": ["06:00-06:00"]}}}, "policy.shifts", "empty"),
        (
            {"policy": {"gates": {"max_worker_crashes": -1}}},
            "policy.gates.max_worker_crashes",
            "greater than",
        ),
        (
            {"policy": {"gates": {"max_outcome_tvd": 1.5}}},
            "policy.gates.max_outcome_tvd",
            "less than",
        ),
        ({"policy": {"gates": {"surprise": 1}}}, "policy.gates.surprise", "unknown key"),
        ({"colour": "red"}, "colour", "unknown key"),
    ],
)
def test_invalid_spec_names_the_field(over: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(RolloutError, match=words) as info:
        parse_spec(_cli(**over))
    assert info.value.field == field
    assert isinstance(info.value, FleetError)
    assert field in str(info.value)


def test_version_given_twice_is_refused() -> None:
    with pytest.raises(RolloutError, match="both") as info:
        parse_spec(_cli(version="1.4.0"))
    assert info.value.field == "version"


def test_spec_is_frozen() -> None:
    spec = parse_spec(_cli())
    with pytest.raises(ValidationError):
        spec.soak_s = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("hhmm", "inside"),
    [("05:59", False), ("06:00", True), ("13:59", True), ("14:00", False), ("23:00", False)],
)
def test_daily_range_includes_its_start_not_its_end(hhmm: str, inside: bool) -> None:
    h, m = (int(x) for x in hhmm.split(":"))
    now = datetime(2024, 3, 5, h, m, tzinfo=timezone.utc).timestamp()
    assert in_ranges(["06:00-14:00"], now, "UTC") is inside


@pytest.mark.parametrize(
    ("hour", "inside"), [(21, False), (22, True), (23, True), (0, True), (5, True), (6, False)]
)
def test_range_past_midnight_wraps(hour: int, inside: bool) -> None:
    now = datetime(2024, 3, 5, hour, 30, tzinfo=timezone.utc).timestamp()
    assert in_ranges(["22:00-06:00"], now, "UTC") is inside


def test_ranges_are_local_time_of_the_zone_with_daylight_saving() -> None:
    # 05:30 UTC is 06:30 in Berlin in winter (CET) and 07:30 in summer (CEST).
    winter = datetime(2024, 1, 10, 5, 30, tzinfo=timezone.utc).timestamp()
    summer = datetime(2024, 7, 10, 5, 30, tzinfo=timezone.utc).timestamp()
    assert in_ranges(["06:00-07:00"], winter, "Europe/Berlin")
    assert not in_ranges(["06:00-07:00"], summer, "Europe/Berlin")
    assert in_ranges(["07:00-08:00"], summer, "Europe/Berlin")
    assert not in_ranges([], summer, "UTC")


def test_range_to_midnight_and_malformed_ranges() -> None:
    assert parse_range("18:00-24:00") == (1080, 1440)
    for bad in ("6-14", "24:00-02:00", "06:60-07:00", "06:00-24:01"):
        with pytest.raises(ValueError, match=r"range|hours"):
            parse_range(bad)
