"""The pipeline runner on a real worker pool: frames in flight, capture order, stop, and
its stage histograms."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.capture import Frame
from agent.kernel.bundle import Bundle, init_bundle
from agent.pipeline.runner import Decision, PipelineRunner, Stage
from agent.pipeline.stages import STAGES
from agent.policy import PolicySpec
from runtime import PoolConfig, WorkerPool

REPO = Path(__file__).resolve().parents[3]
TINY_TFLITE = REPO / "tests" / "data" / "tiny_classifier.tflite"


class CountingSource:
    """Always has a new frame; counts how many frames were taken but not yet decided
    at each take (the runner's frames in flight, seen from outside)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seq = 0
        self.decided = 0
        self.peak_in_flight = 0
        self.image = np.random.default_rng(3).integers(0, 255, (48, 64, 3), np.uint8)

    def latest(self, timeout_s: float) -> Frame:
        with self.lock:
            self.seq += 1
            self.peak_in_flight = max(self.peak_in_flight, self.seq - self.decided)
            return Frame("cam", self.seq, self.image, time.perf_counter_ns(), time.time())

    def on_decision(self) -> None:
        with self.lock:
            self.decided += 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return init_bundle(TINY_TFLITE, tmp_path_factory.mktemp("b") / "tiny")


@pytest.fixture(scope="module")
def pool(tiny: Bundle) -> Iterator[WorkerPool]:
    config = tiny.model_config(name="tiny", queue_bound=8)
    with WorkerPool([config], PoolConfig(workers=2, pin=False, heartbeat_timeout_s=30)) as p:
        yield p


def run_for(
    pool: WorkerPool, tiny: Bundle, in_flight: int, seconds: float, *, measure: bool = False
) -> tuple[PipelineRunner, CountingSource, list[int]]:
    source = CountingSource()
    seqs: list[int] = []

    def emit(d: Decision) -> None:
        seqs.append(d.t_capture_ns)
        source.on_decision()

    runner = PipelineRunner(
        "p",
        source_name="cam",
        line="",
        source=source,
        pool=pool,
        stages=[Stage.build(tiny, "tiny", pool)],
        policy=PolicySpec(),
        config_hash="h",
        emit=emit,
        in_flight=in_flight,
    )
    if measure:
        runner.measure_stages()
    runner.start()
    time.sleep(seconds)
    runner.stop()
    assert runner.join(5.0), "the runner's threads did not end"
    return runner, source, seqs


def test_two_frames_in_flight_are_decided_in_capture_order(pool: WorkerPool, tiny: Bundle) -> None:
    runner, source, capture_times = run_for(pool, tiny, 2, 1.0)
    assert len(capture_times) > 20
    assert capture_times == sorted(capture_times)
    assert source.peak_in_flight == 2
    assert runner.stats.errors == 0


def test_one_frame_in_flight_never_takes_a_second_before_deciding_the_first(
    pool: WorkerPool, tiny: Bundle
) -> None:
    _, source, capture_times = run_for(pool, tiny, 1, 0.5)
    assert len(capture_times) > 10
    assert source.peak_in_flight == 1


def test_stop_decides_every_frame_taken(pool: WorkerPool, tiny: Bundle) -> None:
    runner, source, capture_times = run_for(pool, tiny, 2, 0.5)
    assert runner.stats.taken == len(capture_times) + runner.stats.errors
    assert runner.stats.in_flight == 0
    assert source.decided == len(capture_times)


def test_stage_histograms_cover_every_stage(pool: WorkerPool, tiny: Bundle) -> None:
    runner, _, capture_times = run_for(pool, tiny, 2, 0.5, measure=True)
    assert runner.stage_times is not None
    summary = runner.stage_times.summary()
    assert set(summary) == set(STAGES)
    assert all(int(s["count"]) >= len(capture_times) - 2 for s in summary.values())


def test_frames_in_flight_out_of_range_are_refused(pool: WorkerPool, tiny: Bundle) -> None:
    with pytest.raises(ValueError, match="in_flight"):
        PipelineRunner(
            "p",
            source_name="cam",
            line="",
            source=CountingSource(),
            pool=pool,
            stages=[Stage.build(tiny, "tiny", pool)],
            policy=PolicySpec(),
            config_hash="h",
            emit=lambda d: None,
            in_flight=0,
        )
