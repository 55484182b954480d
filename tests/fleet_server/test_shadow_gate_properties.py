"""Properties of the shadow gate's statistics (hypothesis): whatever one device of a wave
reports within the bounds, its weight stays within its cap and it cannot move the verdict
past what the other devices' own records show (docs/adr/0018).

- no pass: when every other device agrees below ``min_agreement``, the wave never passes;
- no veto: when every other device agrees at or above it, the wave never fails early;
- cap: one device's frames in the judged pool never exceed the cap.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_server.rollout import parse_spec
from fleet_server.rollout.gates import GateFail, GatePass
from fleet_server.rollout.shadowgate import (
    ShadowSample,
    capped,
    device_cap,
    evaluate_shadow,
    pools,
)

SHADOW_MIN = 200
WANT = 0.9
SPEC = parse_spec({"bundle": "det@2.0.0", "selector": "*", "waves": "100%", "soak_s": 0,
                   "shadow_s": "1h", "shadow_min": SHADOW_MIN, "min_agreement": WANT})  # fmt: skip
BOUND = 10**7  # what one device could have decided (the shell cuts records to it)


@st.composite
def honest(draw: Any, *, above: bool) -> list[ShadowSample]:
    """2..8 devices whose own agreement is below ``min_agreement`` (or at/above it)."""
    count = draw(st.integers(2, 8))
    out = []
    for i in range(count):
        n = draw(st.integers(0, 5_000))
        if above:
            agree = draw(st.integers(min(n, -(-n * 9 // 10)), n))
        else:
            agree = draw(st.integers(0, max(0, -(-n * 9 // 10) - 1))) if n else 0
        out.append(ShadowSample(f"v{i}", n, agree, 10.0))
    return out


def liar() -> st.SearchStrategy[ShadowSample]:
    return st.builds(
        lambda n, share, p99: ShadowSample("atk", n, round(n * share), p99),
        st.integers(0, BOUND),
        st.floats(0.0, 1.0),
        st.one_of(st.none(), st.floats(0.0, 1e6)),
    )


@settings(max_examples=400, deadline=None)
@given(honest(above=False), liar(), st.booleans())
def test_one_device_cannot_pass_a_wave_whose_other_devices_disagree(
    others: list[ShadowSample], atk: ShadowSample, over: bool
) -> None:
    verdict = evaluate_shadow(SPEC, [*others, atk], None, over=over)
    assert not isinstance(verdict, GatePass), verdict


@settings(max_examples=400, deadline=None)
@given(honest(above=True), liar())
def test_one_device_cannot_fail_early_a_wave_whose_other_devices_agree(
    others: list[ShadowSample], atk: ShadowSample
) -> None:
    verdict = evaluate_shadow(SPEC, [*others, atk], None, over=False)
    assert not isinstance(verdict, GateFail), verdict


@settings(max_examples=400, deadline=None)
@given(honest(above=True), liar())
def test_one_devices_frames_in_the_judged_pool_never_exceed_the_cap(
    others: list[ShadowSample], atk: ShadowSample
) -> None:
    wave = [*others, atk]
    counted = [capped(s, device_cap(SPEC)) for s in wave]
    for pool in pools(counted, len(wave))[:2]:
        assert all(c.n <= device_cap(SPEC) for c in pool)
        mine = sum(c.n for c in pool if c.device_id == "atk")
        assert mine <= SHADOW_MIN


@settings(max_examples=200, deadline=None)
@given(
    st.integers(3, 8).flatmap(
        lambda k: st.lists(st.integers(SHADOW_MIN, 5_000), min_size=k, max_size=k)
    ),
    liar(),
)
def test_a_wave_that_agrees_passes_whatever_one_device_reports(
    frames: list[int], atk: ShadowSample
) -> None:
    # two or more other devices, each with enough frames, all agreeing on every frame
    others = [ShadowSample(f"v{i}", n, n, 10.0) for i, n in enumerate(frames)]
    verdict = evaluate_shadow(SPEC, [*others, atk], None, over=False)
    assert isinstance(verdict, GatePass), verdict
