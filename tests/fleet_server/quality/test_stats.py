"""The quality loop's statistics against values worked out by hand or by scipy."""

from __future__ import annotations

import math

import pytest

from fleet_server.quality.stats import (
    js_distance,
    proportion_drop,
    psi,
    wilson_interval,
    z_for,
)


def test_z_for_95_percent_is_1_96() -> None:
    assert z_for(0.95) == pytest.approx(1.959964, abs=1e-6)


def test_wilson_interval_matches_the_textbook_value() -> None:
    # 81 of 263 at 95 %: (0.2553, 0.3662) (Wilson 1927; Newcombe 1998, table I)
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4)
    assert hi == pytest.approx(0.3662, abs=1e-4)


def test_wilson_interval_at_all_successes_is_below_one() -> None:
    lo, hi = wilson_interval(500, 500)
    assert hi == 1.0
    assert 0.99 < lo < 1.0  # a bare ratio would say 1.0


def test_wilson_interval_of_nothing_is_everything() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_interval_refuses_more_successes_than_trials() -> None:
    with pytest.raises(ValueError, match="not a proportion"):
        wilson_interval(5, 4)


def test_psi_is_zero_for_equal_shares_and_grows_with_the_shift() -> None:
    same = psi([10, 20, 30], [20, 40, 60])
    small = psi([10, 20, 30], [12, 20, 28])
    large = psi([10, 20, 30], [30, 20, 10])
    assert same == pytest.approx(0.0, abs=1e-12)
    assert 0 < small < 0.1 < large
    # by hand: shares r = (1/6, 1/3, 1/2), c = (1/2, 1/3, 1/6)
    r, c = [1 / 6, 1 / 3, 1 / 2], [1 / 2, 1 / 3, 1 / 6]
    expected = sum((ci - ri) * math.log(ci / ri) for ri, ci in zip(r, c, strict=True))
    assert large == pytest.approx(expected, rel=1e-3)


def test_js_distance_is_bounded_and_one_for_disjoint_histograms() -> None:
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    assert js_distance([5, 5], [5, 5]) == pytest.approx(0.0, abs=1e-9)
    # by hand: m = (.7, .3); KL(p||m) = .1258, KL(q||m) = .1678; sqrt(mean) = .38314
    assert js_distance([5, 5], [9, 1]) == pytest.approx(0.38314, abs=1e-4)


@pytest.mark.parametrize(
    ("ref", "cur", "why"),
    [([1, 2], [1, 2, 3], "bins"), ([0, 0], [1, 1], "no counts"), ([1, -1], [1, 1], "finite")],
)
def test_histogram_statistics_refuse_bad_histograms(
    ref: list[int], cur: list[int], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        psi(ref, cur)


def test_proportion_drop_is_significant_only_when_it_should_be() -> None:
    clear = proportion_drop(70, 100, 95, 100)  # 70 % vs 95 %
    assert clear.drop == pytest.approx(0.25)
    assert clear.significant(0.05)
    noise = proportion_drop(93, 100, 95, 100)
    assert not noise.significant(0.05)
    better = proportion_drop(99, 100, 90, 100)
    assert better.p_value > 0.5
