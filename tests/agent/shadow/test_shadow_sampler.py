"""The shadow sampler: a share of the frames, at most max_fps of them a second,
deterministic with a seeded random generator."""

from __future__ import annotations

import random

import pytest

from agent.shadow.sampler import Sampler


def test_a_share_of_the_frames_is_sampled_and_the_same_seed_samples_the_same_frames() -> None:
    picks = []
    for _ in range(2):
        s = Sampler(0.2, max_fps=1000.0, rng=random.Random(7))
        picks.append([s.take(i * 0.01) for i in range(5000)])  # 100 fps, cap far away
    assert picks[0] == picks[1]
    share = sum(picks[0]) / len(picks[0])
    assert 0.18 < share < 0.22


def test_the_cap_limits_sampled_frames_per_second() -> None:
    s = Sampler(1.0, max_fps=5.0, rng=random.Random(1))
    taken = sum(s.take(i / 100) for i in range(1000))  # 10 s at 100 fps, all in the share
    assert 49 <= taken <= 51
    assert s.capped == 1000 - taken
    assert s.sampled == taken
    assert s.offered == 1000


def test_share_zero_samples_nothing_and_share_one_everything_under_the_cap() -> None:
    none = Sampler(0.0, max_fps=100.0, rng=random.Random(1))
    assert not any(none.take(i) for i in range(100))
    every = Sampler(1.0, max_fps=100.0, rng=random.Random(1))
    assert all(every.take(float(i)) for i in range(100))  # one a second, cap 100/s


@pytest.mark.parametrize(("share", "fps", "what"), [(1.5, 5.0, "share"), (0.2, 0.0, "max_fps")])
def test_out_of_range_settings_are_refused_naming_them(share: float, fps: float, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        Sampler(share, fps)
