"""The shadow runner on a real worker pool: a live classifier and a candidate that
disagrees on a known share of the frames, the decision log's SQLite file, its
``shadow_results`` rows and the thumbnails of the disagreements."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.capture import Frame
from agent.decisionlog import DecisionLog
from agent.decisionlog.config import DecisionLogConfig
from agent.kernel.bundle import Bundle
from agent.pipeline.runner import Decision, PipelineRunner, Stage
from agent.policy import parse_policy
from agent.shadow.runner import ShadowRunner
from agent.shadow.sampler import Sampler
from agent.shadow.stats import ShadowKey, ShadowStats
from agent.shadow.store import THUMBNAIL_DIR, ShadowStore
from runtime import ModelConfig, PoolConfig, WorkerPool
from tests.agent.shadow.shadow_helpers import bright_bundle, frame

DARK, BETWEEN, BRIGHT = 30, 100, 200
"""Frame levels: both models say dark; the live one dark, the candidate bright; both
bright (live threshold 0.5 = level 127, candidate 0.3 = level 76)."""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, Bundle]:
    d = tmp_path_factory.mktemp("bundles")
    live = bright_bundle(d / "live", 0.5, version="1.0.0")
    cand = bright_bundle(d / "cand", 0.3, version="2.0.0")
    return live, cand


@pytest.fixture(scope="module")
def pool(bundles: tuple[Bundle, Bundle], slow_model: str) -> Iterator[WorkerPool]:
    live, cand = bundles
    models = [
        live.model_config("p.0", queue_bound=8),
        cand.model_config("p#shadow", queue_bound=2),
        ModelConfig("slow", slow_model, queue_bound=4),
    ]
    with WorkerPool(models, PoolConfig(workers=1, pin=False, heartbeat_timeout_s=30)) as p:
        yield p


@pytest.fixture
def decision_log(tmp_path: Path) -> Iterator[DecisionLog]:
    with DecisionLog(tmp_path, DecisionLogConfig(), device_id="dev1") as log:
        yield log


def make_runner(
    pool: WorkerPool, live: Bundle, decision_log: DecisionLog, source: object = None
) -> PipelineRunner:
    stage = Stage.build(live, "p.0", pool)
    return PipelineRunner(
        "p",
        source_name="cam",
        line="L1",
        source=source,  # type: ignore[arg-type]
        pool=pool,
        stages=[stage],
        policy=parse_policy(live.manifest.policy or {}, "manifest"),
        config_hash="h",
        emit=lambda d: decision_log.append(d.record),  # what the sink does first
    )


def make_shadow(
    pool: WorkerPool,
    cand: Bundle,
    runner: PipelineRunner,
    state_dir: Path,
    *,
    share: float = 1.0,
    seed: int = 1,
) -> ShadowRunner:
    m = cand.manifest
    key = ShadowKey(m.name, m.version, m.release, cand.digest)
    return ShadowRunner(
        runner.name,
        pool=pool,
        candidate=Stage.build(cand, "p#shadow", pool),
        live_stages=runner.stages,
        policy=runner.policy,
        key=key,
        stats=ShadowStats(key),
        store=ShadowStore(state_dir, DecisionLogConfig()),
        sampler=Sampler(share, 1e9, rng=random.Random(seed)),  # no cap to speak of
    )


def rows(db: Path, sql: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_candidate_that_disagrees_on_a_known_share_gives_that_agreement(
    pool: WorkerPool, bundles: tuple[Bundle, Bundle], decision_log: DecisionLog, tmp_path: Path
) -> None:
    live, cand = bundles
    runner = make_runner(pool, live, decision_log)
    shadow = make_shadow(pool, cand, runner, tmp_path)
    levels = [DARK] * 10 + [BETWEEN] * 4 + [BRIGHT] * 6
    decisions: list[Decision] = []
    for i, level in enumerate(levels):
        f = frame(level, i)
        d = runner.process(f)
        decision_log.append(d.record)  # what the sink does: the id is set here
        decisions.append(d)
        assert shadow.run(d, f.image, True) is not None
    assert decision_log.flush()
    shadow.store.close()

    summary = shadow.stats.summary()
    assert (summary.n, summary.agree, summary.skipped) == (20, 16, 0)
    assert summary.agreement == pytest.approx(0.8)
    assert (summary.bundle, summary.version, summary.release) == ("bright", "2.0.0", 1)
    assert summary.shadow_p50_ms is not None
    assert summary.shadow_p99_ms is not None
    assert summary.live_p99_ms is not None

    got = rows(decision_log.path, "SELECT * FROM shadow_results ORDER BY decision_id")
    assert len(got) == 20
    assert {r["decision_id"] for r in got} == {d.record.id for d in decisions}
    disagree = [r for r in got if not r["agree"]]
    assert len(disagree) == 4
    for r in disagree:
        assert (r["live_outcome"], r["shadow_outcome"]) == ("reject", "pass")
        assert (r["live_version"], r["shadow_version"]) == ("1.0.0", "2.0.0")
        assert r["thumbnail"].startswith(f"{THUMBNAIL_DIR}/")
        assert (tmp_path / r["thumbnail"]).read_bytes()[:2] == b"\xff\xd8"  # a JPEG
        assert r["shadow_digest"] == cand.digest
        assert r["uploaded"] == 0
    assert all(r["thumbnail"] is None for r in got if r["agree"])
    assert len(list((tmp_path / THUMBNAIL_DIR).rglob("*.jpg"))) == 4


def test_the_shadow_never_changes_a_live_decision_nor_adds_one(
    pool: WorkerPool, bundles: tuple[Bundle, Bundle], decision_log: DecisionLog, tmp_path: Path
) -> None:
    live, cand = bundles
    runner = make_runner(pool, live, decision_log)
    shadow = make_shadow(pool, cand, runner, tmp_path)
    for i, level in enumerate([BETWEEN] * 5):
        f = frame(level, i)
        d = runner.process(f)
        decision_log.append(d.record)
        shadow.run(d, f.image, True)
        assert d.verdict.outcome == "reject"  # the live model's, the candidate said pass
    assert decision_log.flush()
    shadow.store.close()
    logged = rows(decision_log.path, "SELECT model_version, outcome, outputs FROM decisions")
    assert len(logged) == 5
    assert {(r["model_version"], r["outcome"]) for r in logged} == {("1.0.0", "reject")}
    assert all("2.0.0" not in r["outputs"] for r in logged)
    assert len(rows(decision_log.path, "SELECT 1 FROM shadow_results WHERE agree = 0")) == 5


class FrameSource:
    """Always a new frame, at one brightness; counts the frames taken."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.seq = 0

    def latest(self, timeout_s: float) -> Frame:
        self.seq += 1
        time.sleep(0.002)
        return frame(self.level, self.seq)


def test_offered_frames_run_on_the_shadow_thread_after_the_live_emit(
    pool: WorkerPool, bundles: tuple[Bundle, Bundle], decision_log: DecisionLog, tmp_path: Path
) -> None:
    live, cand = bundles
    emitted: list[Decision] = []
    runner = make_runner(pool, live, decision_log, FrameSource(BRIGHT))

    def emit(d: Decision) -> None:
        decision_log.append(d.record)
        emitted.append(d)

    runner.emit = emit
    shadow = make_shadow(pool, cand, runner, tmp_path, share=0.5, seed=3)
    seen_at_offer: list[bool] = []

    def hook(d: Decision, data: np.ndarray, is_image: bool) -> None:
        seen_at_offer.append(d in emitted)  # the decision was emitted before the offer
        shadow.offer(d, data, is_image)

    runner.shadow = hook
    shadow.start()
    runner.start()
    deadline = time.monotonic() + 30
    while shadow.counts.compared < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    assert runner.join(5.0)
    shadow.stop()
    assert shadow.join(5.0)
    c = shadow.counts
    assert c.compared >= 5
    assert c.errors == 0
    assert all(seen_at_offer)
    assert len(seen_at_offer) == runner.stats.decided == len(emitted)
    assert c.compared + c.skipped_busy + c.skipped_behind == shadow.sampler.sampled
    assert 0 < shadow.sampler.sampled < shadow.sampler.offered
    assert shadow.stats.summary().agree == c.compared  # bright frames: both pass


def test_sampled_frames_are_skipped_and_counted_while_the_pool_is_kept_busy(
    pool: WorkerPool, bundles: tuple[Bundle, Bundle], decision_log: DecisionLog, tmp_path: Path
) -> None:
    live, cand = bundles
    runner = make_runner(pool, live, decision_log)
    shadow = make_shadow(pool, cand, runner, tmp_path)
    decisions = []
    for i in range(3):
        f = frame(BETWEEN, i)
        d = runner.process(f)
        decision_log.append(d.record)
        decisions.append((d, f.image))

    stop = threading.Event()
    slow_input = np.zeros(pool.info("slow").inputs[0].concrete_shape(), np.float32)

    def keep_busy() -> None:  # two slow requests outstanding at all times
        outstanding = [pool.submit("slow", slow_input) for _ in range(2)]
        while not stop.is_set():
            outstanding.pop(0).wait(10).release()
            outstanding.append(pool.submit("slow", slow_input))
        for r in outstanding:
            r.wait(10).release()

    busy = threading.Thread(target=keep_busy)
    busy.start()
    try:
        deadline = time.monotonic() + 10
        while not pool.busy() and time.monotonic() < deadline:
            time.sleep(0.001)
        for d, image in decisions:
            assert shadow.run(d, image, True) is None
    finally:
        stop.set()
        busy.join(30)
    assert shadow.counts.skipped_busy == 3
    assert shadow.stats.summary().skipped == 3
    assert shadow.stats.summary().n == 0
    # once the pool is idle again, the same frames are compared
    deadline = time.monotonic() + 10
    while pool.busy() and time.monotonic() < deadline:
        time.sleep(0.005)
    d, image = decisions[0]
    assert shadow.run(d, image, True) is not None
    assert shadow.counts.compared == 1
    shadow.store.close()
    assert len(rows(decision_log.path, "SELECT 1 FROM shadow_results")) == 1


def test_a_full_shadow_queue_skips_and_counts_the_frame_offered(
    pool: WorkerPool, bundles: tuple[Bundle, Bundle], decision_log: DecisionLog, tmp_path: Path
) -> None:
    live, cand = bundles
    runner = make_runner(pool, live, decision_log)
    shadow = make_shadow(pool, cand, runner, tmp_path)  # not started: nothing takes frames
    f = frame(BRIGHT)
    d = runner.process(f)
    shadow.offer(d, f.image, True)
    shadow.offer(d, f.image, True)
    shadow.offer(d, f.image, True)
    assert shadow.pending() == 1
    assert shadow.counts.skipped_behind == 2
    assert shadow.stats.summary().skipped == 2
    shadow.store.close()


def test_pool_busy_is_false_when_idle_and_true_while_work_waits(pool: WorkerPool) -> None:
    deadline = time.monotonic() + 10
    while pool.busy() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not pool.busy()
    slow_input = np.zeros(pool.info("slow").inputs[0].concrete_shape(), np.float32)
    reqs = [pool.submit("slow", slow_input) for _ in range(3)]
    assert pool.busy()
    for r in reqs:
        r.wait(10).release()
    deadline = time.monotonic() + 10
    while pool.busy() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not pool.busy()


def test_a_chain_judges_the_candidate_with_the_live_chain_on_its_own_detections(
    tmp_path: Path, decision_log: DecisionLog
) -> None:
    from agent.policy import PolicySpec
    from tests.agent.shadow.shadow_helpers import spot_detector_bundle

    live_det = spot_detector_bundle(tmp_path / "b" / "det1", 1.0, version="1.0.0")
    cand_det = spot_detector_bundle(tmp_path / "b" / "det2", 2.0, version="2.0.0")
    classifier = bright_bundle(tmp_path / "b" / "cls", 0.2, version="1.0.0")
    models = [
        live_det.model_config("c.0"),
        classifier.model_config("c.1"),
        cand_det.model_config("c#shadow", queue_bound=2),
    ]
    policy = PolicySpec.model_validate(
        {"rules": [{"outcome": "reject", "label": "bright"}], "default": "pass"}
    )
    with WorkerPool(models, PoolConfig(workers=1, pin=False, heartbeat_timeout_s=30)) as pool:
        runner = PipelineRunner(
            "c",
            source_name="cam",
            line="L1",
            source=None,  # type: ignore[arg-type]
            pool=pool,
            stages=[
                Stage.build(live_det, "c.0", pool),
                Stage.build(classifier, "c.1", pool, max_crops=4, padding=0.05),
            ],
            policy=policy,
            config_hash="h",
            emit=lambda d: None,
        )
        m = cand_det.manifest
        key = ShadowKey(m.name, m.version, m.release, cand_det.digest)
        shadow = ShadowRunner(
            "c",
            pool=pool,
            candidate=Stage.build(cand_det, "c#shadow", pool),
            live_stages=runner.stages,
            policy=policy,
            key=key,
            stats=ShadowStats(key),
            store=ShadowStore(tmp_path, DecisionLogConfig()),
            sampler=Sampler(1.0, 1e9),
        )
        image = np.zeros((64, 64, 3), np.uint8)
        image[16:48, 16:48] = 100  # luma 0.39: a spot for the candidate (x2) only
        f = Frame("cam", 1, image, time.perf_counter_ns(), time.time())
        d = runner.process(f)
        decision_log.append(d.record)
        row = shadow.run(d, image, True)
        shadow.store.close()
    assert d.verdict.outcome == "pass"  # the live detector saw nothing
    assert row is not None
    assert row.shadow_outcome == "reject"  # its spot, classified "bright" by the live chain
    assert not row.agree
    assert (row.matched, row.unmatched_live, row.unmatched_shadow) == (0, 0, 1)
    assert [c["label"] for c in row.shadow_outputs["crops"]] == ["bright"]
    assert row.thumbnail is not None
